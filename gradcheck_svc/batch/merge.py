"""`gradcheck-svc batch-merge DIR`: every unit's records -> one JSON report, JUnit, Markdown.

Completeness is checked against the manifest each unit recorded in its
unit.json: a graph with no record is *missing* (its shard never finished),
a graph with records in two units is *duplicated* (two runs with different
shard counts wrote into one directory), a record for a graph outside the
manifest is *unexpected*. Any of these is exit 4, naming the graphs.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..errors import OptionError
from . import screen
from .manifest import shard_of
from .runner import STATUSES
from .store import read_units

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 4


def collect(out: Path) -> dict:
    out = Path(out)
    if not out.is_dir():
        raise OptionError(f"not a directory: {out}", field="DIR")
    try:
        units = list(read_units(out))
    except (OSError, ValueError) as exc:  # ValueError: a unit.json or record that is not JSON
        raise OptionError(f"cannot read results under {out}: {getattr(exc, 'strerror', None) or exc}",
                          field="DIR") from None
    if not units:
        raise OptionError(f"no batch results in {out} (no */unit.json)", field="DIR")
    modes = {plan["mode"] for _, plan, _ in units}
    if len(modes) > 1:
        raise OptionError(f"mixes batch and screen results ({', '.join(sorted(modes))}); merge them apart",
                          field="DIR")
    mode = modes.pop()
    first = units[0][1]
    expected = first["graphs"]
    inconsistent = [name for name, plan, _ in units
                    if plan["graphs"] != expected or plan["shard_count"] != first["shard_count"]]
    expected_set = set(expected)
    records = [r for _, _, rs in units for r in rs]
    where = defaultdict(list)  # graph -> the unit directories holding a record of it
    for name, _, rs in units:
        for r in rs:
            where[(r["graph"], r["node"]) if mode == "screen" else r["graph"]].append(name)
    if mode == "screen":
        nodes = sorted({plan["node"] for _, plan, _ in units})
        missing = [{"graph": g, "node": n} for n in nodes for g in expected if (g, n) not in where]
        duplicates = [{"graph": g, "node": n, "units": u} for (g, n), u in sorted(where.items()) if len(u) > 1]
    else:
        count = first["shard_count"]
        missing = [{"graph": g, "shard": shard_of(g, count)} for g in expected if g not in where]
        duplicates = [{"graph": g, "units": sorted(u)} for g, u in sorted(where.items()) if len(u) > 1]
    unexpected = sorted({r["graph"] for r in records if r["graph"] not in expected_set})
    return {"mode": mode, "directory": str(out), "graphs": len(expected), "units": [u[0] for u in units],
            "shard_count": first["shard_count"],
            "records": sorted(records, key=lambda r: (r["graph"], r["node"] or "")),
            "missing": missing, "duplicates": duplicates, "unexpected": unexpected,
            "inconsistent_units": inconsistent}


def merge(out: Path) -> dict:
    """The merged report (a JSON-able dict) with `exit_code` set."""
    m = collect(out)
    records = m["records"]
    m["counts"] = {s: sum(r["status"] == s for r in records) for s in STATUSES} | {"missing": len(m["missing"])}
    m["failed"] = [_label(r, m["mode"]) for r in records if r["status"] != "pass"]
    if m["mode"] == "screen":
        m["screen"] = screen.compare(records)
    incomplete = m["missing"] or m["duplicates"] or m["unexpected"] or m["inconsistent_units"]
    if incomplete:
        m["exit_code"] = EXIT_INCOMPLETE
    elif m["mode"] == "screen":  # a screen asks "which node disagrees"; a graph failing everywhere is listed
        m["exit_code"] = EXIT_FAILED if m["screen"]["disagreeing_nodes"] else EXIT_OK
    else:
        m["exit_code"] = EXIT_FAILED if m["failed"] else EXIT_OK
    return m


def _label(r: dict, mode: str) -> str:
    return f"{r['node']}: {r['graph']}" if mode == "screen" else r["graph"]


def problems(m: dict, limit: int = 10) -> list[str]:
    """One line per kind of incompleteness, naming up to `limit` graphs."""
    def names(items, fmt):
        shown = ", ".join(fmt(i) for i in items[:limit])
        return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")

    lines = []
    if m["missing"]:
        lines.append(f"{len(m['missing'])} graph result(s) missing: " + names(
            m["missing"], lambda i: f"{i['graph']} ({_where(i)})"))
    if m["duplicates"]:
        lines.append(f"{len(m['duplicates'])} graph(s) present twice: " + names(
            m["duplicates"], lambda i: f"{i['graph']} ({', '.join(i['units'])})"))
    if m["unexpected"]:
        lines.append(f"{len(m['unexpected'])} result(s) for graphs outside the manifest: " + names(
            m["unexpected"], str))
    if m["inconsistent_units"]:
        lines.append("units recorded a different manifest or shard count: " + names(m["inconsistent_units"], str))
    return lines


def _where(missing: dict) -> str:
    return f"node {missing['node']}" if "node" in missing else f"shard {missing['shard']}"


def outcomes(m: dict):
    """The client CLI's Outcome per record and per missing graph, for its JUnit and Markdown writers."""
    from gradcheck_client.outputs.outcome import Outcome
    from gradcheck_client.report import Report

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
    return out


def markdown(m: dict, outs) -> str:
    # node names, graph paths, devices and reasons echo user input: each one an inert code span
    from gradcheck_client.outputs.markdown import code, summary_markdown

    c = m["counts"]
    head = [f"## gradcheck {m['mode']}: {m['graphs']} graphs, {len(m['units'])} units", "",
            ", ".join(f"{v} {k}" for k, v in c.items() if v) or "no results", ""]
    head += [f"**Incomplete:** {code(line, 600, table=False)}" for line in problems(m)]
    head += [""] if problems(m) else []
    if m["mode"] == "screen":
        s = m["screen"]
        head += ["### Nodes", "", "| Node | Devices | Graphs | Disagreements |", "|---|---|---|---|"]
        head += [f"| {code(n)} | {code(', '.join(v['devices']))} | {v['graphs']} | {v['disagreements']} |"
                 for n, v in s["nodes"].items()]
        head += ["", "**Disagreeing nodes:** " + (", ".join(code(n, table=False) for n in s["disagreeing_nodes"])
                                                  or "none"),
                 ""]
        head += [f"- {code(d['node'], table=False)} on {code(d['graph'], table=False)}: "
                 f"{code(d['reason'], 300, table=False)}" for d in s["disagreements"][:50]]
        head += [f"- every node fails {code(f['graph'], table=False)} ({code(f['status'], 20, table=False)}): "
                 "the graph, not a node"
                 for f in s["consistent_failures"]] + [""]
    return "\n".join(head) + "\n" + summary_markdown(outs)
