"""Float initializers that are tables, not weights: constants by default (importer.py's `weights`).

- **Rotary tables**: an initializer whose every way into the model passes through a Cos or Sin of
  values known at import time (RoPE's inverse frequencies, positions times them). Its gradient means
  nothing to a user, and torch holds it as a buffer, not a parameter.
- **What a dynamo export's optimizer made**: an initializer of a torch.export program (its graph
  signature is in the model) that is no torch parameter and that provenance traces to none -- its
  optimizer folded it from buffers, constants and parameters: RoPE's `cos`/`sin`, a learned position
  embedding read at `arange` positions (`embedding_1`: GPT-2's wpe), a tied weight's transpose
  (`permute`). The parameters folded into them are named by the report's "not checked" note, with
  these constants and the way to keep them (importer.folded_note).
"""
from __future__ import annotations

import re

import numpy as np

from .converters import static_initializers

MASK_MAGNITUDE = 1e30  # beyond any trained weight: a mask's finfo.min (-3.4e38, -1.8e308) or -inf


def is_mask(value: np.ndarray) -> bool:
    """A float initializer holding an entry of magnitude >= MASK_MAGNITUDE: an additive mask (GPT-2's
    causal mask, folded by the dynamo exporter), not a weight: its gradient means nothing, and as a
    parameter its huge entries would defeat the joint finite-difference screen."""
    if value.dtype.kind != "f" or value.size == 0:
        return False
    with np.errstate(over="ignore"):  # float16 cannot hold 1e30: it compares with inf, which is right (its masks
        return bool(np.any(np.abs(value) >= MASK_MAGNITUDE))  # are -inf), without a warning on stderr


def may_hold(graph, initializers: dict, names: set[str]) -> set[str]:
    """Of the exporter-made constants `names`, those a folded torch parameter may be (importer.folded_note names
    them as its holders): not an op's import-time input (Resize's scales), a rotary table or a mask -- those
    are made of buffers and numbers, and naming them would send a user looking in the wrong place."""
    static = static_initializers(graph, initializers) | rotary_tables(graph, initializers)
    return {n for n in names if n not in static and not is_mask(initializers[n])}


TRIG = ("Cos", "Sin")
SHAPES = ("Shape", "Size")  # their outputs are known at import time, whatever their input


def _static_values(graph, initializers) -> set[str]:
    """Values known at import time: initializers, and the outputs of nodes reading only such values
    (Constant nodes, shape arithmetic, Shape and Size of anything)."""
    static = set(initializers)
    for node in graph.node:
        if node.op_type in SHAPES or all(n in static for n in node.input if n):
            static.update(o for o in node.output if o)
    return static


def rotary_tables(graph, initializers) -> set[str]:
    """The float initializers whose every reader is a Cos or Sin, or a node of import-time values whose
    outputs are in turn read only so (positions times inverse frequencies, then Cos and Sin). One pass
    over the nodes backwards (ONNX lists them in topological order: a value's readers come after it)."""
    static = _static_values(graph, initializers)
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for n in node.input:
            if n:
                readers.setdefault(n, []).append(i)
    graph_outputs = {vi.name for vi in graph.output}
    ok: dict[int, bool] = {}  # node index -> it leads its import-time inputs only into Cos or Sin

    def only_trig(value: str) -> bool:
        nodes = readers.get(value, [])
        return bool(nodes) and value not in graph_outputs and all(ok.get(i, False) for i in nodes)

    for i in range(len(graph.node) - 1, -1, -1):
        node = graph.node[i]
        ok[i] = node.op_type in TRIG or (all(n in static for n in node.input if n)
                                         and all(only_trig(o) for o in node.output if o))
    return {name for name, value in initializers.items() if value.dtype.kind == "f" and only_trig(name)}


def exporter_made(exported: list[str], initializers, traced: set[str]) -> set[str]:
    """The float initializers of a dynamo export (exported: its signature's torch parameters; empty for
    another exporter: nothing) that are no torch parameter and that no source_names entry traces to one."""
    if not exported:
        return set()
    keep = set(exported) | traced
    return {name for name, value in initializers.items() if value.dtype.kind == "f" and name not in keep}


TRIG_NAME = re.compile(r"(?:cos|sin)(?:_\d+)?$")  # a dynamo export's folded cos/sin table (unexplained_constants)


def buffer_names(signature: str) -> set[str]:
    """The buffers and lifted tensor constants a dynamo export's graph signature lists (their initializers keep
    these names): a module's own constants, not what the optimizer made."""
    return set(re.findall(r": (?:BUFFER|CONSTANT_TENSOR) target='([^']*)'", signature))


def unexplained_constants(graph, initializers: dict, made: set[str], buffers: set[str]) -> set[str]:
    """Of a dynamo export's exporter-made constants `made` (exporter_made, less the tied copies), those that may
    be an expression of a parameter the optimizer folded (`self.w[:3, :3].sum(1)` stored as `sum_2` while `w`
    is read elsewhere): the gradient through them is not the graph's, so the report warns (importer.folded_note).
    Left out, as legitimately constant: fewer than 2 elements (an exporter's numbers), masks, rotary tables and
    import-time inputs (may_hold), fills and two-valued masks -- fewer than min(3, size) distinct elements: an
    RNN's zero initial state, GroupNorm's InstanceNormalization ones and zeros, a causal mask's 0 and -1e9,
    which no trained weight's expression gives --, a folded rotary table -- named after the cos or sin the
    optimizer folded last (`cos`, `sin_1`: torch.export names a value after its op), as an initializer read
    only through Cos/Sin is one (rotary_tables) -- and exact copies or blocks of a buffer (ties.find_ties
    with the buffers as bases)."""
    from .ties import find_ties

    sized = {n for n in made if n not in buffers and initializers[n].size >= 2 and not TRIG_NAME.match(n)}
    sized = {n for n in may_hold(graph, initializers, sized)
             if np.unique(initializers[n]).size >= min(3, initializers[n].size)}
    held = {b for b in buffers if b in initializers}
    return sized - set(find_ties(initializers, sized, held))
