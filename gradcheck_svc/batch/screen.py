"""Per-node screening: compare every node's results for the same graph, bit for bit.

Records are grouped by (graph, device, dtype): a GPU's gradient is not
expected to equal a CPU's to the last bit, but two healthy nodes of the same
kind running the same deterministic code must agree exactly. A record's
signature is its status plus the sha256 of each parameter's gradient; the
signature most nodes share is the reference, and every node that differs is
named, with the parameters whose bits differ or the verdict it reached
instead. Without a majority (two nodes, two answers) every node of the group
is named: there is no telling which is right. A graph that fails the same
way on every node is the graph's problem, not a node's: it is listed apart.
"""
from __future__ import annotations

from collections import Counter, defaultdict


def _signature(r: dict) -> tuple:
    return r["status"], tuple(sorted((r.get("digests") or {}).items()))


def _why(r: dict, ref: dict, others: int) -> str:
    if r["status"] != ref["status"]:
        detail = r.get("error") or _first_finding(r) or ""
        return f"{r['status']} where {others} other node(s) got {ref['status']}" + (f": {detail}" if detail else "")
    mine, theirs = r.get("digests") or {}, ref.get("digests") or {}
    params = sorted(p for p in set(mine) | set(theirs) if mine.get(p) != theirs.get(p))
    return (f"gradient of {', '.join(params)} differs bit for bit from {others} other node(s)"
            f" ({r.get('digest_scope') or 'full'} comparison)")


def _first_finding(r: dict) -> str:
    findings = (r.get("report") or {}).get("findings") or []
    if not findings:
        return ""
    f = findings[0]
    return f"node '{f.get('node')}' {f.get('cause')}"


def compare(records: list[dict]) -> dict:
    groups = defaultdict(list)
    for r in records:
        groups[(r["graph"], r.get("device"), r.get("dtype"))].append(r)
    disagreements, consistent_failures = [], []
    for (graph, device, dtype), rs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        counts = Counter(_signature(r) for r in rs)
        top, n = counts.most_common(1)[0]
        if len(counts) == 1:
            if top[0] != "pass":
                consistent_failures.append({"graph": graph, "device": device, "dtype": dtype, "status": top[0],
                                            "nodes": sorted(r["node"] for r in rs)})
            continue
        majority = 2 * n > len(rs)
        ref = next(r for r in rs if _signature(r) == top)
        for r in sorted(rs, key=lambda r: r["node"]):
            if majority and _signature(r) == top:
                continue
            reason = (_why(r, ref, n) if majority
                      else f"no majority among {len(rs)} nodes ({len(counts)} different answers)")
            disagreements.append({"node": r["node"], "graph": graph, "device": device, "dtype": dtype,
                                  "status": r["status"], "reason": reason})
    per_node = defaultdict(lambda: {"graphs": 0, "disagreements": 0, "devices": set()})
    for r in records:
        per_node[r["node"]]["graphs"] += 1
        per_node[r["node"]]["devices"].add(str(r.get("device")))
    for d in disagreements:
        per_node[d["node"]]["disagreements"] += 1
    nodes = {k: {**v, "devices": sorted(v["devices"])} for k, v in sorted(per_node.items())}
    return {"nodes": nodes, "disagreeing_nodes": sorted({d["node"] for d in disagreements}),
            "disagreements": disagreements, "consistent_failures": consistent_failures}
