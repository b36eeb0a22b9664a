"""Protobuf Graph message -> validated Graph.

Checks, each failing with one GraphError naming the node or field: tensor
decoding, duplicate and empty names, unknown ops (with a suggestion), unknown
input names, arity, attributes against the op's schema, a missing output,
cycles (naming the nodes on one), dtype and shape inference with broadcasting,
a non-scalar loss, and configured size limits.

The topological sort is Kahn's algorithm with an explicit queue: no recursion,
so a 100,000-node chain loads like any other graph.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
from gradcheck_core.hints import hint, nearest

from ..errors import GraphError, LimitError
from ..limits import FORMULA_MAX_DEPTH, Limits  # Limits: defined there, no import cycle
from ..ops import OPSET_VERSION, REGISTRY
from ..ops.base import FLOAT, REQUIRED, Attr, OpDef
from .claims import decode_claims
from .inplace import resolve_inplace
from .ir import SOURCE_RELATIONS, Graph, GraphInput, Node, SourceName

DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "bool": np.bool_}
# NumPy's own bounds on a shape, checked before any array or broadcast is made (else its ValueError or
# RuntimeError surfaces as an internal error): broadcasting takes at most 32 dimensions, and an array's
# nonzero dimensions times its itemsize must fit in 2**63 bytes even when a 0 makes it empty
# (16 bytes: the complex-step forward holds complex128).
MAX_RANK, MAX_SPAN = 32, 2**59


def check_shape(shape, **where) -> None:
    """GraphError (at where: node= or field=) for a shape NumPy cannot make: too many dimensions, or
    nonzero dimensions whose product overflows an array's byte count."""
    if len(shape) > MAX_RANK:
        raise GraphError(f"shape has {len(shape)} dimensions, the most NumPy supports is {MAX_RANK}", **where)
    if math.prod(d for d in shape if d) > MAX_SPAN:
        raise GraphError(f"shape {_clipped(shape)} is too large for an array (its nonzero dimensions multiply "
                         f"past 2**59)", **where)


def _clipped(shape) -> str:
    text = str(list(shape))
    return text if len(text) <= 80 else text[:77] + "..."


def _check_name(name: str, where: str, limits: Limits) -> None:
    if len(name) > limits.max_name_length:
        raise LimitError(f"name is {len(name)} characters long, the limit is {limits.max_name_length}",
                         field=where, limit="max_name_length")


def _source_names(inp, where: str, limits: Limits) -> tuple:
    """An input's source_names, every string within the name length (they are echoed in reports)."""
    out = []
    for j, sn in enumerate(inp.source_names):
        at = f"{where}.source_names[{j}]"
        if sn.relation not in SOURCE_RELATIONS:
            raise GraphError(f"unknown relation '{sn.relation[:40]}' (expected one of {', '.join(SOURCE_RELATIONS)})",
                             field=at)
        for text in (sn.name, sn.onnx_name, *sn.read_by):
            _check_name(text, at, limits)
        out.append(SourceName(sn.name, sn.relation, sn.onnx_name, tuple(sn.read_by)))
    return tuple(out)


MAX_NOTES, MAX_NOTE_LENGTH = 16, 2000  # a graph's notes are echoed in reports


def _notes(msg) -> tuple[str, ...]:
    """The graph's notes, within their count and length (they are echoed in reports)."""
    if len(msg.notes) > MAX_NOTES:
        raise LimitError(f"{len(msg.notes)} notes, the limit is {MAX_NOTES}", field="notes")
    for j, note in enumerate(msg.notes):
        if len(note) > MAX_NOTE_LENGTH:
            raise LimitError(f"note is {len(note)} characters long, the limit is {MAX_NOTE_LENGTH}",
                             field=f"notes[{j}]")
    return tuple(msg.notes)


def _paren_depth(text: str) -> int:
    depth = deepest = 0
    for c in text:
        if c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
    return deepest


