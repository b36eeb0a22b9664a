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

A screen also knows which nodes it was meant to cover: `--expect-nodes`, the
list written at launch (`kubectl get nodes -l ... -o name`), is recorded in
every node's unit.json, and the merge names each expected node with no unit
(*not screened*) and each screened node outside the list. In an Indexed Job a
node belongs to the first completion index that landed on it: a retried index
that lands on a node another index screened leaves a *landing* file naming both
and exits 75, so the Job controller retries it elsewhere, and the merge names
every such landing.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

from ..errors import OptionError
from ..text import clip

LANDINGS = "landings"  # OUT/runs/<run>/node-<name>/landings/index-0003.json: an index refused on a screened node
# a Kubernetes node name: a DNS subdomain (lower case in practice; upper case accepted for hand-made lists)
_NODE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def parse_nodes(text: str, field: str = "--expect-nodes") -> list[str]:
    """The intended nodes: names separated by commas, spaces or newlines, each optionally `node/NAME` (as
    `kubectl get nodes -o name` prints them), `#` comments ignored; `@FILE` reads them from FILE. Sorted,
    distinct; a list naming no node, or anything that is not a node name, is refused."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            raise OptionError(f"cannot read {clip(text[1:], 200)}: {why}", field=field) from None
    names = set()
    for line in text.splitlines():
        for tok in re.split(r"[,\s]+", line.split("#", 1)[0]):
            name = tok[len("node/"):] if tok.startswith("node/") else tok
            if not tok:
                continue
            if not _NODE.fullmatch(name):
                raise OptionError(f"'{clip(tok, 80)}' is not a node name", field=field)
            names.add(name)
    if not names:
        raise OptionError("lists no node (write it at launch: kubectl get nodes -l SELECTOR -o name)", field=field)
    return sorted(names)


# unit_dir/rdir: a pathlib.Path, or any object with Path's `/`, read_bytes, is_dir, glob and mkdir (an object
# store's location): nothing here wraps them in Path()

def claimed_by(unit_dir) -> int | None:
    """The completion index that screened this node in this run, from its unit.json (None: none did, or by
    hand, or the file is unreadable -- then nothing is refused)."""
    from .schema import Damaged, check_unit, parse
    from .store import UNIT_FILE

    try:
        plan = check_unit(parse((unit_dir / UNIT_FILE).read_bytes()), unit_dir.name)
    except (OSError, Damaged):
        return None
    index = plan.get("screen_index")
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def record_landing(unit_dir, node: str, index: int, owner: int):
    from .store import atomic_write

    d = unit_dir / LANDINGS
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"index-{index:04d}.json"
    atomic_write(path, json.dumps({"node": node, "index": index, "screened_by": owner,
                                   "at": datetime.now(timezone.utc).isoformat()}).encode("utf-8"))
    return path


def read_landings(rdir, units: list[str]) -> list[dict]:
    """Every refused landing of a run: {node, index, screened_by}; unreadable files are left out (a landing
    is a note, not a result)."""
    out = []
    for unit in units:
        d = rdir / unit / LANDINGS
        if not d.is_dir():
            continue
        for f in sorted(d.glob("index-*.json")):
            try:
                x = json.loads(f.read_bytes().decode("utf-8"))
                item = {"node": str(x["node"]), "index": int(x["index"]), "screened_by": int(x["screened_by"])}
            except (OSError, ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
                continue
            out.append(item)
    return sorted(out, key=lambda i: (i["node"], i["index"]))


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
    per_node = defaultdict(lambda: {"graphs": 0, "disagreements": 0, "devices": set(), "counts": Counter()})
    for r in records:
        per_node[r["node"]]["graphs"] += 1
        per_node[r["node"]]["counts"][r["status"]] += 1
        per_node[r["node"]]["devices"].add(str(r.get("device")))
    for d in disagreements:
        per_node[d["node"]]["disagreements"] += 1
    from .schema import STATUSES

    nodes = {k: {**v, "devices": sorted(v["devices"]),
                 "counts": {s: v["counts"][s] for s in STATUSES if v["counts"][s]}}  # each node's own, in order
             for k, v in sorted(per_node.items())}
    return {"nodes": nodes, "disagreeing_nodes": sorted({d["node"] for d in disagreements}),
            "disagreements": disagreements, "consistent_failures": consistent_failures}
