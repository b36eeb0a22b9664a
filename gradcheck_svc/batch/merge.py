"""`gradcheck-svc batch-merge DIR`: one run's records -> one JSON report, JUnit, Markdown.

The question a batch run answers is its current plan: the shard count (the
merge's --shard-count, else the newest unit's) and the graph set with each
graph's content -- read now from the manifest the shards read (--manifest), or
else as the newest unit of that count listed it and each graph's own shard
recorded it. A record counts when it answers that question (the graph's
content, its shard's options and gradcheck version), wherever it lies: a resume
with another shard count reuses nothing by name but converges all the same.
Everything else is *set aside* (superseded, listed once): records of graphs no
longer in the manifest, units made with another shard count, further answers to
a question already answered; records of older bytes are *stale*. A graph with no
answer is *missing* (its shard has not finished under this plan); a graph
answered under the current count in two folders is *duplicated* (copied by
hand). Every file is schema-checked (schema.py): a damaged one is named by its
path and its graph counts as missing. Units (or records) of the current plan
made under different options or versions are *mixed*: refused unless
--allow-mixed. Any of these is exit 4, naming the graphs, files or units, and
so is a run that lists no graphs: nothing verified is not a pass. A screen's
units record the nodes it was meant to cover (--expect-nodes): a listed node
with no unit is *not screened*, a screened node outside the list *unexpected*
(exit 4, named); its counts are per node.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from ..errors import OptionError
from ..text import clip
from . import screen
from .manifest import shard_of
from ..store.location import is_url
from ..store.schema import STATUSES
from ..store.records import LATEST, as_path, has_ended, list_runs, read_run, run_dir, unit_name

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 4


class StoreUnreadable(Exception):
    """The results could not be read (an object store unreachable, a volume gone): the platform's fault,
    exit 75 (batch/cli.py), as for a shard; not the user's, whose DIR is checked separately."""
VERDICTS = {EXIT_OK: "pass", EXIT_FAILED: "fail", EXIT_INCOMPLETE: "incomplete"}


def resolve_run(out: Path, run_id: str | None) -> str:
    """The run to merge: the one given, the newest for 'latest', or the only one."""
    out = as_path(out)
    try:  # an object store answers over the network: it may not answer
        is_dir = out.is_dir()
    except OSError as exc:
        raise StoreUnreadable(f"cannot read results under {out}: {exc.strerror or exc}") from None
    if not is_dir:
        raise OptionError(f"no results under {out}" if is_url(str(out)) else f"not a directory: {out}", field="DIR")
    try:
        runs = list_runs(out)
    except OSError as exc:
        raise StoreUnreadable(f"cannot read results under {out}: {exc.strerror or exc}") from None
    if not runs:
        raise OptionError(f"no batch results in {out} (no runs/*/*/unit.json)", field="DIR")
    if run_id == LATEST:
        return max(runs, key=lambda r: (runs[r], r))
    if run_id is not None:
        if run_id not in runs:
            raise OptionError(f"no run '{run_id[:80]}' in {out}; runs: {_some(sorted(runs))}", field="--run-id")
        return run_id
    if len(runs) > 1:
        raise OptionError(f"{out} holds {len(runs)} runs ({_some(sorted(runs))}): name one, or '{LATEST}'",
                          field="--run-id")
    return next(iter(runs))


def _some(names: list, limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _identity(x: dict) -> tuple:
    return x["options_sha256"], x["gradcheck_version"]


def _node_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(n, str) and n for n in v)


def _newest(units: list):
    return max(units, key=lambda u: (u.plan["started_at"], u.name)) if units else None


def manifest_contents(spec: str) -> tuple[list[str], dict[str, str]]:
    """The graph set and each graph's sha256 now, from the manifest the shards read (batch-merge --manifest):
    the question the run must answer, whatever its units recorded when they ran."""
    from ..store.location import prefetch
    from .manifest import load_manifest
    from ..store.records import file_sha256

    try:
        m = load_manifest(spec, field="--manifest")
        paths = {g: m.path(g) for g in m.graphs}
        prefetch(paths.values())  # an object store: one concurrent batch of GETs
        return list(m.graphs), {g: file_sha256(p) for g, p in paths.items()}
    except OSError as exc:
        raise OptionError(f"cannot read the graphs under {clip(spec, 200)}: {exc.strerror or exc}",
                          field="--manifest") from None


