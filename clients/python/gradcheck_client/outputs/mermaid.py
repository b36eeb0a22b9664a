"""A Mermaid flowchart of the faulty node's neighbourhood, for the CI Markdown summary
(GitHub renders Mermaid in step summaries): the node of the first error finding, what it
reads, what reads it, and the path from it on to the loss, the faulty node styled as an error.

Node ids are generated (m0, m1, ...); every label goes through `label`: `text.clip`, then
every character outside [A-Za-z0-9 _.] written as a Mermaid entity code (#60; for <, #96;
for a backtick), so a hostile name can neither break the diagram's syntax, nor become markup
in a label (Mermaid draws labels as HTML), nor close the Markdown code fence around it.
"""
from __future__ import annotations

from ..graph_view import path_to_loss
from .text import clip

MAX_NEIGHBOURS = 12  # readers and consumers shown per side


def label(value, limit: int = 60) -> str:
    """A user string as the text of a Mermaid label (between its double quotes)."""
    return "".join(c if c.isalnum() and c.isascii() or c in " _." else f"#{ord(c)};" for c in clip(value, limit))


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
    path = path_to_loss(graph, faulty)
    shown = [*producers.get(faulty, [])[:MAX_NEIGHBOURS], faulty, *readers[:MAX_NEIGHBOURS], *path]
    ids: dict[str, str] = {}
    for name in shown:
        ids.setdefault(name, f"m{len(ids)}")
    lines = ["```mermaid", "flowchart TD"]
    lines += [f'  {i}["{label(name)}<br/>{label(ops[name])}"]' for name, i in ids.items()]
    edges = {(a, faulty) for a in producers.get(faulty, [])[:MAX_NEIGHBOURS]}
    edges |= {(faulty, r) for r in readers[:MAX_NEIGHBOURS]} | set(zip(path, path[1:]))
    for a, b in sorted(edges, key=lambda e: (ids[e[0]], ids[e[1]])):
        arrow = "==>" if (a, b) in set(zip(path, path[1:])) else "-->"
        lines.append(f"  {ids[a]} {arrow} {ids[b]}")
    lines += ["  classDef error fill:#fde2e1,stroke:#b00020,stroke-width:3px",
              "  classDef path stroke:#d9480f,stroke-width:2px",
              f"  class {ids[faulty]} error"]
    on_path = [ids[n] for n in path if n != faulty]
    if on_path:
        lines.append(f"  class {','.join(on_path)} path")
    lines.append("```")
    return "\n".join(lines)
