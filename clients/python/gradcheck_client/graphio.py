"""Graph files: load and save gradcheck.v1.Graph as .json (protobuf JSON) or .pb (binary)."""
from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gradcheck.v1 import graph_pb2

SUFFIXES = (".json", ".pb")


class GraphFileError(ValueError):
    """A graph file that cannot be read or decoded (one line, naming the file)."""


def load_graph(path) -> graph_pb2.Graph:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GraphFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    fmt = path.suffix[1:] if path.suffix in SUFFIXES else ("json" if data.lstrip()[:1] == b"{" else "pb")
    msg = graph_pb2.Graph()
    try:
        if fmt == "json":
            json_format.Parse(data.decode("utf-8"), msg)
        else:
            msg.ParseFromString(data)
    except (json_format.ParseError, UnicodeDecodeError, DecodeError, RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "malformed"
        raise GraphFileError(f"{path}: not a valid gradcheck.v1.Graph ({fmt}): {first}") from None
    return msg


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