def _of_attempt(units: list, attempt: str | None) -> tuple[list, list]:
    """The units this attempt wrote, and the others (earlier launches: set aside as units; their records count
    only where they answer this attempt's question). Without an attempt (by hand) every unit is this run's."""
    if attempt is None:
        return units, []
    ours = [u for u in units if u.plan.get("attempt") == attempt]
    return ours, [u for u in units if u.plan.get("attempt") != attempt]


def _batch_plan(good: list, shard_count: int | None, manifest: tuple | None, attempt: str | None = None) -> dict:
    """What a batch run must answer now: the shard count (the merge's --shard-count, else the newest unit's),
    the units made with it (current) and the others (superseded: set aside), the graph set and each graph's
    content (the manifest's now, else what each graph's current unit recorded: a graph whose shard has not
    run under this count has no content to answer)."""
    mine, earlier = _of_attempt(good, attempt)
    newest = max(mine, key=lambda u: u.name) if attempt is not None and mine else _newest(good)
    count = shard_count if shard_count is not None else (newest.plan["shard_count"] if newest else 1)
    current = [u for u in mine if u.plan["shard_count"] == count]
    superseded = [u for u in good if u.plan["shard_count"] != count] + [u for u in earlier
                                                                          if u.plan["shard_count"] == count]
    owners = {u.name: u for u in current}
    if manifest is not None:
        expected, contents = manifest
    else:
        listing = (max(current, key=lambda u: u.name) if attempt is not None and current else _newest(current)
                   ) or newest or _newest(good)
        expected = list(listing.plan["graphs"]) if listing else []
        contents = {}
        for g in expected:
            owner = owners.get(unit_name(shard_of(g, count)))
            if owner is not None and g in owner.plan["contents"]:
                contents[g] = owner.plan["contents"][g]
    return {"count": count, "current": current, "superseded": superseded, "owners": owners,
            "expected": expected, "contents": contents, "attempt": attempt}


def _choose_batch(plan: dict, good: list, allow_mixed: bool) -> dict:
    """One record per graph of the current set: a record answering its question (the graph's content now,
    its shard's options and version) wherever it lies -- in its own shard's folder, or in one of another
    shard count (a resume with a new count need not verify it again). Everything else is set aside:
    records of graphs no longer listed, of older bytes (stale), and further answers to the same question."""
    count, owners, contents = plan["count"], plan["owners"], plan["contents"]
    expected = set(plan["expected"])
    # a graph whose shard has no unit of this count is held to the options most of this count's units (else
    # of all units) were made under: never to whatever a record happens to have
    strict = plan["attempt"] is not None  # only this attempt's question; another version's answer is superseded
    common = Counter(_identity(u.plan) for u in plan["current"] or ([] if strict else good)).most_common(1)
    fallback = common[0][0] if common else (NO_ANSWER if strict else None)
    answers, others = defaultdict(list), defaultdict(list)
    stale, set_aside, gone = 0, 0, set()
    for u in good:
        for r in u.records:
            g = r["graph"]
            if g not in expected:
                gone.add(g)
                set_aside += 1
            elif g not in contents:
                set_aside += 1  # its shard has not run under this count: nothing says what it must answer
            elif r["graph_sha256"] != contents[g]:
                stale += 1  # made for other bytes of this graph: answers nothing asked now
            else:
                owner = owners.get(unit_name(shard_of(g, count)))
                target = _identity(owner.plan) if owner is not None else fallback
                if target is None or _identity(r) == target:
                    answers[g].append((u.name, r))
                elif strict:
                    set_aside += 1  # another version or options than this attempt's: superseded, never merged
                else:
                    others[g].append((u.name, r))
    records, duplicates, other = [], [], []
    for g in sorted(answers):
        found = answers[g]
        here = sorted({name for name, r in found if r["shard_count"] == count})
        if len(here) > 1:  # made under this count in two folders: copied, or two runs mixed by hand
            duplicates.append({"graph": g, "units": here})
        mine = [(name, r) for name, r in found if name == unit_name(shard_of(g, count))]
        records.append(max(mine or found, key=lambda nr: nr[1]["finished_at"])[1])
        set_aside += len(found) - 1
    for g in sorted(set(others) - set(answers)):
        if allow_mixed:
            records.append(max((r for _, r in others[g]), key=lambda r: r["finished_at"]))
        else:
            other += [{"graph": g, "unit": name, "node": r["node"]} for name, r in others[g]]
    set_aside += sum(len(rs) for g, rs in others.items() if g in answers)  # answered under this run's options too
    return {"records": records, "duplicates": duplicates, "other": other, "stale": stale,
            "superseded": {"graphs": sorted(gone), "records": set_aside,
                           "units": [_set_aside_unit(u, plan) for u in sorted(plan["superseded"],
                                                                                 key=lambda u: u.name)]}}


