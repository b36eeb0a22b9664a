"""Graph files: load and save gradcheck.v1.Graph as .json (protobuf JSON) or .pb (binary).

The server decodes graphs with this module too (gradcheck_svc/graph/decode.py maps
GraphFileError to its GraphError), so both sides read a file the same way."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gradcheck.v1 import graph_pb2

SUFFIXES = (".json", ".pb")


class GraphFileError(ValueError):
    """A graph file that cannot be read or decoded (one line, naming the file).

    path: the file (None for bytes); fmt: the encoding tried ("json" or "pb"), None when the
    file could not be read; reason: the cause in a few words."""

    def __init__(self, reason: str, *, path=None, fmt: str | None = None):
        self.reason, self.path, self.fmt = reason, path, fmt
        what = "cannot read" if fmt is None else f"not a valid gradcheck.v1.Graph ({fmt})"
        super().__init__(f"{path}: {what}: {reason}" if path is not None else f"{what}: {reason}")


def sniff_format(data: bytes, path=None) -> str:
    """"json" or "pb": the file's extension when it is one of SUFFIXES, else JSON if it starts with '{'."""
    if path is not None and Path(path).suffix in SUFFIXES:
        return Path(path).suffix[1:]
    return "json" if bytes(data[:4096]).lstrip()[:1] == b"{" else "pb"


def decode_graph(data: bytes, fmt: str, path=None) -> graph_pb2.Graph:
    """Bytes in the protobuf JSON mapping (fmt "json") or binary protobuf ("pb") -> Graph."""
    msg = graph_pb2.Graph()
    try:
        if fmt == "json":
            json_format.Parse(bytes(data).decode("utf-8"), msg)
        else:
            msg.ParseFromString(bytes(data))
    except UnicodeDecodeError:
        raise GraphFileError("not valid UTF-8", path=path, fmt=fmt) from None
    except RecursionError:
        raise GraphFileError("nested too deeply", path=path, fmt=fmt) from None
    except (json_format.ParseError, DecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "malformed"
        raise GraphFileError(first, path=path, fmt=fmt) from None
    return msg


def load_graph(path, fmt: str | None = None) -> graph_pb2.Graph:
    """Read a graph file; fmt ("json" or "pb") by default from the extension, else sniffed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GraphFileError(exc.strerror or str(exc), path=path) from None
    return decode_graph(data, fmt or sniff_format(data, path), path)


def save_graph(graph: graph_pb2.Graph, path) -> Path:
    path = Path(path)
    if path.suffix == ".pb":
        path.write_bytes(graph.SerializeToString())
    else:
        path.write_text(json_format.MessageToJson(graph, indent=2) + "\n")
    return path


def to_graph(graph) -> graph_pb2.Graph:
    """Accept a Graph message, a path, a JSON dict or JSON text."""
    if isinstance(graph, graph_pb2.Graph):
        return graph
    if isinstance(graph, dict):
        return json_format.ParseDict(graph, graph_pb2.Graph())
    if isinstance(graph, str) and graph.lstrip().startswith("{"):
        return json_format.ParseDict(json.loads(graph), graph_pb2.Graph())
    if isinstance(graph, (str, Path)):
        return load_graph(graph)
    raise TypeError(f"expected a gradcheck.v1.Graph, a path or a JSON dict, got {type(graph).__name__}")


def set_attrs(node: graph_pb2.Node, attrs: dict) -> None:
    """Fill a node's attrs Struct from Python values (NumPy scalars and arrays included)."""
    if attrs:
        json_format.ParseDict(_jsonable(attrs), node.attrs)


def _jsonable(v):
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, np.generic):
        return v.item()
    return v
