"""ONNX Loop with a trip count known at import time, unrolled: the pattern PyTorch's exporters write for
nn.EmbeddingBag with offsets (one iteration per bag: slice the ids, gather the rows, reduce), with its
scan outputs stacked (TorchScript) or its loop-carried sequence (dynamo: SequenceEmpty, SequenceInsert in
the body, ConcatFromSequence after).

Each iteration's body nodes are converted like the graph's own, under names of their own (`NAME/iterK`),
the iteration number a constant, the carried values the previous iteration's. A condition that is not a
constant true, or more iterations than MAX_ITERATIONS, is refused naming the node: the graph would depend on
values known only at run time, or be too large to unroll (MAX_UNROLLED_NODES body nodes in all). An If
whose condition is known at import time is its branch, converted in its place.
"""
from __future__ import annotations

import numpy as np

from .context import Unsupported

MAX_ITERATIONS = 1024
MAX_UNROLLED_NODES = 100_000  # body nodes converted by all unrolling of one model: a small model cannot make it huge


def _renamed(body_node, names: dict):
    """A copy of a body node reading and writing the iteration's names."""
    copy = type(body_node)()
    copy.CopyFrom(body_node)
    for i, n in enumerate(copy.input):
        copy.input[i] = names.get(n, n)
    for i, n in enumerate(copy.output):
        if n:
            copy.output[i] = names.setdefault(n, n)
    return copy


def _trip_count(ctx, node) -> int:
    """The most iterations: the trip count, or MAX_ITERATIONS when there is none (a while loop: it ends when
    its condition, known at import time, turns false)."""
    m = MAX_ITERATIONS
    if node.input and node.input[0]:
        m = int(np.asarray(ctx.const(node.input[0], "trip count")).reshape(-1)[0])
        if not 0 < m <= MAX_ITERATIONS:
            raise Unsupported(f"Loop of {m} iterations (unrolled: 1 to {MAX_ITERATIONS})")
    if len(node.input) > 1 and node.input[1] and not _true(ctx, node.input[1]):
        raise Unsupported("Loop whose condition is false before it starts")
    return m


def _true(ctx, name: str) -> bool:
    if not ctx.is_const(name):
        raise Unsupported("Loop or If whose condition is computed (the graph would depend on its value)")
    return bool(np.asarray(ctx.const(name, "condition")).reshape(-1)[0])


def run_nodes(importer, nodes, names: dict, tag: str) -> None:
    """Convert a subgraph's nodes under the names of this pass (`tag`): each output a fresh name."""
    importer.unrolled = getattr(importer, "unrolled", 0) + len(nodes)
    if importer.unrolled > MAX_UNROLLED_NODES:
        raise Unsupported(f"Loop or If unrolled past {MAX_UNROLLED_NODES} nodes")
    for b in nodes:
        for o in b.output:
            if o:
                names[o] = importer.ctx.fresh(f"{o}/{tag}")
        if b.op_type == "If":
            inline_if(importer, _renamed(b, names), names, tag)
        else:
            importer._node(_renamed(b, names))


def inline_if(importer, node, names: dict | None = None, tag: str = "if") -> None:
    """An If whose condition is known at import time: the branch it takes, converted in its place."""
    ctx = importer.ctx
    branch = next(a.g for a in node.attribute if a.name == ("then_branch" if _true(ctx, node.input[0])
                                                              else "else_branch"))
    inner = dict(names or {})
    run_nodes(importer, branch.node, inner, tag)
    for out, value in zip(node.output, branch.output):
        _alias(ctx, out, inner.get(value.name, value.name))


def unroll(importer, node) -> None:
    """Convert a Loop node (module docstring) through importer._node, one iteration at a time."""
    ctx = importer.ctx
    body = next(a.g for a in node.attribute if a.name == "body")
    m = _trip_count(ctx, node)
    ins, outs = [v.name for v in body.input], [v.name for v in body.output]
    carried = list(node.input[2:])  # the values each iteration starts from
    scans: list[list[str]] = [[] for _ in outs[1 + len(carried):]]
    for k in range(m):
        names = {ins[0]: ctx.fresh(f"{node.output[0]}/iter{k}/i")}
        ctx.consts[names[ins[0]]] = np.asarray(k, dtype=np.int64)
        names.update(zip(ins[2:], carried))
        if len(ins) > 1:
            names[ins[1]] = node.input[1] if len(node.input) > 1 else ""
        run_nodes(importer, body.node, names, f"iter{k}")
        carried = [names.get(o, o) for o in outs[1:1 + len(carried)]]
        for s, o in zip(scans, outs[1 + len(carried):]):
            s.append(names.get(o, o))
        if not _true(ctx, names.get(outs[0], outs[0])):
            break
    else:
        if not (node.input and node.input[0]):
            raise Unsupported(f"Loop still running after {MAX_ITERATIONS} iterations (unrolled: at most that)")
    for out, value in zip(node.output, carried):
        _alias(ctx, out, value)
    for out, values in zip(node.output[len(carried):], scans):
        if out:
            parts = [ctx.emit("reshape", [ctx.value(v)], {"shape": [1, *ctx.shape(ctx.value(v))]}) for v in values]
            ctx.set_output(out, ctx.emit("concat", parts, {"axis": 0}, name=out))


def _alias(ctx, out: str, value: str) -> None:
    if not out:
        return
    if value in ctx.sequences:
        ctx.sequences[out] = list(ctx.sequences[value])
    elif ctx.is_const(value):
        ctx.consts[out] = ctx.consts[value]
    else:
        ctx.set_output(out, ctx.value(value))