NO_ANSWER = ("", "")  # the identity no record has: an attempt none of whose units has started yet


def _set_aside_unit(u, plan: dict) -> dict:
    entry = {"unit": u.name, "shard_count": u.plan["shard_count"]}
    if plan["attempt"] is not None and u.plan["shard_count"] == plan["count"]:
        entry["attempt"] = u.plan.get("attempt")  # an earlier launch's unit, not yet rewritten by this one
    return entry


def _mode(good: list, shard_count, manifest, expect_nodes) -> str:
    """The run's mode, "batch" or "screen" (one of them, not both), and the merge options that fit it."""
    modes = {u.plan["mode"] for u in good}
    if len(modes) > 1:
        raise OptionError(f"mixes batch and screen results ({', '.join(sorted(modes))}); merge them apart",
                          field="DIR")
    mode = modes.pop() if modes else "batch"
    if mode == "screen" and shard_count is not None:
        raise OptionError("applies to a batch; this run is a screen", field="--shard-count")
    if mode == "screen" and manifest is not None:
        raise OptionError("applies to a batch; this run is a screen (its suite is recorded)", field="--manifest")
    if mode == "batch" and expect_nodes is not None:
        raise OptionError("applies to a screen; this run is a batch", field="--expect-nodes")
    return mode


def _collect_batch(good: list, shard_count, manifest, allow_mixed: bool, attempt: str | None = None):
    """A batch's current units, expected graphs, shard count, inconsistent units, chosen records and
    missing graphs."""
    plan = _batch_plan(good, shard_count, manifest_contents(manifest) if manifest is not None else None, attempt)
    chosen = _choose_batch(plan, good, allow_mixed)
    current, expected, count = plan["current"], plan["expected"], plan["count"]
    inconsistent = [u.name for u in current if not _node_list(u.plan.get("expected_nodes") or [])]
    answered = {r["graph"] for r in chosen["records"]} | {o["graph"] for o in chosen["other"]}
    missing = [{"graph": g, "shard": shard_of(g, count)} for g in expected if g not in answered]
    return current, expected, count, inconsistent, chosen, missing


def _collect_screen(good: list, units: list, rdir: Path, allow_mixed: bool, expect_nodes):
    """A screen's expected graphs, inconsistent units, chosen records (with their duplicates), missing
    (graph, node) pairs and the account of its nodes."""
    expected, inconsistent, chosen = _choose_screen(good, allow_mixed)
    where = defaultdict(list)  # (graph, node) -> the units holding a record of it
    for r in chosen["records"]:
        where[(r["graph"], r["node"])].append(r["unit_dir"])
    # answered only under other options: named as such, not again as missing
    waiting = {(o["graph"], o["node"]) for o in chosen["other"]}
    nodes = sorted({u.plan["node"] for u in good})
    missing = [{"graph": g, "node": n} for n in nodes for g in expected
               if (g, n) not in where and (g, n) not in waiting]
    chosen["duplicates"] = [{"graph": g, "node": n, "units": u} for (g, n), u in sorted(where.items())
                            if len(u) > 1]
    for r in chosen["records"]:
        del r["unit_dir"]
    # the nodes meant to be screened: what every unit recorded at launch, and the merge's --expect-nodes
    intended = set(expect_nodes or [])
    for u in good:
        if _node_list(u.plan.get("expected_nodes")):
            intended |= set(u.plan["expected_nodes"])
    screen_nodes = {"expected": sorted(intended), "screened": nodes,
                    "unscreened": sorted(intended - set(nodes)),
                    "unexpected": sorted(set(nodes) - intended) if intended else [],
                    "landings": screen.read_landings(rdir, [u.name for u in units])}
    return expected, inconsistent, chosen, missing, screen_nodes


