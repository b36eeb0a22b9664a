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
from ..text import clip

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


MAX_NAMED = 5  # nodes named in the warning (the rest counted): a 100,000-node graph's warning stays one line


def defaulted_warnings(graph: Graph) -> list[str]:
    """One warning per op whose nodes arrived with an empty attrs Struct while the op has structural
    attributes: all of them defaulted, most likely dropped on the wire (a Node.js client's plain object),
    not chosen. Named in every report format (text, JUnit's, HTML's), not only the JSON's `attributes`."""
    by_op: dict[str, list] = {}
    for node in graph.nodes:
        keys = [k for k, a in node.op.attrs.items() if a.kind in STRUCTURAL]
        if node.empty_struct and keys:
            by_op.setdefault(node.op.name, [keys, []])[1].append(node.name)
    out = []
    for op, (keys, names) in by_op.items():
        more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
        out.append(f"node{'s' if len(names) > 1 else ''} {', '.join(repr(clip(n, 80)) for n in names[:MAX_NAMED])}{more} "
                   f"({op}) arrived with an empty attrs Struct: every attribute defaulted ({', '.join(keys)}); "
                   "a client that sent them as a plain object to a binary encoder loses them -- check the "
                   "report's attributes are the ones meant")
    return out
