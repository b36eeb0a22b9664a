"""In-place nodes: validation and resolution to plain (SSA) form.

A node with `inplace: true` writes its result into its first input's buffer
(`x.relu_()`, `x += y`), so every reader of that buffer that runs after it
sees the new value. Nodes run in topological order, ties broken by their
order in the graph (program order, as in an eager framework).

`resolve_inplace` checks the in-place nodes -- not on a graph input that
requires grad (a leaf), no shape or dtype change, no two writers of one
buffer without an ordering between them -- and rewrites every read of a
buffer to the name of its latest writer at that point. The result is an
ordinary graph where each name is one immutable value: the math the oracles
and the backward pass follow. Only the engine's gradient run performs the
writes for real (and so meets the hazards the version counters catch).
"""
from __future__ import annotations

import dataclasses
from collections import deque

from ..errors import GraphError


def _descends(start: str, target: str, consumers: dict[str, list[str]]) -> bool:
    """Is `target` reachable from `start` along declared edges?"""
    seen = {start}
    queue = deque([start])
    while queue:
        for c in consumers.get(queue.popleft(), ()):
            if c == target:
                return True
            if c not in seen:
                seen.add(c)
                queue.append(c)
    return False


def resolve_inplace(nodes: list, inputs: dict, specs: dict, output: str) -> tuple[list, str]:
    """nodes in topological order -> (nodes with reads resolved to the latest writer, resolved output)."""
    if not any(n.inplace for n in nodes):
        return nodes, output
    root: dict[str, str] = {}  # in-place node -> the value whose buffer it writes
    writers: dict[str, list[str]] = {}
    for n in nodes:
        if not n.inplace:
            continue
        if not n.inputs:
            raise GraphError(f"op '{n.op.name}' has no input to write into in place", node=n.name)
        first = n.inputs[0]
        gi = inputs.get(first)
        if gi is not None and gi.requires_grad:
            raise GraphError(f"in-place write into graph input '{first}', which requires grad (a leaf that "
                             "requires grad cannot be modified in place)", node=n.name)
        src, out = specs[first], n.spec
        if src.shape != out.shape or src.dtype != out.dtype:
            raise GraphError(f"in-place result ({out.dtype} {list(out.shape)}) does not fit the buffer of its "
                             f"first input '{first}' ({src.dtype} {list(src.shape)})", node=n.name)
        root[n.name] = root.get(first, first)
        writers.setdefault(root[n.name], []).append(n.name)

    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for i in dict.fromkeys(n.inputs):
            consumers.setdefault(i, []).append(n.name)
    for buf, ws in writers.items():
        for a, b in zip(ws, ws[1:]):
            if not _descends(a, b, consumers):
                raise GraphError(f"in-place writers '{a}' and '{b}' race on the buffer of '{buf}': neither "
                                 "depends on the other, so their order is undefined", node=b)

    latest: dict[str, str] = {}  # buffer root -> name holding its current content
    out_nodes = []
    for n in nodes:
        resolved = tuple(latest.get(root.get(i, i), i) for i in n.inputs)
        out_nodes.append(n if resolved == n.inputs else dataclasses.replace(n, inputs=resolved))
        if n.inplace:
            latest[root[n.name]] = n.name
    return out_nodes, latest.get(root.get(output, output), output)