def collect(out: Path, run_id: str | None = None, allow_mixed: bool = False, shard_count: int | None = None,
            expect_nodes: list[str] | None = None, manifest: str | None = None, attempt: str | None = None) -> dict:
    run = resolve_run(out, run_id)
    rdir = run_dir(out, run)
    try:
        units = read_run(rdir)
    except OSError as exc:
        raise StoreUnreadable(f"cannot read results under {rdir}: {exc.strerror or exc}") from None
    good = [u for u in units if u.plan is not None]
    damaged = [{"file": str(path), "reason": reason} for u in units for path, reason in u.damaged]
    mode = _mode(good, shard_count, manifest, expect_nodes)
    if mode == "batch":
        current, expected, count, inconsistent, chosen, missing = _collect_batch(good, shard_count, manifest,
                                                                                 allow_mixed, attempt)
        for i in missing:
            i["why"] = why_missing(rdir / unit_name(i["shard"]), attempt)
        screen_nodes = None
    else:
        good, earlier = _of_attempt(good, attempt)
        current, count = good, 1
        expected, inconsistent, chosen, missing, screen_nodes = _collect_screen(good, units, rdir, allow_mixed,
                                                                                expect_nodes)
        chosen["superseded"]["units"] = [{"unit": u.name, "shard_count": 1, "attempt": u.plan.get("attempt")}
                                         for u in earlier]
    identities = defaultdict(list)  # (options, version) -> the current units made under it
    for u in current:
        identities[_identity(u.plan)].append(u.name)
    keyed = {_identity(u.plan): u.plan["keyed_options"] for u in current}
    first = (_newest(current) or _newest(good))
    first = first.plan if first else {}
    mixed = [] if len(identities) < 2 else [
        {"options_sha256": o, "gradcheck_version": v, "keyed_options": keyed[(o, v)], "units": sorted(names)}
        for (o, v), names in sorted(identities.items(), key=lambda kv: sorted(kv[1]))]
    other = sorted({(o["graph"], o["unit"]): o for o in chosen["other"]}.values(),
                   key=lambda o: (o["graph"], o["unit"]))
    return {"mode": mode, "directory": str(out), "run_id": run, "run_directory": str(rdir), "attempt": attempt,
            "graphs": len(expected), "units": [u.name for u in units], "shard_count": count,
            "manifest": manifest,
            "records": sorted(chosen["records"], key=lambda r: (r["graph"], r["node"] or "")),
            "missing": missing, "duplicates": chosen["duplicates"], "unexpected": [],
            "superseded": chosen["superseded"],
            "inconsistent_units": inconsistent, "damaged": damaged, "stale_records": chosen["stale"],
            "other_options": other, "mixed": mixed,
            "allow_mixed": allow_mixed, "nodes": screen_nodes,
            "options": first.get("keyed_options") if len(identities) == 1 else None,
            "gradcheck_version": first.get("gradcheck_version") if len(identities) == 1 else None,
            "_plans": [u.plan for u in good]}  # for a screen's reference; not part of the report


def _choose_screen(good: list, allow_mixed: bool):
    """A screen's units are its nodes, each meant to run the same suite: the first unit's suite is the
    question, a unit that recorded another one (or other content) is inconsistent. Per node, the record under
    its own unit's options; one under other options only with --allow-mixed."""
    first = good[0].plan if good else {"graphs": []}
    expected = list(first["graphs"])
    expected_set = set(expected)
    contents, inconsistent = {}, []
    for u in good:
        p = u.plan
        clash = any(contents.setdefault(g, sha) != sha for g, sha in p["contents"].items())
        if p["graphs"] != first["graphs"] or clash or not _node_list(p.get("expected_nodes") or []):
            inconsistent.append(u.name)
    records, other, stale, set_aside, gone = [], [], 0, 0, set()
    for u in good:
        mine, candidates = {}, defaultdict(list)
        for r in u.records:
            g = r["graph"]
            if g not in expected_set:
                gone.add(g)
                set_aside += 1
            elif r["graph_sha256"] != contents.get(g):
                stale += 1
            elif _identity(r) == _identity(u.plan):
                mine[g] = r
            else:
                candidates[g].append(r)
        for g, rs in candidates.items():
            if g in mine:
                set_aside += len(rs)  # answered under this unit's options too; the older answer is superseded
            elif allow_mixed:
                mine[g] = max(rs, key=lambda r: r["finished_at"])
            else:
                other.append({"graph": g, "unit": u.name, "node": u.plan["node"]})
        records += [dict(r, unit_dir=u.name) for r in mine.values()]
    return expected, inconsistent, {"records": records, "other": other, "stale": stale,
                                    "superseded": {"graphs": sorted(gone), "records": set_aside, "units": []}}


