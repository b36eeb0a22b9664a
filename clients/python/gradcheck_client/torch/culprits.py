"""The lines of a torch check's report that name a culprit, and their rank -- one place for both readers:
the drop-in's GradcheckError puts the best-ranked one first (drop_in._culprit), the values screen puts its
own line below the ones that head the text (values._below_culprits).

What is a culprit is decided from the report's data (its custom Functions, opaque nodes, source lines,
findings and the values screen's entry, by their verdicts), not from how a line begins: each line is
written by the formatter below that also recognises it, so a user's name or detail that happens to read like
another kind of line is never taken for one.

Ranks: 0 a custom Function that did not pass, an opaque node that failed; 1 an opaque node left undecided;
2 a finding of the graph's check, localized (its source line, the server's line), or the values screen's
failing or undecided line.
"""
from __future__ import annotations

VALUES = "the function's values: "


def function_line(c: dict) -> str:
    """A custom Function's line (report.data["custom_functions"] entry c) in the report's text."""
    inside = f" in {c['module']}" if c["module"] else ""
    return f"custom autograd.Function {c['function']}{inside} ({c['source']}): {c['detail']}"


def opaque_line(e: dict) -> str:
    """An opaque node's line (report.data["opaque"] entry e): what was checked how."""
    inside = f" in {e['module']}" if e["module"] and e["module"] not in e["source"] else ""
    how = "not checked itself" if e["verdict"] == "surrogate" else \
        "checked in process by float64 central differences"
    return (f"opaque {e['kind']} {e['op']}{inside} ({e['source']}): {e['verdict'].upper()}: {e['detail']}; "
            f"{how}, its outputs {', '.join(e['parameters'])} checked as parameters")


def source_line(node: str, at: str) -> str:
    """Where a node the graph's check localized was made, in the user's terms."""
    return f"node '{node}' was made at {at}"


def values_line(kind: str, text: str) -> str:
    """The values screen's line (values.judged): kind FAIL or UNDECIDED."""
    return f"{VALUES}{kind}: {text}"


def ranks(report) -> dict:
    """{line: rank} for each line of report.text that names a culprit (the first line of a multi-line one)."""
    data = report.data
    ranked = {}
    for c in data.get("custom_functions", ()):
        if c["verdict"] != "pass":
            ranked[function_line(c)] = 0
    for e in data.get("opaque", ()):
        if e["verdict"] in ("fail", "undecided"):
            ranked[opaque_line(e)] = 0 if e["verdict"] == "fail" else 1
    for node, at in data.get("sources", {}).items():
        ranked[source_line(node, at)] = 2
    return {line.split("\n")[0]: rank for line, rank in ranked.items()}


def rank(report, line: str, known: dict):
    """line's rank (known: ranks(report)), None where it names no culprit. A finding's line of the server's text
    and the values screen's line are matched by what the data says they begin with."""
    if line in known:
        return known[line]
    text = line.strip()
    if any(text.startswith(f"node '{f.node}' ({f.op}): ") for f in report.findings):
        return 2
    entry = report.data.get("check", {}).get("function_values")
    failing = (values_line("FAIL", ""), values_line("UNDECIDED", ""))
    if entry and entry["verdict"] != "pass" and text.startswith(failing):
        return 2
    return None


def culprit(report) -> str:
    """The line that names what failed: the best-ranked (the first of those in the text), else the first line
    that is not the verdict's."""
    lines = str(report).splitlines()
    known = ranks(report)
    best = None
    for line in lines:
        r = rank(report, line, known)
        if r is not None and (best is None or r < best[0]):
            best = (r, line.strip())
    if best is not None:
        return best[1]
    return next((line for line in lines if not line.startswith("verdict ")), lines[0] if lines else "")


def heading(report) -> int:
    """How many lines at the top of report.text name a culprit (a line placed after them leaves them first)."""
    lines = report.text.split("\n")
    known = ranks(report)
    k = 0
    while k < len(lines) and lines[k] in known:
        k += 1
    return k
