"""The graph of a report as something to draw: nodes colored by finding, the faulty node and its
path to the loss, what hovering a node shows, and the layout.

The layout is a maintained engine's: Graphviz `dot` where it is installed (positions and edge
splines from `dot -Tplain`), else dagre, a JavaScript library embedded in the page, which lays
the graph out in the browser (layout "dagre": no positions here). Nothing is placed by hand.

A drawing never decides a run's outcome, and both engines are superlinear (dot took minutes on
a 200-node chain whose parameter 100 nodes read; dagre keeps a browser busy as long at 10^3
nodes), so what is drawn is bounded: a graph of more than MAX_DRAWN values draws only the
neighbourhood of its failing nodes (none, for a passing one), saying what was left out, and
`dot` gets a time budget (`layout_seconds`, default $GRADCHECK_LAYOUT_SECONDS or
DOT_TIMEOUT_S): when it runs out or dot fails, the page lays the graph out with dagre and one
warning line goes to stderr.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from .op_values import OPS, REQUIRED
from .outputs.text import clip
from .shapes import output_shape

SEVERITY_ORDER = ("error", "warning", "info")
INTEGRITY_CAUSES = ("cache_corruption", "inplace_overwrite", "recompute_mismatch")
DOT_TIMEOUT_S = 20  # dot's time budget for one page (every graph on it), unless $GRADCHECK_LAYOUT_SECONDS says
LAYOUT_SECONDS_ENV = "GRADCHECK_LAYOUT_SECONDS"
MAX_DRAWN = 200  # values (inputs and nodes) drawn whole; a larger graph draws its failing nodes' neighbourhood
NEIGHBOURS = 12  # per failing node: inputs and readers drawn (each side)
MAX_FAILING_DRAWN = 10  # failing nodes whose neighbourhoods are drawn
PATH_HEAD = 8  # values of a path to the loss drawn after its start (then the loss itself)
POINTS = 72.0  # dot's inches -> CSS pixels at 72 per inch


@dataclass
class GraphView:
    nodes: list[dict] = field(default_factory=list)  # id, name, op, kind, cls, faulty, path, hover lines
    edges: list[dict] = field(default_factory=list)  # from, to, path (on the faulty node's path to the loss)
    faulty: str | None = None  # the node name of the first error finding
    layout: str = "dagre"  # "dot" (positions given) or "dagre" (laid out in the page)
    width: float = 0.0
    height: float = 0.0
    note: str = ""  # what was left out of the drawing, and why (empty: the whole graph is drawn)

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "edges": self.edges, "layout": self.layout, "width": self.width,
                "height": self.height}


def _shapes(graph) -> dict:
    """Each value's shape by the tracer's shape rules (None where a rule cannot tell)."""
    shapes = {i.name: tuple(i.value.shape) for i in graph.inputs}
    from google.protobuf.json_format import MessageToDict

    for n in graph.nodes:
        entry = OPS.get(n.op)
        try:
            attrs = {k: d for k, d in entry["attrs"].items() if d is not REQUIRED}
            attrs |= MessageToDict(n.attrs) if n.HasField("attrs") else {}
            attrs = {k: int(v) if isinstance(v, float) and v.is_integer() and k != "value" else v
                     for k, v in attrs.items()}
            shapes[n.name] = output_shape(entry, [shapes[i] for i in n.inputs], attrs)
        except Exception:  # an op this client does not know, or a graph the server refused
            shapes[n.name] = None
    return shapes


def path_to_loss(graph, start: str) -> list[str]:
    """A shortest path of values from `start` to the graph's output (its consumers, breadth first)."""
    consumers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n.name)
    parent, queue = {start: None}, deque([start])
    while queue:
        v = queue.popleft()
        if v == graph.output:
            out = []
            while v is not None:
                out.append(v)
                v = parent[v]
            return out[::-1]
        for c in consumers.get(v, ()):
            if c not in parent:
                parent[c] = v
                queue.append(c)
    return [start]


def shortened(path: list[str], head: int = PATH_HEAD) -> tuple[list[str], int]:
    """A path to the loss as drawn: its start, `head` values after it, and the loss; and how many were cut."""
    if len(path) <= head + 2:
        return path, 0
    return [*path[:head + 1], path[-1]], len(path) - head - 2


def failing_nodes(report: dict) -> list[str]:
    """The nodes of error findings, then the failing parameters: what a cut drawing keeps."""
    names = [f.get("node") for f in report.get("findings") or [] if f.get("severity") == "error"]
    names += [p.get("name") for p in report.get("parameters") or [] if str(p.get("status", "")).startswith("FAIL")
              or p.get("passed") is False]
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n]