def merge(out: Path, run_id: str | None = None, allow_mixed: bool = False, shard_count: int | None = None,
          expect_nodes: list[str] | None = None, manifest: str | None = None, attempt: str | None = None) -> dict:
    """The merged report (a JSON-able dict) with `exit_code` set."""
    m = collect(out, run_id, allow_mixed, shard_count, expect_nodes, manifest, attempt)
    plans = m.pop("_plans")
    records = m["records"]
    m["counts"] = {s: sum(r["status"] == s for r in records) for s in STATUSES} | {"missing": len(m["missing"])}
    m["passed"] = [_label(r, m["mode"]) for r in records if r["status"] == "pass"]
    m["failed"] = [_label(r, m["mode"]) for r in records if r["status"] != "pass"]
    nodes = m["nodes"] or {}
    if m["mode"] == "screen":
        # the reference is the merge's own verification of the suite, not a vote among the nodes
        ref = screen.reference(plans, {r.get("dtype") for r in records}) if records else None
        m["screen"] = screen.compare(records, ref, {p["node"]: p.get("numerics") for p in plans})
        for i in m["missing"]:  # per node: a node's count says what that node answered, not the sum of all nodes
            per = m["screen"]["nodes"].setdefault(i["node"], {"graphs": 0, "disagreements": 0, "devices": [],
                                                                "counts": {}})
            per["counts"]["missing"] = per["counts"].get("missing", 0) + 1
    incomplete = (m["missing"] or m["duplicates"] or m["unexpected"] or m["inconsistent_units"] or m["damaged"]
                  or m["other_options"] or (m["mixed"] and not allow_mixed) or not m["graphs"]
                  or nodes.get("unscreened") or nodes.get("unexpected")
                  or (m["mode"] == "screen" and m["screen"]["undecided"]))
    if incomplete:
        m["exit_code"] = EXIT_INCOMPLETE
    elif m["mode"] == "screen":  # a screen asks "which node disagrees"; a graph failing everywhere is listed
        m["exit_code"] = EXIT_FAILED if m["screen"]["disagreeing_nodes"] else EXIT_OK
    else:
        m["exit_code"] = EXIT_FAILED if m["failed"] else EXIT_OK
    m["verdict"] = VERDICTS[m["exit_code"]]
    return m


def _label(r: dict, mode: str) -> str:
    return f"{r['node']}: {r['graph']}" if mode == "screen" else r["graph"]


def problems(m: dict, limit: int = 10) -> list[str]:
    """One line per kind of incompleteness (and one per damaged file), naming up to `limit` of each."""
    def names(items, fmt):
        shown = ", ".join(fmt(i) for i in items[:limit])
        return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")

    lines = [f"damaged result file {d['file']}: {d['reason']}" for d in m["damaged"][:limit]]
    if len(m["damaged"]) > limit:
        lines.append(f"{len(m['damaged']) - limit} more damaged result files (merged.json lists them)")
    if not m["graphs"]:
        lines.append("no graphs: no readable unit.json lists any, so nothing was verified")
    if m["missing"]:
        lines.append(f"{len(m['missing'])} graph result(s) missing: " + names(
            m["missing"], lambda i: f"{i['graph']} ({_where(i)})"))
        whys = defaultdict(int)
        for i in m["missing"]:
            if i.get("why"):
                whys[(i["shard"], i["why"])] += 1
        if whys:
            lines.append("why missing: " + "; ".join(f"shard {shard} ({n} graph(s)): {why}"
                                                     for (shard, why), n in sorted(whys.items())[:limit]))
    if m["duplicates"]:
        lines.append(f"{len(m['duplicates'])} graph(s) present twice: " + names(
            m["duplicates"], lambda i: f"{i['graph']} ({', '.join(i['units'])})"))
    if m["unexpected"]:
        lines.append(f"{len(m['unexpected'])} result(s) for graphs outside the manifest: " + names(
            m["unexpected"], str))
    if m["inconsistent_units"]:
        lines.append("units recorded a different manifest, shard count or graph content: "
                     + names(m["inconsistent_units"], str))
    if m["mixed"]:
        verb = "merged anyway (--allow-mixed)" if m["allow_mixed"] else "refused (--allow-mixed merges them)"
        lines.append(f"results made under different options or gradcheck versions, {verb}: "
                     + "; ".join(f"{', '.join(i['units'][:limit])}: {_identity_text(i)}" for i in m["mixed"])
                     + _differences(m["mixed"]))
    nodes = m.get("nodes") or {}
    if nodes.get("unscreened"):
        lines.append(f"{len(nodes['unscreened'])} of {len(nodes['expected'])} expected node(s) not screened (no "
                     "unit.json in this run): " + names(nodes["unscreened"], str))
    if nodes.get("unexpected"):
        lines.append(f"{len(nodes['unexpected'])} node(s) screened but not in the expected list: "
                     + names(nodes["unexpected"], str))
    undecided = (m.get("screen") or {}).get("undecided") or []
    if undecided:
        lines.append(f"{len(undecided)} node result(s) undecided (a difference with nothing to tell which side is "
                     "right): " + names(undecided, lambda d: f"{d['node']} on {d['graph']}: {d['reason']}"))
    if m["other_options"]:
        lines.append(f"{len(m['other_options'])} graph(s) answered only under other options or another version "
                     "(re-run their shard, or --allow-mixed): "
                     + names(m["other_options"], lambda i: f"{i['graph']} ({i['unit']})"))
    return lines


