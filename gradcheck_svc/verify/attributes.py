"""The attributes each node was verified with (a report's `attributes`): what a client meant and what
the server read can differ without an error -- an attribute a client library dropped (a Node.js
client passing `attrs: {axis: 0}` as a plain object to a binary encoder sends an empty Struct) is
the op's default, `sum` over everything instead of over axis 0, and the check then passes for a
function nobody wrote. So the report states, for every node whose op has attributes that shape its
result (the registry's int, bool, ints and axes kinds: axis, keepdims, perm, shape, strides...),
the value of each one it used and which of them were not given (nodes that agree share one entry)."""
from __future__ import annotations

from ..graph.ir import Graph
from ..graph.validate import convert_attrs

STRUCTURAL = ("int", "bool", "ints", "axes")  # Attr kinds that decide which elements meet where


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def attributes_used(graph: Graph) -> list[dict]:
    """[{op, used: {attribute: value}, defaulted: [attributes not given], nodes: [names]}]: one entry
    per distinct (op, used, defaulted), in the order of their first node, so that a 100,000-node
    chain of one op costs one entry and its names."""
    groups: dict[tuple, dict] = {}
    for node in graph.nodes:
        keys = [k for k, a in node.op.attrs.items() if a.kind in STRUCTURAL]
        if not keys:
            continue
        typed = convert_attrs(node.name, node.op, node.user_attrs)  # as validation read them: axis 0, not 0.0
        used = {k: _plain(typed[k]) for k in keys}
        defaulted = [k for k in keys if k not in node.user_attrs]
        key = (node.op.name, repr(used), tuple(defaulted))  # the keys in the op's order: repr is canonical
        entry = groups.setdefault(key, {"op": node.op.name, "used": used, "defaulted": defaulted, "nodes": []})
        entry["nodes"].append(node.name)
    return list(groups.values())
