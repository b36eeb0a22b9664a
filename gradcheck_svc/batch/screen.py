"""Per-node screening: every node's results held to one independent reference, never to a vote.

The reference is the merge's own verification of the suite (reference()): the
merge rebuilds the suite from what the units recorded (the bundled examples and
the generator's parameters; each graph checked against the sha256 the nodes
hashed), and verifies each graph in its own process, on the CPU, with the
screen's options and no planted fault, once per dtype the nodes ran. Each
node's record is then judged on its own (compare()):

- its verdict against the reference's: a node that fails where the reference
  passes (or passes where it fails) is named, whatever any other node says;
- its bits, where bits can be compared: a CPU node whose *numerics* (numerics():
  the machine, NumPy and the SIMD kernels it dispatches to on that CPU, the BLAS
  and the kernel it chose) are the merge's runs the same instructions on the
  same inputs, so a healthy one agrees with the reference to the bit; a node
  whose gradient differs from it in any bit is named, with the parameters. This
  is what catches the silent faults a tolerance cannot: a one-ulp-off tanh in a
  host's libm passes the node's own verification (its engine and its own
  float64 references share the forward) but not this.

So any number of bad nodes is named and no healthy one: two bad of four, all
bad, two bad in the same way (which a vote would call right). Limits, stated:
the reference is only as good as the merge's host (run the merge on a node you
trust; a bad merge host names every node of its kind -- loudly, never a silent
pass); a node of another kind (another SIMD level or BLAS kernel, or a GPU,
which the CPU merge cannot reproduce bit for bit) is held to the verdict only,
and where such nodes of one kind differ in bits among themselves each is
*undecided* (exit 4: a difference nothing can attribute), not blamed; a graph
the merge cannot rebuild identically, or whose reference does not end pass or
fail, has no reference: differing nodes there are undecided too. A graph that
fails on every node as on the reference is the graph's problem, listed apart
(`consistent_failures`).

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
    from ..store.records import UNIT_FILE
    from ..store.schema import Damaged, check_unit, parse

    try:
        plan = check_unit(parse((unit_dir / UNIT_FILE).read_bytes()), unit_dir.name)
    except (OSError, Damaged):
        return None
    index = plan.get("screen_index")
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def record_landing(unit_dir, node: str, index: int, owner: int):
    from ..store.records import atomic_write

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


def examples_dir(arg: str | None) -> Path | None:
    """The bundled examples a suite includes: the flag's directory, none for 'none', else $GRADCHECK_EXAMPLES
    (the image's) or the source tree's examples/graphs."""
    import os

    if arg == "none":
        return None
    if arg:
        return Path(arg)
    if os.environ.get("GRADCHECK_EXAMPLES"):
        return Path(os.environ["GRADCHECK_EXAMPLES"])
    source_tree = Path(__file__).resolve().parents[2] / "examples" / "graphs"
    return source_tree if source_tree.is_dir() else None


def build_suite(dest: Path, examples: Path | None, generated: int, size: int, seed: int) -> None:
    """The screening suite: the examples' top-level graphs and `generated` graphs, identical on every node
    (and in the merge, which rebuilds it to run the reference)."""
    import shutil

    from gradcheck_core.graphio import SUFFIXES

    from .generate import write_graphs

    if examples is not None:
        if not examples.is_dir():
            raise OptionError(f"not a directory: {examples}", field="--examples")
        (dest / "examples").mkdir(parents=True)
        for f in sorted(examples.iterdir()):
            if f.suffix in SUFFIXES and f.is_file():
                shutil.copyfile(f, dest / "examples" / f.name)
    if generated:
        write_graphs(dest / "generated", generated, size=size, seed=seed)


def numerics(device: str | None = "cpu") -> dict:
    """What decides a CPU engine's bits besides the code: the machine, NumPy and the SIMD kernels it
    dispatches to on this CPU, the BLAS and the kernel it chose. Two healthy hosts with the same numerics run
    the same instructions on the same inputs and agree to the bit; hosts that differ here may differ in the
    last bits without either being wrong."""
    import platform

    import numpy as np

    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    import os

    blas = "unknown"
    try:
        from threadpoolctl import threadpool_info

        # NumPy's own BLAS (numpy/ or numpy.libs/), the one the engine calls: another library's (SciPy's
        # bundled OpenBLAS, loaded by scipy.special) may be loaded or not, and changes no bit of ours
        ours = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(np.__file__))), "numpy")
        blas = "; ".join(sorted(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
                                for i in threadpool_info() if i.get("user_api") == "blas"
                                and os.path.realpath(i.get("filepath") or "").startswith(ours))) or "none"
    except ImportError:
        pass
    return {"device": device or "cpu", "machine": platform.machine(), "numpy": np.__version__,
            "simd": sorted(f for f in __cpu_dispatch__ if __cpu_features__.get(f)), "blas": blas}


REFERENCE_STATUSES = ("pass", "fail")  # a reference that timed out, erred or was refused is no reference


def reference(plans: list[dict], dtypes: set) -> dict:
    """The merge's own verification of the screen's suite: rebuilt from what the units recorded (each graph
    checked against the sha256 they hashed), verified in this process on the CPU with the screen's options,
    no fault planted, once per dtype the nodes ran. Returns {"records": {(graph, dtype): outcome}, "numerics",
    "host", "unavailable": {graph: why}}: the independent answer every node is held to."""
    import socket
    import tempfile

    from ..limits import LIMIT_SPECS, ServerLimits
    from ..store.records import file_sha256
    from .verifiers import InfraError, LocalVerifier, decode

    out = {"records": {}, "numerics": numerics("cpu"), "host": socket.gethostname(), "unavailable": {}}
    suites = {json.dumps(p.get("suite"), sort_keys=True) for p in plans}
    if len(suites) != 1 or not plans[0].get("suite"):
        why = "the units recorded no suite" if not plans or not plans[0].get("suite") else "units ran other suites"
        out["unavailable"] = {g: why for p in plans for g in p["graphs"]}
        return out
    plan = min(plans, key=lambda p: (bool(p["options"].get("faults")), p["unit"]))  # a unit without a fault
    suite = dict(plans[0]["suite"])
    recorded = Path(suite["examples"]) if suite["examples"] else None
    suite["examples"] = recorded if recorded is None or recorded.is_dir() else examples_dir(None)
    keyed = plan["keyed_options"]
    limits = ServerLimits.from_flags({k: v for k, v in keyed.items() if k in LIMIT_SPECS})
    with tempfile.TemporaryDirectory(prefix="gradcheck-reference-") as tmp:
        try:
            build_suite(Path(tmp), **suite)
        except (OptionError, OSError) as exc:
            out["unavailable"] = {g: f"cannot rebuild the suite: {exc}" for g in plan["graphs"]}
            return out
        for g in plan["graphs"]:
            path = Path(tmp) / g
            if not path.is_file() or file_sha256(path) != plan["contents"].get(g):
                out["unavailable"][g] = "the merge's copy of this suite graph differs from the nodes' (another image?)"
                continue
            for dtype in sorted(dtypes, key=str):
                opts = {**plan["options"], "faults": None, "device": "cpu", "dtype": dtype}
                opts = {k: v for k, v in opts.items() if v is not None}
                try:
                    got = LocalVerifier(opts, limits).verify(decode(path.read_bytes(), str(path)), g, opts,
                                                             float(keyed.get("time_limit", 300.0)))
                except InfraError as exc:
                    got = {"status": "error", "error": str(exc)}
                if got["status"] in REFERENCE_STATUSES:
                    out["records"][(g, dtype)] = got
                else:
                    out["unavailable"][g] = f"the reference itself ended {got['status']}: {got.get('error') or ''}"
    return out


def _signature(r: dict) -> tuple:
    return r["status"], tuple(sorted((r.get("digests") or {}).items()))


def _why(r: dict, ref: dict) -> str:
    if r["status"] != ref["status"]:
        detail = r.get("error") or _first_finding(r) or ""
        return f"{r['status']} where the reference got {ref['status']}" + (f": {detail}" if detail else "")
    mine, theirs = r.get("digests") or {}, ref.get("digests") or {}
    params = sorted(p for p in set(mine) | set(theirs) if mine.get(p) != theirs.get(p))
    return (f"gradient of {', '.join(params)} differs bit for bit from the reference"
            f" ({r.get('digest_scope') or 'full'} comparison)")


def _first_finding(r: dict) -> str:
    findings = (r.get("report") or {}).get("findings") or []
    if not findings:
        return ""
    f = findings[0]
    return f"node '{f.get('node')}' {f.get('cause')}"


def _judge(rs: list[dict], ref: dict | None, bits: set, why_none: str) -> tuple[list, list]:
    """One group's nodes held to the reference: (disagreeing records with a reason, undecided ones). A
    verdict other than the reference's is named; so are other bits where the node's numerics are the
    reference's. Where they are not (another CPU kind, a GPU), different bits among nodes of one kind are
    undecided: nothing says which is right."""
    bad, undecided, rest = [], [], defaultdict(list)
    for r in rs:
        if ref is not None and r["status"] != ref["status"]:
            bad.append((r, _why(r, ref)))
        elif ref is not None and r["node"] in bits:
            if _signature(r) != _signature(ref):
                bad.append((r, _why(r, ref)))
        else:
            rest[r["kind"]].append(r)
    for kind_rs in rest.values():
        if len({_signature(r) for r in kind_rs}) > 1:
            why = why_none if ref is None else "no reference of its kind (the merge's numerics differ)"
            undecided += [(r, f"{len({_signature(x) for x in kind_rs})} different answers among {len(kind_rs)} "
                              f"node(s) of one kind, and {why}") for r in kind_rs]
    return bad, undecided


def compare(records: list[dict], reference: dict | None = None, node_numerics: dict | None = None) -> dict:
    """Every node's records held to the reference (reference() above), never to a vote among nodes."""
    reference = reference or {"records": {}, "numerics": None, "unavailable": {}}
    node_numerics = node_numerics or {}
    groups = defaultdict(list)
    for r in records:
        kind = json.dumps(node_numerics.get(r["node"]), sort_keys=True)
        groups[(r["graph"], r.get("device"), r.get("dtype"))].append(dict(r, kind=kind))
    disagreements, undecided, consistent_failures = [], [], []
    for (graph, device, dtype), rs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        ref = reference["records"].get((graph, dtype))
        # bit for bit only on the reference's own kind: a CPU node with the merge's numerics
        bits = {r["node"] for r in rs if device == "cpu" and node_numerics.get(r["node"]) == reference["numerics"]}
        why_none = f"no reference for this graph ({reference['unavailable'].get(graph, 'not computed')})"
        bad, unsure = _judge(rs, ref, bits, why_none)
        for r, reason in bad:
            disagreements.append({"node": r["node"], "graph": graph, "device": device, "dtype": dtype,
                                  "status": r["status"], "reason": reason})
        for r, reason in unsure:
            undecided.append({"node": r["node"], "graph": graph, "device": device, "dtype": dtype,
                              "status": r["status"], "reason": reason})
        statuses = {r["status"] for r in rs}
        if not bad and len(statuses) == 1 and statuses != {"pass"} and (ref is None or ref["status"] != "pass"):
            consistent_failures.append({"graph": graph, "device": device, "dtype": dtype, "status": statuses.pop(),
                                        "nodes": sorted(r["node"] for r in rs)})
    per_node = defaultdict(lambda: {"graphs": 0, "disagreements": 0, "devices": set(), "counts": Counter()})
    for r in records:
        per_node[r["node"]]["graphs"] += 1
        per_node[r["node"]]["counts"][r["status"]] += 1
        per_node[r["node"]]["devices"].add(str(r.get("device")))
    for d in disagreements:
        per_node[d["node"]]["disagreements"] += 1
    from ..store.schema import STATUSES

    nodes = {k: {**v, "devices": sorted(v["devices"]),
                 "counts": {s: v["counts"][s] for s in STATUSES if v["counts"][s]}}  # each node's own, in order
             for k, v in sorted(per_node.items())}
    return {"nodes": nodes, "disagreeing_nodes": sorted({d["node"] for d in disagreements}),
            "disagreements": disagreements, "undecided_nodes": sorted({d["node"] for d in undecided}),
            "undecided": undecided, "consistent_failures": consistent_failures,
            "reference": {"host": reference.get("host"), "numerics": reference["numerics"],
                          "graphs": len({g for g, _ in reference["records"]}),
                          "unavailable": reference["unavailable"]}}
