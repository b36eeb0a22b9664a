"""Bytes, JSON text, files or protobuf messages -> validated Graph.

The one entry point is `load_graph`; `parse_graph` stops at the protobuf
message. Both encodings are the same message: binary protobuf (.pb) and the
protobuf JSON mapping (.json).
"""
from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gradcheck.v1 import graph_pb2

from ..errors import GraphError
from .ir import Graph
from .validate import Limits, validate


def _first_line(text: str) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else "malformed input"


def parse_graph(source, fmt: str | None = None) -> graph_pb2.Graph:
    """Decode a Graph message from a path, bytes, JSON text, a dict, or a message.

    fmt: "json" or "pb"; by default the file extension, else sniffed (JSON starts with '{')."""
    if isinstance(source, graph_pb2.Graph):
        return source
    if isinstance(source, dict):
        return _from_json_text(json.dumps(source))
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise GraphError(f"cannot read graph file: {exc.strerror or exc}", field=str(path)) from None
        if fmt is None and path.suffix in (".json", ".pb"):
            fmt = path.suffix[1:]
        source = data
    if isinstance(source, str):
        return _from_json_text(source)
    if fmt is None:
        fmt = "json" if bytes(source[:64]).lstrip().startswith(b"{") else "pb"
    if fmt == "json":
        try:
            return _from_json_text(bytes(source).decode("utf-8"))
        except UnicodeDecodeError:
            raise GraphError("graph JSON is not valid UTF-8", field="graph") from None
    msg = graph_pb2.Graph()
    try:
        msg.ParseFromString(bytes(source))
    except DecodeError as exc:
        raise GraphError(f"not a valid gradcheck.v1.Graph protobuf ({_first_line(exc)})", field="graph") from None
    return msg


def _from_json_text(text: str) -> graph_pb2.Graph:
    msg = graph_pb2.Graph()
    try:
        json_format.Parse(text, msg)
    except json_format.ParseError as exc:
        raise GraphError(f"invalid graph JSON: {_first_line(exc)}", field="graph") from None
    except RecursionError:
        raise GraphError("invalid graph JSON: nested too deeply", field="graph") from None
    return msg


def load_graph(source, fmt: str | None = None, limits: Limits | None = None) -> Graph:
    """Decode and validate: the single door from the outside world to a Graph."""
    return validate(parse_graph(source, fmt), limits or Limits())


def graph_to_json(msg: graph_pb2.Graph) -> str:
    return json_format.MessageToJson(msg, indent=2)