def notes(m: dict, limit: int = 10) -> list[str]:
    """What the merge saw that is not a gap in the results: what it set aside (superseded), indexes refused
    on a node already screened."""
    out = []
    sup = m.get("superseded") or {}
    parts = []
    if sup.get("graphs"):
        parts.append(f"records of {len(sup['graphs'])} graph(s) no longer in the manifest: "
                     + _some(sup["graphs"], limit))
    counts = [u for u in sup.get("units") or [] if "attempt" not in u]
    launches = [u for u in sup.get("units") or [] if "attempt" in u]
    if counts:
        parts.append(f"{len(counts)} unit(s) made with another shard count than {m['shard_count']}: "
                     + _some([f"{u['unit']} ({u['shard_count']} shards)" for u in counts], limit))
    if launches:
        parts.append(f"{len(launches)} unit(s) of an earlier launch than attempt {m.get('attempt')}: "
                     + _some([f"{u['unit']} (attempt {u['attempt']})" for u in launches], limit))
    if sup.get("records"):
        parts.append(f"{sup['records']} record(s) in all, none of them counted")
    if parts:
        out.append("set aside (superseded): " + "; ".join(parts))
    lands = (m.get("nodes") or {}).get("landings") or []
    if lands:
        shown = ", ".join(f"{i['node']} (index {i['index']}; screened by index {i['screened_by']})"
                          for i in lands[:limit])
        more = f" and {len(lands) - limit} more" if len(lands) > limit else ""
        out.append(f"{len(lands)} retried pod(s) landed on a node already screened, were refused there and retried "
                   f"elsewhere: {shown}{more}")
    return out


def per_node_summary(m: dict, limit: int = 20) -> str:
    """A screen's counts per node ("node-a: 9 pass; node-b: 8 pass, 1 fail"), never summed across nodes."""
    nodes = m["screen"]["nodes"]
    parts = [f"{n}: " + (", ".join(f"{v} {k}" for k, v in c["counts"].items() if v) or "no results")
             for n, c in list(nodes.items())[:limit]]
    parts += [f"{n}: not screened" for n in (m.get("nodes") or {}).get("unscreened", [])[:limit]]
    more = len(nodes) - limit
    return "; ".join(parts) + (f"; and {more} more node(s) (merged.json)" if more > 0 else "")


def summary_line(m: dict) -> str:
    """The counts of the merge's last line and verdict: per graph for a batch, per node for a screen."""
    if m["mode"] == "screen":
        n = m.get("nodes") or {}
        expected = f" of {len(n['expected'])} expected" if n.get("expected") else ""
        bad = m["screen"]["disagreeing_nodes"]  # first: the per-node counts are cut after 20 nodes, these never
        named = f"{len(bad)} node(s) disagree: {_some(bad, 50)}; " if bad else ""
        return (f"{named}{m['graphs']} graphs on each of {len(n.get('screened', []))}{expected} node(s): "
                + (per_node_summary(m) or "no results"))
    counts = ", ".join(f"{v} {k}" for k, v in m["counts"].items() if v) or "no results"
    return f"{m['graphs']} graphs: {counts}"