def neighbourhood(graph, report: dict) -> list[str]:
    """The failing nodes and NEIGHBOURS of their inputs and readers each."""
    producers = {n.name: list(n.inputs) for n in graph.nodes}
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n.name)
    keep = []
    for name in failing_nodes(report)[:MAX_FAILING_DRAWN]:
        keep += [*producers.get(name, [])[:NEIGHBOURS], name, *readers.get(name, [])[:NEIGHBOURS]]
    return list(dict.fromkeys(keep))


def _drawn(graph, report: dict) -> tuple[set | None, str]:
    """The values to draw (None: all of them) and the note saying what was left out."""
    total = len(graph.inputs) + len(graph.nodes)
    if total <= MAX_DRAWN:
        return None, ""
    keep = neighbourhood(graph, report)
    if not keep:
        return set(), (f"the graph has {total} values, over the {MAX_DRAWN} drawn whole, and nothing fails: "
                       "not drawn (the tables below list every finding and parameter)")
    return set(keep), _cut_note(total, len(keep))


def _cut_note(total: int, drawn: int) -> str:
    return (f"the graph has {total} values, over the {MAX_DRAWN} drawn whole: {drawn} drawn, "
            "the failing nodes' inputs and readers and the path to the loss (shortened)")


def layout_budget(seconds: float | None = None) -> float:
    """The monotonic time by which dot must be done on a page: `seconds`, $GRADCHECK_LAYOUT_SECONDS or
    DOT_TIMEOUT_S from now."""
    if seconds is None:
        try:
            seconds = float(os.environ.get(LAYOUT_SECONDS_ENV) or DOT_TIMEOUT_S)
        except ValueError:
            seconds = DOT_TIMEOUT_S
    return time.monotonic() + max(0.0, seconds)


def build_view(graph, report: dict, *, integrity: str = "check", layout: str = "auto",
               deadline: float | None = None) -> GraphView:
    """`deadline`: the monotonic time dot must be done by (layout_budget(); default a budget of its own)."""
    findings = report.get("findings") or []
    by_node: dict[str, list[dict]] = {}
    for f in findings:
        by_node.setdefault(f.get("node", ""), []).append(f)
    errors = [f for f in findings if f.get("severity") == "error"]
    faulty = errors[0]["node"] if errors else None
    path, cut = (path_to_loss(graph, faulty) if faulty else []), 0
    drawn, note = _drawn(graph, report)
    if drawn is not None:  # a cut drawing: the path to the loss shortened too, joined across the cut
        path, cut = shortened(path)
        drawn |= set(path)
        if drawn:  # the count the note states is what is drawn, the path to the loss included
            note = _cut_note(len(graph.inputs) + len(graph.nodes), len(drawn))
    on_path = set(path)
    path_edges = set(zip(path, path[1:]))
    params = {p.get("name"): p for p in report.get("parameters") or []}
    shapes = _shapes(graph)
    view = GraphView(faulty=faulty, note=note)
    ids = {}
    values = [(i.name, "param" if i.requires_grad else "input", "input") for i in graph.inputs]
    values += [(n.name, "node", n.op) for n in graph.nodes]
    if drawn is not None:
        values = [v for v in values if v[0] in drawn]
    for k, (name, kind, op) in enumerate(values):
        ids[name] = f"n{k}"
        here = sorted(by_node.get(name, []), key=lambda f: SEVERITY_ORDER.index(f.get("severity", "info")))
        cls = here[0]["severity"] if here else ("ok" if kind == "node" else kind)
        shape = shapes.get(name)
        hover = [f"op: {clip(op)}" if kind == "node" else f"{'parameter' if kind == 'param' else 'input'}",
                 f"shape: {list(shape) if shape is not None else 'unknown'}",
                 "fingerprint: " + _fingerprint(kind, here, integrity),
                 "local error: " + _local_error(name, here, params.get(name))]
        hover += [f"{clip(f.get('severity'), 20)}: {clip(f.get('cause'))} — {clip(f.get('detail'), 300)}"
                  for f in here]
        view.nodes.append({"id": ids[name], "name": clip(name, 60), "op": clip(op, 40), "kind": kind,
                           "cls": cls, "faulty": name == faulty, "path": name in on_path,
                           "output": name == graph.output, "hover": hover})
    for n in view.nodes:
        n["w"], n["h"] = _label_size(n)
    for n in graph.nodes:
        for i in n.inputs:
            if i in ids and n.name in ids:
                view.edges.append({"from": ids[i], "to": ids[n.name], "path": (i, n.name) in path_edges})
    if cut:
        view.edges.append({"from": ids[path[-2]], "to": ids[path[-1]], "path": True})  # across the cut
    if view.nodes and layout in ("auto", "dot") and shutil.which("dot"):
        _dot_or_dagre(view, graph.name or graph.output, deadline if deadline is not None else layout_budget())
    elif view.nodes and layout == "dot":
        raise RuntimeError("Graphviz `dot` is not installed")
    return view


