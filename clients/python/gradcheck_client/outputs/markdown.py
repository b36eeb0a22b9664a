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

from .mermaid import failing_parameters, fault_labels, neighbourhood_mermaid
from .text import clip

MAX_ITEMS = 10  # findings listed per graph in the table (the rest counted)
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


def summary_markdown(outcomes: list) -> str:
    """The CI summary: a table of graphs, verdicts and findings, then where each failing graph
    broke (the faulty node's neighbourhood as Mermaid, which GitHub renders)."""
    lines = ["### gradcheck", "", "| Graph | Verdict | Findings |", "|---|---|---|"]
    for o in outcomes:
        # a verdict this client does not know (a newer server, a damaged record) is shown, not a crash
        lines.append(f"| {code(o.path, 300)} | {ICON.get(o.status) or code(o.status, 40)} | {_findings(o)} |")
    counts = {s: sum(o.status == s for o in outcomes) for s in ICON}
    lines += ["", ", ".join(f"{n} {s}" for s, n in counts.items() if n)]
    for o in outcomes:
        diagram = neighbourhood_mermaid(o.graph, o.report.data) if o.report is not None and o.graph is not None \
            else None
        if diagram:
            lines += ["", f"#### {code(o.path, 300, table=False)}", "", _cause_line(o.report.data), "", diagram]
    return "\n".join(lines) + "\n"