def _identity_text(i: dict) -> str:
    return f"options {i['options_sha256'][:12]}, gradcheck {i['gradcheck_version']}"


def _differences(groups: list[dict]) -> str:
    """Which options (or the version) differ between the groups: what to look at first."""
    keys = sorted({k for g in groups for k in g["keyed_options"]})
    diff = [k for k in keys if len({repr(g["keyed_options"].get(k)) for g in groups}) > 1]
    if len({g["gradcheck_version"] for g in groups}) > 1:
        diff.append("gradcheck version")
    return f" (they differ in: {', '.join(diff)})" if diff else ""


def _where(missing: dict) -> str:
    return f"node {missing['node']}" if "node" in missing else f"shard {missing['shard']}"


def outcomes(m: dict):
    """The client CLI's Outcome per record and per missing graph, for its JUnit and Markdown writers."""
    from gradcheck_core.outputs.outcome import Outcome
    from gradcheck_core.report import Report

    out = []
    for r in m["records"]:
        label = _label(r, m["mode"])
        if r["status"] in ("pass", "fail") and r.get("report"):
            out.append(Outcome(label, report=Report(r["report"]), seconds=r.get("seconds", 0.0)))
        else:
            invalid = r["status"] == "invalid"  # its own column says "invalid"; timeout/error say which
            error = (r.get("error") or "") if invalid else f"{r['status']}: {r.get('error') or ''}"
            out.append(Outcome(label, error=error, invalid=invalid, seconds=r.get("seconds", 0.0)))
    for i in m["missing"]:
        label = f"{i['node']}: {i['graph']}" if "node" in i else i["graph"]
        out.append(Outcome(label, error=f"missing: no result from {_where(i)}"))
    for n in (m.get("nodes") or {}).get("unscreened", []):
        out.append(Outcome(f"{n}: (every graph)", error=f"not screened: node {n} was expected and left no result"))
    return out


def markdown(m: dict, outs) -> str:
    # node names, graph paths, devices and reasons echo user input: each one an inert code span
    from gradcheck_core.outputs.guard import markdown_text
    from gradcheck_core.outputs.markdown import code

    c = m["counts"]
    head = [f"## gradcheck {m['mode']}: {m['graphs']} graphs, {len(m['units'])} units", "",
            code(summary_line(m), 2000, table=False) if m["mode"] == "screen"  # per node, not summed over nodes
            else ", ".join(f"{v} {k}" for k, v in c.items() if v) or "no results", ""]
    head += [f"**Incomplete:** {code(line, 600, table=False)}" for line in problems(m)]
    head += [""] if problems(m) else []
    if m["mode"] == "screen":
        s = m["screen"]
        head += ["### Nodes", "", "| Node | Devices | Graphs | Results | Disagreements |", "|---|---|---|---|---|"]
        head += [f"| {code(n)} | {code(', '.join(v['devices']))} | {v['graphs']} | "
                 f"{', '.join(f'{c} {k}' for k, c in v['counts'].items() if c) or 'none'} | {v['disagreements']} |"
                 for n, v in s["nodes"].items()]
        head += [f"| {code(n)} | | 0 | not screened | |" for n in (m.get("nodes") or {}).get("unscreened", [])]
        head += [f"*Note:* {code(line, 600, table=False)}" for line in notes(m)]
        head += ["", "**Disagreeing nodes:** " + (", ".join(code(n, table=False) for n in s["disagreeing_nodes"])
                                                  or "none"),
                 ""]
        head += [f"- {code(d['node'], table=False)} on {code(d['graph'], table=False)}: "
                 f"{code(d['reason'], 300, table=False)}" for d in s["disagreements"][:50]]
        head += [f"- every node fails {code(f['graph'], table=False)} ({code(f['status'], 20, table=False)}): "
                 "the graph, not a node"
                 for f in s["consistent_failures"]] + [""]
    return "\n".join(head) + "\n" + markdown_text(outs)