def _dot_or_dagre(view: GraphView, name: str, deadline: float) -> None:
    """dot's layout within the time left; when it runs out or dot fails, dagre's (in the page) and a warning."""
    try:
        _dot_layout(view, deadline - time.monotonic())
    except (subprocess.SubprocessError, OSError, ValueError, IndexError, KeyError) as exc:
        why = "ran out of its time budget" if isinstance(exc, subprocess.TimeoutExpired) else \
            f"failed ({type(exc).__name__})"
        print(f"gradcheck: warning: Graphviz dot {why} on graph {clip(name, 80)}; the page lays it out with "
              "dagre instead", file=sys.stderr)
        for n in view.nodes:  # whatever dot had placed is dropped: dagre places everything
            n.pop("x", None), n.pop("y", None)
            n["w"], n["h"] = _label_size(n)
        for e in view.edges:
            e.pop("spline", None)
        view.layout, view.width, view.height = "dagre", 0.0, 0.0


def _fingerprint(kind: str, here: list[dict], integrity: str) -> str:
    changed = [f for f in here if f.get("cause") in INTEGRITY_CAUSES]
    if changed:
        return f"CHANGED between forward and backward ({clip(changed[0].get('cause'))})"
    if kind != "node":
        return "- (an input)"
    return "no change detected" if integrity != "off" else "not checked (--integrity off)"


def _local_error(name: str, here: list[dict], param: dict | None) -> str:
    for f in here:
        w = f.get("worst_element")
        if w:
            return f"engine {w.get('engine')} vs reference {w.get('reference')} at {w.get('index')}"
    if param is not None:
        sym = param.get("symbolic")
        err = sym.get("max_abs_error") if isinstance(sym, dict) else param.get("max_abs_error")
        ref = "symbolic" if isinstance(sym, dict) else "finite differences"
        return f"gradient max abs error {err} vs {ref} ({clip(param.get('status', ''))})"
    return "-"


def _label_size(node: dict) -> tuple[float, float]:
    """Box size in points for the label the page draws: name and op, ~7 px per character."""
    chars = max(len(node["name"]), len(node["op"]) + 2)
    return max(60.0, 7.0 * chars + 16.0), 38.0


def _dot_layout(view: GraphView, seconds: float) -> None:
    if seconds <= 0:
        raise subprocess.TimeoutExpired("dot", 0)
    lines = ["digraph g {", "  rankdir=TB; nodesep=0.3; ranksep=0.45;",
             "  node [shape=box, fixedsize=true, label=\"\"];"]
    for n in view.nodes:  # ids only (n0, n1, ...): no user text reaches dot
        w, h = _label_size(n)
        lines.append(f"  {n['id']} [width={w / POINTS:.3f}, height={h / POINTS:.3f}];")
    lines += [f"  {e['from']} -> {e['to']};" for e in view.edges]
    lines.append("}")
    out = subprocess.run(["dot", "-Tplain"], input="\n".join(lines), capture_output=True, text=True,
                         timeout=seconds, check=True).stdout
    by_id = {n["id"]: n for n in view.nodes}
    edges = {}
    for e in view.edges:
        edges.setdefault((e["from"], e["to"]), []).append(e)
    height = 0.0
    for row in out.splitlines():
        parts = row.split()
        if parts and parts[0] == "graph":
            view.width, height = float(parts[2]) * POINTS, float(parts[3]) * POINTS
            view.height = height
        elif parts and parts[0] == "node":
            n = by_id[parts[1]]
            n["x"], n["y"] = float(parts[2]) * POINTS, height - float(parts[3]) * POINTS
            n["w"], n["h"] = float(parts[4]) * POINTS, float(parts[5]) * POINTS
        elif parts and parts[0] == "edge":
            count = int(parts[3])
            pts = [[float(parts[4 + 2 * i]) * POINTS, height - float(parts[5 + 2 * i]) * POINTS] for i in range(count)]
            pending = edges.get((parts[1], parts[2]))
            if pending:
                pending.pop(0)["spline"] = pts
    view.layout = "dot"
