"""The validated in-memory graph: plain dataclasses, no protobuf."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ops.base import FLOAT, OpDef, Spec


# docs/onnx.md says what each means (the RNN ones: how the gate blocks are ordered)
SOURCE_RELATIONS = ("same", "transposed", "reshaped", "derived", "lstm_gates", "gru_gates", "rnn_stacked", "tied")


@dataclass(frozen=True)
class SourceName:
    """One name a parameter has in the framework that made the model (graph.proto's SourceName)."""
    name: str  # e.g. "fc1.weight"; "" when it cannot be told
    relation: str  # one of SOURCE_RELATIONS
    onnx_name: str  # the name the model reads it by
    read_by: tuple[str, ...]  # the model's nodes that read it by that name

    def to_dict(self) -> dict:
        return {"name": self.name, "relation": self.relation, "onnx_name": self.onnx_name,
                "read_by": list(self.read_by)}


@dataclass(frozen=True)
class GraphInput:
    name: str
    value: np.ndarray  # host array as given (float64/float32/int64/bool)
    requires_grad: bool
    declared_dtype: str  # "float32" | "float64" | "int64" | "bool"
    source_names: tuple[SourceName, ...] = ()  # shown in reports; the verification does not read it

    @property
    def spec(self) -> Spec:
        return Spec(tuple(self.value.shape), FLOAT if self.declared_dtype.startswith("float") else self.declared_dtype)


@dataclass(frozen=True)
class Node:
    name: str
    op: OpDef
    inputs: tuple[str, ...]
    attrs: dict  # normalized by the op's `infer` (negative axes, static shapes)
    user_attrs: dict  # as written in the graph, for messages and re-encoding
    inplace: bool
    spec: Spec
    # attrs arrived as a Struct with no fields: what a binary encoder given a plain object sends (every
    # attribute then defaulted; verify/attributes.py warns where the op has structural ones)
    empty_struct: bool = False


@dataclass(frozen=True)
class Claims:
    """Gradients other code computed for the graph (graph.proto's Claims): the verification's subject
    when present (verify/claims.py). float64 host arrays, shapes checked against the graph."""
    gradients: dict  # parameter name -> dL/dp
    adjoints: dict  # node name -> dL/d(node output)
    dtype: str = "float64"  # "float32" when any claimed value came as float32: held to float32's tolerance


# how an ONNX import's note on constants its exporter may have folded a parameter's expression into begins
# (onnx_import.importer.constants_note); a claimed gradient failing beside it points at it (verify/subject.py)
FOLDED_CONSTANTS = "constants the exporter made, no torch parameter or buffer, that may be computed from a parameter"


@dataclass
class Graph:
    name: str
    opset_version: int
    inputs: dict[str, GraphInput]
    nodes: list[Node]  # topological order
    output: str
    specs: dict[str, Spec] = field(default_factory=dict)  # every value's static type
    claims: Claims | None = None  # the gradients under test, when other code computed them
    notes: tuple[str, ...] = ()  # the converter's word to the report (Graph.notes); read by the verification only
    # to point a failing claim at a FOLDED_CONSTANTS note

    @property
    def parameters(self) -> list[str]:
        return [n for n, i in self.inputs.items() if i.requires_grad]

    @property
    def declared_float_dtype(self) -> str:
        """float32 only if every float input is declared float32, else float64."""
        floats = [i.declared_dtype for i in self.inputs.values() if i.declared_dtype.startswith("float")]
        return "float32" if floats and all(d == "float32" for d in floats) else "float64"

    def node(self, name: str) -> Node | None:
        for n in self.nodes:
            if n.name == name:
                return n
        return None
