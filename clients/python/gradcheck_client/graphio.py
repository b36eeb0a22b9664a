"""Graph files: load and save gradcheck.v1.Graph as .json (protobuf JSON) or .pb (binary).

The server decodes graphs with this module too (gradcheck_svc/graph/decode.py maps
GraphFileError to its GraphError), so both sides read a file the same way."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gradcheck.v1 import graph_pb2

from .hints import hint

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
        raise GraphFileError(_parse_reason(str(exc)), path=path, fmt=fmt) from None
    return msg


# protobuf's json_format: 'Message type "gradcheck.v1.Input" has no field named "requireGrad" at
# "Graph.inputs[0]".\n Available Fields...' (prefixed by "Failed to parse X field: " per level)
_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "([^"]*)" at "([^"]*)"')


def _parse_reason(text: str) -> str:
    """The parser's message in one line; an unknown field named with its place and the nearest
    valid field (JSON name, as the file spells them) instead of protobuf's field dump."""
    m = _UNKNOWN_FIELD.search(text)
    if m:
        type_name, field, where = m.groups()
        field = field[:60].encode("unicode_escape").decode("ascii")  # one line, whatever the key holds
        try:
            desc = graph_pb2.DESCRIPTOR.pool.FindMessageTypeByName(type_name)
            valid = [f.json_name for f in desc.fields]
        except KeyError:
            valid = []
        return f"unknown field '{field}' at {where}{hint(field, valid, n=1, what='valid fields')}"
    return text.strip().splitlines()[0] if text.strip() else "malformed"


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
    # a dict or JSON text is decoded as a file is, so a misspelt field reads the same (GraphFileError)
    if isinstance(graph, dict):
        return decode_graph(json.dumps(graph).encode(), "json")
    if isinstance(graph, str) and graph.lstrip().startswith("{"):
        return decode_graph(graph.encode(), "json")
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
