"""The attributes each node was verified with (a report's `attributes`): what a client meant and what
the server read can differ without an error -- an attribute a client library dropped (a Node.js
client passing `attrs: {axis: 0}` as a plain object to a binary encoder sends an empty Struct) is
the op's default, `sum` over everything instead of over axis 0, and the check then passes for a
function nobody wrote. So the report states, for every node whose op has attributes that shape its
result (the registry's int, bool, ints and axes kinds: axis, keepdims, perm, shape, strides...),
the value of each one it used and which of them were not given."""
from __future__ import annotations

from ..graph.ir import Graph

STRUCTURAL = ("int", "bool", "ints", "axes")  # Attr kinds that decide which elements meet where


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def attributes_used(graph: Graph) -> list[dict]:
    """[{node, op, used: {attribute: value}, defaulted: [attribute names not given]}], in graph order."""
    out = []
    for node in graph.nodes:
        keys = [k for k, a in node.op.attrs.items() if a.kind in STRUCTURAL]
        if not keys:
            continue
        used = {k: _plain(node.user_attrs[k]) if k in node.user_attrs else _plain(node.op.attrs[k].default)
                for k in keys}
        out.append({"node": node.name, "op": node.op.name, "used": used,
                    "defaulted": [k for k in keys if k not in node.user_attrs]})
    return out