def settled(out, run_id: str | None, shard_count: int | None = None, expect_nodes: list[str] | None = None,
            attempt: str | None = None, watch=None) -> bool:
    """Whether a merge waiting on a running batch or screen (batch-merge --wait) has nothing left to wait for:
    every shard of the run's count (a screen: every intended node) has ended its last attempt -- finished, or
    failed for good (store.has_ended; a screen node only when screened; with an attempt, only that attempt's
    endings count, and a last try whose heartbeat stopped without one has ended too: `watch`, attempt.py).
    Reads only unit.json, ended.json and alive.json files; a run not written yet, or a store that does not
    answer, is not settled."""
    from .attempt import refusal

    try:
        rdir = run_dir(out, resolve_run(out, run_id))
        if refusal(rdir, attempt):  # this launch was refused while another holds the run: nothing to wait for
            return True
        plans = _plans_of(rdir, attempt)
    except (OptionError, OSError):
        return False
    if not plans:
        plans = [{"mode": "batch"}] if attempt is not None and shard_count is not None else []
    if not plans:
        return False
    if plans[0]["mode"] == "screen":
        intended = set(expect_nodes or [])
        for p in plans:
            if _node_list(p.get("expected_nodes")):
                intended |= set(p["expected_nodes"])
        return bool(intended) and all(has_ended(rdir / unit_name(node=n), True, attempt) for n in intended)
    newest = max(plans, key=lambda p: str(p.get("started_at", "")))  # (with an attempt, all of its own)
    count = shard_count if shard_count is not None else newest.get("shard_count")
    return isinstance(count, int) and all(_index_ended(rdir / unit_name(i), attempt, watch) for i in range(count))


def _plans_of(rdir, attempt: str | None) -> list[dict]:
    from ..store.schema import Damaged, parse
    from ..store.records import UNIT_FILE

    plans = []
    for u in rdir.iterdir():
        if (u / UNIT_FILE).is_file():
            try:
                plans.append(parse((u / UNIT_FILE).read_bytes()))
            except Damaged:
                continue
    return [p for p in plans if isinstance(p, dict) and p.get("mode") in ("batch", "screen")
            and (attempt is None or p.get("attempt") == attempt)]


def _index_ended(unit_dir, attempt: str | None, watch) -> bool:
    from .attempt import ALIVE_FILE, ended_by, read_json, refused_unit

    if has_ended(unit_dir, attempt=attempt) or refused_unit(unit_dir.parent, attempt, unit_dir.name):
        return True
    if attempt is None or watch is None:
        return False
    alive = read_json(unit_dir / ALIVE_FILE)  # the last try's heartbeat stopped and no ending followed: SIGKILL
    return (alive is not None and alive.get("attempt") == attempt and alive.get("last_try") is True
            and not ended_by(unit_dir, attempt) and watch.quiet(unit_dir, alive))


def why_missing(unit_dir, attempt: str | None) -> str:
    """Why a shard left a graph without an answer, in words from its own markers."""
    from .attempt import ALIVE_FILE, ENDED_FILE, REFUSED, read_json

    ended, alive = read_json(unit_dir / ENDED_FILE), read_json(unit_dir / ALIVE_FILE)
    refused = read_json(unit_dir.parent / REFUSED.format(attempt, unit_dir.name)) if attempt is not None else None
    if refused is not None and not (ended is not None and ended.get("attempt") == attempt):
        return f"refused: {refused.get('refused')}"
    if ended is not None and (attempt is None or ended.get("attempt") == attempt):
        said = f": {ended['error']}" if ended.get("error") else ""
        if ended.get("exit") == 0:
            return ("its shard finished (exit 0), yet no record answers the graph as it is now: changed or listed "
                    "since, or its record removed; re-run the shard")
        last = "its last try" if ended.get("final") else "a try (to be retried)"
        return f"{last} ended with exit {ended.get('exit')}{said}"
    if alive is not None and alive.get("attempt") == attempt and attempt is not None:
        return ("its last try stopped without an ending (SIGKILL: out of memory, or its node lost)"
                if alive.get("last_try") else "still running, or killed and not yet retried")
    return f"not started under attempt {attempt}" if attempt is not None else "not ended"


def partial(m: dict, limit: int = 10) -> str | None:
    """An incomplete batch's report, in one line: what passed, what failed, what is missing."""
    if m["mode"] != "batch" or m["exit_code"] != EXIT_INCOMPLETE:
        return None
    return (f"partial report: {len(m['passed'])} passed ({_some(m['passed'], limit) or 'none'}); "
            f"{len(m['failed'])} failed ({_some(m['failed'], limit) or 'none'}); "
            f"{len(m['missing'])} missing ({_some([i['graph'] for i in m['missing']], limit) or 'none'})")
