"""Build Graph messages from Python (tests, benchmarks, example generation).

    b = GraphBuilder("seed")
    w = b.input("w", 3.0, requires_grad=True)
    x = b.input("x", 2.0, requires_grad=True)
    z = b.node("mul", w, x, name="z")
    b.output(b.node("div", b.node("square", z, name="a"), b.input("four", 4.0), name="L"))
    graph_message = b.build()
"""
from __future__ import annotations

import numpy as np
from google.protobuf import json_format

from gradcheck.v1 import graph_pb2
from gradcheck_core.graphio import set_attrs

RAW_ABOVE = 4096  # tensors larger than this are stored as raw bytes


def tensor_message(value, dtype: str | None = None) -> graph_pb2.Tensor:
    a = np.asarray(value)
    if dtype is None:
        dtype = {"b": "bool", "i": "int64", "u": "int64"}.get(a.dtype.kind, "float64" if a.dtype != np.float32
                                                               else "float32")
    np_dtype = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "bool": np.bool_}[dtype]
    a = a.astype(np_dtype)
    t = graph_pb2.Tensor(dtype=dtype, shape=list(a.shape))
    if a.size > RAW_ABOVE:
        t.raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
    else:
        t.data.extend(a.reshape(-1).astype(np.float64).tolist())
    return t


class GraphBuilder:
    def __init__(self, name: str = ""):
        self.msg = graph_pb2.Graph(name=name, opset_version=1)
        self._count = 0

    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def input(self, name: str, value, requires_grad: bool = False, dtype: str | None = None) -> str:
        self.msg.inputs.add(name=name, value=tensor_message(value, dtype), requires_grad=requires_grad)
        return name

    def node(self, op: str, *inputs: str, name: str | None = None, inplace: bool = False, **attrs) -> str:
        name = name or self._fresh(op + "_")
        set_attrs(self.msg.nodes.add(name=name, op=op, inputs=list(inputs), inplace=inplace), attrs)
        return name

    def output(self, name: str) -> str:
        self.msg.output = name
        return name

    def build(self) -> graph_pb2.Graph:
        return self.msg


def graph_json(msg: graph_pb2.Graph) -> str:
    """The protobuf JSON mapping of a graph, laid out for people: one line per
    tensor's shape and data, one line per node."""
    return _dump(json_format.MessageToDict(msg), 0) + "\n"


def _dump(v, depth: int) -> str:
    import json

    flat = json.dumps(v)
    if not isinstance(v, (dict, list)) or len(flat) <= 100 or (
        isinstance(v, list) and all(not isinstance(e, (dict, list)) for e in v)
    ):
        return flat
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(v, list):
        return "[\n" + ",\n".join(inner + _dump(e, depth + 1) for e in v) + "\n" + pad + "]"
    items = [f"{inner}{json.dumps(k)}: {_dump(e, depth + 1)}" for k, e in v.items()]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}"

