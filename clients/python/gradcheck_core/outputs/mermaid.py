"""A Mermaid flowchart of the faulty node's neighbourhood, for the CI Markdown summary
(GitHub renders Mermaid in step summaries): the node of the first error finding, what it
reads, what reads it, and the path from it on to the loss (its first PATH_HEAD values and the
loss, the cut labelled with how many were left out), the faulty node styled as an error;
the source node of each injected fault (`--fault NODE:...`, joined to the faulty node by a
dotted "fault" arrow when it is not one of its inputs) and the failing parameters (a box of
their own), so the diagram names the cause, the effect and what it broke.

Node ids are generated (m0, m1, ...); every label goes through `label`: `text.clip`, then
every character outside [A-Za-z0-9 _.] written as a Mermaid entity code (#60; for <, #96;
for a backtick), so a hostile name can neither break the diagram's syntax, nor become markup
in a label (Mermaid draws labels as HTML), nor close the Markdown code fence around it.
"""
from __future__ import annotations

from ..graph_view import path_to_loss, shortened
from ..report import Report
from .text import clip

MAX_NEIGHBOURS = 12  # readers and consumers shown per side (and failing parameters, and fault sources)


def label(value, limit: int = 60) -> str:
    """A user string as the text of a Mermaid label (between its double quotes)."""
    return "".join(c if c.isalnum() and c.isascii() or c in " _." else f"#{ord(c)};" for c in clip(value, limit))


def fault_labels(report: dict) -> dict[str, str]:
    """node -> its fault as given, NODE:KIND[:VALUE] (the first fault injected there)."""
    out: dict[str, str] = {}
    for f in report.get("faults") or []:
        out.setdefault(str(f.get("fault", "")).split(":")[0], str(f.get("fault", "")))
    return out


def failing_parameters(report: dict) -> list[str]:
    return [p.name for p in Report(report).failed_parameters]


def neighbourhood_mermaid(graph, report: dict) -> str | None:
    errors = [f for f in report.get("findings") or [] if f.get("severity") == "error"]
    if not errors:
        return None
    faulty = errors[0].get("node")
    ops = {n.name: n.op for n in graph.nodes}
    ops |= {i.name: "parameter" if i.requires_grad else "input" for i in graph.inputs}
    if faulty not in ops:
        return None
    producers = {n.name: list(n.inputs) for n in graph.nodes}
    readers = [n.name for n in graph.nodes if faulty in n.inputs]
    path, cut = shortened(path_to_loss(graph, faulty))  # bounded: a long chain's path is cut, and says so
    sources = [n for n in fault_labels(report) if n in ops][:MAX_NEIGHBOURS]
    params = [n for n in failing_parameters(report) if n in ops][:MAX_NEIGHBOURS]
    shown = [*producers.get(faulty, [])[:MAX_NEIGHBOURS], faulty, *readers[:MAX_NEIGHBOURS], *path, *sources]
    ids: dict[str, str] = {}
    for name in shown:
        ids.setdefault(name, f"m{len(ids)}")
    lines = ["```mermaid", "flowchart TD"]
    injected = fault_labels(report)

    def box(name: str) -> str:  # name, op, and the fault injected there
        fault = f"<br/>{label('fault ' + injected[name])}" if name in injected else ""
        return f'["{label(name)}<br/>{label(ops[name])}{fault}"]'
    lines += [f"  {i}{box(name)}" for name, i in ids.items()]
    edges = {(a, faulty) for a in producers.get(faulty, [])[:MAX_NEIGHBOURS]}
    edges |= {(faulty, r) for r in readers[:MAX_NEIGHBOURS]} | set(zip(path, path[1:]))
    for a, b in sorted(edges, key=lambda e: (ids[e[0]], ids[e[1]])):
        arrow = "==>" if (a, b) in set(zip(path, path[1:])) else "-->"
        if cut and (a, b) == (path[-2], path[-1]):
            arrow = f'==>|"{cut} more"|'
        lines.append(f"  {ids[a]} {arrow} {ids[b]}")
    lines += [f'  {ids[s]} -. "fault" .-> {ids[faulty]}' for s in sources if s != faulty and (s, faulty) not in edges]
    # the failing parameters in a box of their own (one drawn above moves into it: a Mermaid
    # node is placed in the subgraph that names it)
    if params:
        lines.append('  subgraph failing["failing parameters"]')
        for name in params:
            ids.setdefault(name, f"m{len(ids)}")
            lines.append(f"    {ids[name]}{box(name)}" if name not in shown else f"    {ids[name]}")
        lines.append("  end")
    lines += ["  classDef error fill:#fde2e1,stroke:#b00020,stroke-width:3px",
              "  classDef path stroke:#d9480f,stroke-width:2px",
              "  classDef fault fill:#fff3bf,stroke:#e67700,stroke-width:2px,stroke-dasharray:4",
              "  classDef param fill:#fff0f6,stroke:#c2255c",
              f"  class {ids[faulty]} error"]
    on_path = [ids[n] for n in path if n != faulty]
    if on_path:
        lines.append(f"  class {','.join(on_path)} path")
    if [s for s in sources if s != faulty]:
        lines.append(f"  class {','.join(ids[s] for s in sources if s != faulty)} fault")
    if params:
        lines.append(f"  class {','.join(ids[n] for n in params)} param")
    lines.append("```")
    return "\n".join(lines)