def _attr_values(attrs: dict):
    """Every value in a node's attributes, containers included (already decoded: the message bounds them)."""
    stack = [attrs]
    while stack:
        v = stack.pop()
        yield v
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _check_attr_sizes(node: str, attrs: dict, limits: Limits) -> None:
    """Bound a node's attributes before any op reads them: value count, string length, nesting."""
    values = list(_attr_values(attrs))
    if len(values) > limits.max_attribute_values:
        raise LimitError(f"attributes hold {len(values)} values, the limit is {limits.max_attribute_values}",
                         node=node, limit="max_attribute_values")
    for v in values:
        if isinstance(v, str):
            if len(v) > limits.max_formula_chars:
                raise LimitError(f"a string attribute is {len(v)} characters long, the limit is "
                                 f"{limits.max_formula_chars}", node=node, limit="max_formula_chars")
            # at the parser's own cap (the default) the parser says it, naming the column
            if limits.max_formula_depth < FORMULA_MAX_DEPTH and _paren_depth(v) > limits.max_formula_depth:
                raise LimitError(f"a formula is nested {_paren_depth(v)} levels deep, the limit is "
                                 f"{limits.max_formula_depth}", node=node, limit="max_formula_depth")


# --- tensors ---------------------------------------------------------------------------


def decode_tensor(t, where: str) -> tuple[np.ndarray, str]:
    dtype = t.dtype or "float64"
    if dtype not in DTYPES:
        raise GraphError(f"unknown dtype '{dtype}' (expected one of {', '.join(DTYPES)})", field=where)
    shape = tuple(int(d) for d in t.shape)
    if any(d < 0 for d in shape):
        raise GraphError(f"negative dimension in shape {_clipped(shape)}", field=where)
    check_shape(shape, field=where)
    size = math.prod(shape)
    if t.raw:
        if len(t.data):
            raise GraphError("set either data or raw, not both", field=where)
        itemsize = np.dtype(DTYPES[dtype]).itemsize
        if len(t.raw) != size * itemsize:
            raise GraphError(f"raw holds {len(t.raw)} bytes, shape {list(shape)} of {dtype} needs "
                             f"{size * itemsize}", field=where)
        arr = np.frombuffer(t.raw, dtype=np.dtype(DTYPES[dtype]).newbyteorder("<")).astype(DTYPES[dtype])
        return arr.reshape(shape), dtype
    data = np.asarray(t.data, dtype=np.float64)
    if data.size != size:
        raise GraphError(f"data has {data.size} values, shape {list(shape)} needs {size}", field=where)
    if dtype == "int64":
        if not np.all(np.isfinite(data)) or np.any(data != np.round(data)) or np.any(np.abs(data) > 2**53):
            raise GraphError("int64 data must hold integers below 2**53", field=where)
    if dtype == "bool" and np.any((data != 0) & (data != 1)):
        raise GraphError("bool data must hold 0 or 1", field=where)
    return data.astype(DTYPES[dtype]).reshape(shape), dtype


# --- attributes ------------------------------------------------------------------------


