"""Bytes, JSON text, files or protobuf messages -> validated Graph.

The one entry point is `load_graph`; `parse_graph` stops at the protobuf
message. Both encodings are the same message: binary protobuf (.pb) and the
protobuf JSON mapping (.json).
"""
from __future__ import annotations

import json
from pathlib import Path

from gradcheck.v1 import graph_pb2
from gradcheck_core.graphio import GraphFileError, decode_graph, sniff_format
from gradcheck_core.graphio import load_graph as read_graph_file

from ..errors import GraphError
from .ir import Graph
from .validate import Limits, validate


def _graph_error(exc: GraphFileError) -> GraphError:
    if exc.fmt is None:
        return GraphError(f"cannot read graph file: {exc.reason}", field=str(exc.path))
    if exc.fmt == "json":
        return GraphError(f"invalid graph JSON: {exc.reason}", field="graph")
    return GraphError(f"not a valid gradcheck.v1.Graph protobuf ({exc.reason})", field="graph")


def parse_graph(source, fmt: str | None = None) -> graph_pb2.Graph:
    """Decode a Graph message from a path, bytes, JSON text, a dict, or a message.

    fmt: "json" or "pb"; by default the file extension, else sniffed (JSON starts with '{').
    The decoding is the client's (gradcheck_core.graphio); its errors become GraphErrors."""
    if isinstance(source, graph_pb2.Graph):
        return source
    try:
        if isinstance(source, dict):
            return decode_graph(json.dumps(source).encode(), "json")
        if isinstance(source, str) and source.lstrip().startswith("{"):
            return decode_graph(source.encode(), "json")
        if isinstance(source, (str, Path)):
            return read_graph_file(source, fmt)
        return decode_graph(source, fmt or sniff_format(source))
    except GraphFileError as exc:
        raise _graph_error(exc) from None


def load_graph(source, fmt: str | None = None, limits: Limits | None = None, *,
               allow_nonfinite: bool = False, require_parameters: bool = True) -> Graph:
    """Decode and validate: the single door from the outside world to a Graph."""
    return validate(parse_graph(source, fmt), limits or Limits(), allow_nonfinite=allow_nonfinite,
                    require_parameters=require_parameters)

