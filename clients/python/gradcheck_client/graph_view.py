"""The graph of a report as something to draw: nodes colored by finding, the faulty node and its
path to the loss, what hovering a node shows, and the layout.

The layout is a maintained engine's: Graphviz `dot` where it is installed (positions and edge
splines from `dot -Tplain`), else dagre, a JavaScript library embedded in the page, which lays
the graph out in the browser (layout "dagre": no positions here). Nothing is placed by hand.
"""
from __future__ import annotations

import shutil
import subprocess
from collections import deque
from dataclasses import dataclass, field

from .op_values import OPS, REQUIRED
from .outputs.text import clip
from .shapes import output_shape

SEVERITY_ORDER = ("error", "warning", "info")
INTEGRITY_CAUSES = ("cache_corruption", "inplace_overwrite", "recompute_mismatch")
DOT_TIMEOUT_S = 30
POINTS = 72.0  # dot's inches -> CSS pixels at 72 per inch


@dataclass
class GraphView:
    nodes: list[dict] = field(default_factory=list)  # id, name, op, kind, cls, faulty, path, hover lines
    edges: list[dict] = field(default_factory=list)  # from, to, path (on the faulty node's path to the loss)
    faulty: str | None = None  # the node name of the first error finding
    layout: str = "dagre"  # "dot" (positions given) or "dagre" (laid out in the page)
    width: float = 0.0
    height: float = 0.0

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


def build_view(graph, report: dict, *, integrity: str = "check", layout: str = "auto") -> GraphView:
    findings = report.get("findings") or []
    by_node: dict[str, list[dict]] = {}
    for f in findings:
        by_node.setdefault(f.get("node", ""), []).append(f)
    errors = [f for f in findings if f.get("severity") == "error"]
    faulty = errors[0]["node"] if errors else None
    path = path_to_loss(graph, faulty) if faulty else []
    on_path = set(path)
    path_edges = set(zip(path, path[1:]))
    params = {p.get("name"): p for p in report.get("parameters") or []}
    shapes = _shapes(graph)
    view = GraphView(faulty=faulty)
    ids = {}
    values = [(i.name, "param" if i.requires_grad else "input", "input") for i in graph.inputs]
    values += [(n.name, "node", n.op) for n in graph.nodes]
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
            if i in ids:
                view.edges.append({"from": ids[i], "to": ids[n.name], "path": (i, n.name) in path_edges})
    if layout in ("auto", "dot") and shutil.which("dot"):
        _dot_layout(view)
    elif layout == "dot":
        raise RuntimeError("Graphviz `dot` is not installed")
    return view


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


def _dot_layout(view: GraphView) -> None:
    lines = ["digraph g {", "  rankdir=TB; nodesep=0.3; ranksep=0.45;",
             "  node [shape=box, fixedsize=true, label=\"\"];"]
    for n in view.nodes:  # ids only (n0, n1, ...): no user text reaches dot
        w, h = _label_size(n)
        lines.append(f"  {n['id']} [width={w / POINTS:.3f}, height={h / POINTS:.3f}];")
    lines += [f"  {e['from']} -> {e['to']};" for e in view.edges]
    lines.append("}")
    out = subprocess.run(["dot", "-Tplain"], input="\n".join(lines), capture_output=True, text=True,
                         timeout=DOT_TIMEOUT_S, check=True).stdout
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
