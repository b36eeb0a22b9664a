"""Markdown (GitHub-flavoured, as `$GITHUB_STEP_SUMMARY` and batch-merge's summary.md render it).

Every user string (graph path, node name, finding, error) goes through `code`: a code span.
Inside a code span Markdown interprets nothing: no link, image, autolink (GFM links bare
`www.`, `https://` and e-mail addresses in text, whatever is backslash-escaped), raw HTML,
HTML comment, entity or emphasis. What remains is the span's own syntax, handled here: the
fence is one backtick longer than the longest run inside, and in a table cell `|` is
written `\\|` (GFM removes that backslash even inside a code span). `text.clip` has already
made the string one line with controls, bidi overrides and invisible characters escaped,
so a name reads as what it is: a name, set in code, never a verdict, a link or a hidden comment.
"""
from __future__ import annotations

import re
import sys

from .mermaid import failing_parameters, fault_labels, neighbourhood_mermaid
from .text import clip

MAX_ITEMS = 10  # findings listed per graph in the table (the rest counted)
# GitHub shows a step summary of at most 1 MiB (and refuses a larger one): ours stays within half of it,
# whatever the run -- table rows past it (passing graphs first) and diagrams past it are left out, and counted
MAX_SUMMARY_BYTES = 2**19
_TICKS = re.compile(r"`+")


def code(value, limit: int = 200, *, table: bool = True) -> str:
    """A user string as an inert Markdown code span (`table`: it stands in a table cell)."""
    text = clip(value, limit)
    if table:
        text = text.replace("|", "\\|")
    if not text:
        return "` `"
    fence = "`" * (1 + max((len(run) for run in _TICKS.findall(text)), default=0))
    # a space each side (removed when rendered) keeps a backtick at either end off the fence,
    # and a text that begins and ends with a space keeps them
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " " and text.strip()) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


ICON = {"pass": "✅ pass", "fail": "❌ fail", "invalid": "⚠️ invalid", "error": "⚠️ error"}


def _findings(o) -> str:
    if o.report is None:
        return code(o.error, 300)
    items = [f"{code(p.name, 80)} wrong ({code(p.why_failed(), 120)})" for p in o.report.failed_parameters]
    items += [code(str(f), 200) for f in o.report.findings]
    more = f"; and {len(items) - MAX_ITEMS} more" if len(items) > MAX_ITEMS else ""
    return "; ".join(items[:MAX_ITEMS]) + more or "-"


def _cause_line(report: dict) -> str:
    """What the diagram below shows, in words: the failing parameters and where faults were injected."""
    params = failing_parameters(report)
    said = [f"failing parameters: {', '.join(code(p, 80, table=False) for p in params[:MAX_ITEMS])}"
            + (f" and {len(params) - MAX_ITEMS} more" if len(params) > MAX_ITEMS else "") if params
            else "no parameter fails (the verdict fails on a finding)"]
    said += [f"fault {code(spec, 120, table=False)} injected at {code(node, 80, table=False)}"
             for node, spec in fault_labels(report).items()]
    return "; ".join(said)


def _size(lines: list[str]) -> int:
    return sum(len(line.encode("utf-8")) + 1 for line in lines)


def _row(o) -> str:
    # a verdict this client does not know (a newer server, a damaged record) is shown, not a crash
    return f"| {code(o.path, 300)} | {ICON.get(o.status) or code(o.status, 40)} | {_findings(o)} |"


def _diagram(o) -> list[str]:
    """Where a failing graph broke, as Mermaid; [] without one (a drawing that fails: a warning, no diagram)."""
    if o.report is None or o.graph is None:
        return []
    try:
        diagram = neighbourhood_mermaid(o.graph, o.report.data)
    except Exception as exc:  # noqa: BLE001 -- a diagram never decides the run
        print(f"gradcheck: warning: no Mermaid diagram for {clip(o.path, 200)} ({type(exc).__name__})",
              file=sys.stderr)
        return []
    return ["", f"#### {code(o.path, 300, table=False)}", "", _cause_line(o.report.data), "", diagram] if diagram \
        else []


def summary_markdown(outcomes: list, max_bytes: int = MAX_SUMMARY_BYTES, diagrams: bool = True) -> str:
    """The CI summary: a table of graphs, verdicts and findings, then where each failing graph
    broke (the faulty node's neighbourhood as Mermaid, which GitHub renders); within `max_bytes`."""
    lines = ["### gradcheck", "", "| Graph | Verdict | Findings |", "|---|---|---|"]
    counts = {s: sum(o.status == s for o in outcomes) for s in ICON}
    tail = ["", ", ".join(f"{n} {s}" for s, n in counts.items() if n)]
    rows = [_row(o) for o in outcomes]
    budget = max_bytes // 2 - _size(lines) - _size(tail)  # the table's half (the diagrams get what it leaves)
    if _size(rows) > budget:  # failing graphs' rows first, then passing ones, while they fit
        keep, used = set(), 0
        for k in sorted(range(len(rows)), key=lambda k: outcomes[k].status == "pass"):
            used += _size(rows[k:k + 1])
            if used > budget:
                break
            keep.add(k)
        tail.append(f"{len(rows) - len(keep)} more graphs not listed here (the step summary's size limit); "
                    "the JUnit file and the log list every one")
        rows = [r for k, r in enumerate(rows) if k in keep]
    lines += rows + tail
    left, used = 0, _size(lines) + 200  # 200: the note below
    for o in outcomes if diagrams else ():
        diagram = _diagram(o)
        if used + _size(diagram) > max_bytes:
            left += 1
        else:
            lines += diagram
            used += _size(diagram)
    if left:
        lines += ["", f"diagrams of {left} more failing graphs left out (the step summary's size limit)"]
    return "\n".join(lines) + "\n"