def _is_int(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()


def _convert_attr(node: str, key: str, schema: Attr, v):
    bad = lambda what: GraphError(f"attribute '{key}' must be {what}, got {v!r}", node=node)  # noqa: E731
    if v is None:
        if schema.default is None:
            return None
        raise bad("set (null given)")
    kind = schema.kind
    if kind == "int":
        if not _is_int(v):
            raise bad("an integer")
        return int(v)
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad("a number")
        return float(v)
    if kind == "bool":
        if not isinstance(v, bool):
            raise bad("true or false")
        return v
    if kind == "str":
        if not isinstance(v, str):
            raise bad("a string")
        if schema.choices and v not in schema.choices:
            raise bad("one of " + ", ".join(repr(c) for c in schema.choices))
        return v
    if kind in ("ints", "axes"):
        if kind == "axes" and _is_int(v):
            return int(v)
        if not isinstance(v, list) or not all(_is_int(e) for e in v):
            raise bad("a list of integers" if kind == "ints" else "an integer or a list of integers")
        return [int(e) for e in v]
    return v  # "value" (any JSON) and schema kinds validated by the op's infer


def convert_attrs(node: str, op: OpDef, given: dict) -> dict:
    unknown = sorted(set(given) - set(op.attrs))
    if unknown:
        allowed = ", ".join(op.attrs) or "none"
        raise GraphError(f"unknown attribute '{unknown[0]}' for op '{op.name}' (allowed: {allowed})", node=node)
    out = {}
    for key, schema in op.attrs.items():
        if key in given:
            out[key] = _convert_attr(node, key, schema, given[key])
        elif schema.default is REQUIRED:
            raise GraphError(f"missing required attribute '{key}' for op '{op.name}'", node=node)
        else:
            out[key] = schema.default
    return out


def _struct_to_dict(struct) -> dict:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(struct)


# --- ordering --------------------------------------------------------------------------


def topological_order(nodes: list, producers: dict[str, int]) -> list[int]:
    """Kahn's algorithm over node indices; raises GraphError naming a cycle.

    Ready nodes are taken in their order in the graph (a heap, not a FIFO), so
    the order is the program order wherever dependencies allow: in-place
    writes happen where they are written."""
    n = len(nodes)
    indeg = [0] * n
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        for name in node.inputs:
            j = producers.get(name)
            if j is not None:
                indeg[i] += 1
                consumers[j].append(i)
    queue = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(queue)
    order = []
    while queue:
        i = heapq.heappop(queue)
        order.append(i)
        for k in consumers[i]:
            indeg[k] -= 1
            if indeg[k] == 0:
                heapq.heappush(queue, k)
    if len(order) < n:
        cycle = _find_cycle(nodes, producers, indeg)
        raise GraphError(f"graph has a cycle: {' -> '.join(cycle)}", node=cycle[0])
    return order


def _find_cycle(nodes, producers, indeg) -> list[str]:
    """Walk predecessors among the unsorted nodes until one repeats (iteratively)."""
    start = next(i for i, d in enumerate(indeg) if d > 0)
    seen: dict[int, int] = {}
    path = []
    i = start
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = next(producers[name] for name in nodes[i].inputs
                 if name in producers and indeg[producers[name]] > 0)
    cycle = path[seen[i]:][::-1]
    names = [nodes[k].name for k in cycle]
    return names + [names[0]]


# --- the whole graph -------------------------------------------------------------------


def _check_finite(inp: GraphInput, allow: bool) -> None:
    if not allow and inp.declared_dtype.startswith("float"):
        refuse_nonfinite(inp.value, f"input '{inp.name}'")


def refuse_nonfinite(value: np.ndarray, field: str) -> None:
    """GraphError naming the first NaN/Inf in a float array of input data (and how to allow them)."""
    bad = ~np.isfinite(value)
    if bad.any():
        index = [int(i) for i in np.argwhere(bad)[0]]
        raise GraphError(f"data holds {int(bad.sum())} NaN/Inf value(s), first {value[tuple(index)]} at "
                         f"index {index} (allow them with allow_nonfinite / --allow-nonfinite)", field=field)


def validate(msg, limits: Limits = Limits(), *, allow_nonfinite: bool = False,
             require_parameters: bool = True, nonfinite_constants: bool = False) -> Graph:
    """The graph message as a checked Graph, or GraphError/LimitError naming the node or field.

    A graph with no parameter (no input with requires_grad) checks nothing: it is invalid input, so that a
    verification (CLI, server, CI command, batch) cannot pass without checking a gradient. Tools that only
    convert or inspect graphs (ONNX import, shape inference, the op audit's one-op graphs) pass
    require_parameters=False. nonfinite_constants: inputs that are not parameters may hold NaN/Inf without
    allow_nonfinite (an imported model's own constants -- a causal mask's -inf -- are part of its function;
    the data a user gave it is checked where it is imported, onnx_import.options_from_proto)."""
    if msg.opset_version > OPSET_VERSION:
        raise GraphError(f"opset_version {msg.opset_version} is newer than this server's {OPSET_VERSION}",
                         field="opset_version")
    if msg.opset_version < 0:
        raise GraphError(f"opset_version {msg.opset_version} is negative (leave it 0 for this server's "
                         f"{OPSET_VERSION})", field="opset_version")
    if len(msg.nodes) > limits.max_nodes:
        raise LimitError(f"graph has {len(msg.nodes)} nodes, the limit is {limits.max_nodes}", field="nodes",
                         limit="max_nodes")
    _check_name(msg.name, "name", limits)
    _check_name(msg.output, "output", limits)
    inputs = _inputs(msg, limits, allow_nonfinite, nonfinite_constants)
    if require_parameters and not any(inp.requires_grad for inp in inputs.values()):
        raise GraphError("no parameters: nothing to check (no input has requires_grad)", field="inputs")
    producers = _producers(msg, inputs, limits)
    specs = {name: gi.spec for name, gi in inputs.items()}
    nodes = _typed_nodes(msg, topological_order(list(msg.nodes), producers), specs,
                         sum(gi.value.size for gi in inputs.values()), limits)
    nodes, output = resolve_inplace(nodes, inputs, specs, msg.output)
    out_spec = specs[output]
    if out_spec.size != 1 or out_spec.dtype != FLOAT:
        fix = (f" (add a 'sum' or 'mean' node reading '{output}' and make it the output)"
               if out_spec.dtype == FLOAT else "")
        raise GraphError(f"output must be a float scalar (the loss), got {out_spec.dtype} of shape "
                         f"{list(out_spec.shape)}{fix}", field="output")
    claims = decode_claims(msg, [n for n, i in inputs.items() if i.requires_grad], specs, [n.name for n in nodes],
                           decode_tensor)
    return Graph(msg.name, msg.opset_version or OPSET_VERSION, inputs, nodes, output, specs, claims,
                 _notes(msg))


def _inputs(msg, limits: Limits, allow_nonfinite: bool, nonfinite_constants: bool) -> dict[str, GraphInput]:
    """The graph's inputs decoded, named uniquely, and finite unless allowed (see validate)."""
    inputs: dict[str, GraphInput] = {}
    for k, inp in enumerate(msg.inputs):
        if not inp.name:
            raise GraphError("input has no name", field=f"inputs[{k}]")
        _check_name(inp.name, f"inputs[{k}].name", limits)
        if inp.name in inputs:
            raise GraphError(f"duplicate input name '{inp.name}'", field=f"input '{inp.name}'")
        value, dtype = decode_tensor(inp.value, f"input '{inp.name}'")
        if inp.requires_grad and not dtype.startswith("float"):
            raise GraphError(f"requires_grad needs a float dtype, got {dtype}", field=f"input '{inp.name}'")
        inputs[inp.name] = GraphInput(inp.name, value, inp.requires_grad, dtype,
                                      _source_names(inp, f"inputs[{k}]", limits))
        _check_finite(inputs[inp.name], allow_nonfinite or (nonfinite_constants and not inp.requires_grad))
    return inputs


def _producers(msg, inputs: dict, limits: Limits) -> dict[str, int]:
    """Node name -> its index, once every node is named uniquely, its op is known and what it reads and
    the graph's output exist."""
    producers: dict[str, int] = {}
    for i, node in enumerate(msg.nodes):
        if not node.name:
            raise GraphError("node has no name", field=f"nodes[{i}]")
        _check_name(node.name, f"nodes[{i}].name", limits)
        for k, name in enumerate(node.inputs):
            _check_name(name, f"nodes[{i}].inputs[{k}]", limits)
        if node.name in inputs or node.name in producers:
            raise GraphError(f"duplicate name '{node.name}'", node=node.name)
        producers[node.name] = i
    for node in msg.nodes:
        if node.op not in REGISTRY:
            close = nearest(node.op, REGISTRY, n=1)  # nothing close: no list (the registry is long)
            did_you_mean = f" (did you mean '{close[0]}'?)" if close else ""
            raise GraphError(f"unknown op '{node.op}'{did_you_mean}", node=node.name)
        for name in node.inputs:
            if name not in inputs and name not in producers:
                raise GraphError(f"unknown input '{name}'", node=node.name)
    if not msg.output:
        raise GraphError("graph has no output (set 'output' to the loss value's name)", field="output")
    if msg.output not in inputs and msg.output not in producers:
        raise GraphError(f"output '{msg.output}' is not an input or node"
                         f"{hint(msg.output, [*inputs, *producers])}", field="output")
    return producers


def _typed_nodes(msg, order: list[int], specs: dict, elements: int, limits: Limits) -> list[Node]:
    """The nodes in topological order, each checked (arity, input dtypes, attributes) and its output's spec
    inferred into specs; elements (the inputs' count) grows by each output, within max_elements."""
    nodes: list[Node] = []
    first_over = None  # the node that took the graph over max_elements
    for i in order:
        pb = msg.nodes[i]
        op = REGISTRY[pb.op]
        in_specs = [specs[name] for name in pb.inputs]
        _check_arity_and_dtypes(pb, op, in_specs)
        user_attrs = _struct_to_dict(pb.attrs) if pb.HasField("attrs") else {}
        _check_attr_sizes(pb.name, user_attrs, limits)
        attrs = convert_attrs(pb.name, op, user_attrs)
        if op.wants_input_names:
            attrs["input_names"] = tuple(pb.inputs)
        try:
            spec, norm = op.infer(pb.name, in_specs, attrs)
        except (ValueError, TypeError, IndexError) as exc:
            raise GraphError(f"invalid attributes for op '{op.name}': {exc}", node=pb.name) from None
        check_shape(spec.shape, node=pb.name)
        elements += spec.size
        if elements > limits.max_elements and first_over is None:
            # named, and counted on (shapes only, nothing is allocated): the error states what the graph needs
            first_over = pb.name
        scratch = op.scratch([s.shape for s in in_specs], spec.shape, **norm) if op.scratch else 0
        if first_over is None and elements + scratch > limits.max_elements:  # a temporary is memory too
            raise LimitError(f"op '{op.name}' needs a temporary of {scratch} elements, over the limit of "
                             f"{limits.max_elements} with the graph's {elements}", node=pb.name, limit="max_elements")
        specs[pb.name] = spec
        nodes.append(Node(pb.name, op, tuple(pb.inputs), norm, user_attrs, pb.inplace, spec,
                          empty_struct=pb.HasField("attrs") and not pb.attrs.fields))
    if elements > limits.max_elements:
        raise LimitError(f"graph holds {elements} elements (inputs and node outputs), the limit is "
                         f"{limits.max_elements}", node=first_over, field=None if first_over else "graph",
                         limit="max_elements")
    return nodes


def _check_arity_and_dtypes(pb, op: OpDef, in_specs: list) -> None:
    n_in = len(pb.inputs)
    if (op.arity is None and n_in == 0) or (op.arity is not None and n_in != op.arity):
        want = "at least 1" if op.arity is None else str(op.arity)
        raise GraphError(f"op '{op.name}' takes {want} input(s), got {n_in}", node=pb.name)
    for k, (name, s) in enumerate(zip(pb.inputs, in_specs)):
        want = op.kind_of(k)
        if s.dtype != want:
            raise GraphError(f"input {k} ('{name}') of op '{op.name}' must be {want}, got {s.dtype}",
                             node=pb.name)
