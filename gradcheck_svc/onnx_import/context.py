"""The importer's state while it walks an ONNX graph in order.

Every ONNX value is one of: a constant known at import time (a non-parameter
initializer, a Constant, or a node folded because all its inputs are
constants), a graph value already emitted into the gradcheck graph (inputs,
parameters, node outputs), an alias of another value (Identity, Dropout), or
poisoned (produced by an unsupported node). Constants are emitted lazily, on
first use by a non-folded node: int constants usually become attributes
(shapes, axes, pads) and never appear in the graph at all.

Static shapes come from the registry's own `infer` on each emitted node, so
the importer sees exactly the shapes the engine will.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import GraphError
from ..graph.build import GraphBuilder
from ..graph.validate import convert_attrs
from ..ops import get_op
from ..ops.base import FLOAT, Spec


class Unsupported(Exception):
    """This node cannot be imported; `reason` names what (the op type, or an attribute of it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Filled:
    """A float constant made by ConstantOfShape: emitted as a constant_of_shape node, not as data."""

    shape: tuple
    value: float

    def materialize(self, dtype) -> np.ndarray:
        return np.full(self.shape, self.value, dtype=dtype)


class Context:
    def __init__(self, name: str, float_dtype: str, taken_names: set[str], charge=None):
        self.builder = GraphBuilder(name)
        # charge(n, what): count n elements a converter computes at import time against the folding
        # budget (folding.Folder.charge), before it computes them
        self.charge = charge or (lambda n, what: None)
        self.float_dtype = float_dtype  # declared dtype of importer-made float constants
        self.consts: dict[str, object] = {}  # ONNX name -> np.ndarray | Filled
        self.emitted: dict[str, str] = {}  # ONNX name -> gradcheck value name
        self.shapes: dict[str, tuple] = {}  # gradcheck value name -> static shape
        self.dtypes: dict[str, str] = {}  # gradcheck value name -> "float" | "int64" | "bool" (ops.base)
        self.poisoned: set[str] = set()
        self.sequences: dict[str, list[str]] = {}  # ONNX sequence value -> its elements' gradcheck names
        # computed int64 indices (top_k_indices nodes) -> (their float source, the node's attrs): a shape op on
        # indices is the same op on the source, then its indices again (converters.indices_through)
        self.indices_of: dict[str, tuple[str, dict]] = {}
        self.taken = set(taken_names)
        self.onnx_name = ""  # the node being converted (for messages)

    # --- names ------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    # --- values -----------------------------------------------------------------------

    def is_const(self, onnx_name: str) -> bool:
        return onnx_name in self.consts

    def const(self, onnx_name: str, what: str = "input") -> np.ndarray:
        """The value of a constant input (shapes, axes, pads...); Unsupported when it is computed at run time."""
        if onnx_name not in self.consts:
            raise Unsupported(f"{what} '{onnx_name}' must be a constant")
        v = self.consts[onnx_name]
        return v.materialize(np.float64) if isinstance(v, Filled) else v

    def value(self, onnx_name: str) -> str:
        """The gradcheck value for an ONNX value, emitting a constant on first use."""
        if onnx_name in self.emitted:
            return self.emitted[onnx_name]
        if onnx_name not in self.consts:
            raise GraphError(f"value '{onnx_name}' is used before it is produced", node=self.onnx_name)
        v = self.consts[onnx_name]
        name = onnx_name  # ONNX names are unique (SSA); helpers made here get fresh ones
        if isinstance(v, Filled):
            self.emit_node("constant_of_shape", [], {"shape": list(v.shape), "value": v.value}, name)
        else:
            a = np.asarray(v)
            dtype = self.float_dtype if a.dtype.kind == "f" else ("bool" if a.dtype.kind == "b" else "int64")
            self.add_input(name, a, requires_grad=False, dtype=dtype)
        self.emitted[onnx_name] = name
        return name

    def add_input(self, name: str, value: np.ndarray, requires_grad: bool, dtype: str) -> str:
        self.builder.input(name, value, requires_grad=requires_grad, dtype=dtype)
        self.shapes[name] = tuple(np.shape(value))
        self.dtypes[name] = FLOAT if dtype.startswith("float") else dtype
        self.taken.add(name)
        return name

    def scalar(self, x: float) -> str:
        """A float scalar constant input (Gemm's alpha, Mean's 1/n ...)."""
        return self.add_input(self.fresh(f"{self.onnx_name}/const"), np.asarray(x), False, self.float_dtype)

    def shape(self, gc_name: str) -> tuple:
        return self.shapes[gc_name]

    def dtype(self, gc_name: str) -> str:
        """The dtype class of an emitted value: "float", "int64" or "bool" (a mask)."""
        return self.dtypes[gc_name]

    # --- nodes ------------------------------------------------------------------------

    def emit_node(self, op_name: str, inputs: list[str], attrs: dict, name: str) -> str:
        """Add one registry op node and record its static shape from the op's own infer."""
        op = get_op(op_name)
        for k, i in enumerate(inputs):  # int values exist only as constants and TopK's indices (converters.py)
            if self.dtypes[i] != op.kind_of(k) and op.kind_of(k) == FLOAT:
                raise Unsupported(f"{op_name} of a computed {self.dtypes[i]} value")
        self.builder.node(op_name, *inputs, name=name, **attrs)
        normalized = convert_attrs(name, op, attrs)
        spec, _ = op.infer(name, [Spec(self.shapes[i], self.dtypes[i]) for i in inputs], normalized)
        self.shapes[name] = tuple(spec.shape)
        self.dtypes[name] = spec.dtype
        self.taken.add(name)
        return name

    def emit(self, op_name: str, inputs: list[str], attrs: dict | None = None, *, name: str | None = None) -> str:
        """An intermediate node (named after the ONNX node being converted)."""
        return self.emit_node(op_name, inputs, attrs or {}, name or self.fresh(f"{self.onnx_name}/{op_name}"))

    def set_output(self, onnx_name: str, gc_name: str) -> None:
        self.emitted[onnx_name] = gc_name
