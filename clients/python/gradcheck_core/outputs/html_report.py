"""`--html FILE`: one self-contained HTML page for a run (one graph or many).

Per graph: the verdict, the graph drawn (graph_view.py: nodes colored by finding, the faulty
node and its path to the loss highlighted, hover for op, shape, fingerprint status and local
error), the findings table, the parameter rows, a heatmap of each parameter's error against
the verdict's reference, and the memory figures (with the per-step timeline where the run
recorded one). No external resource: style, script and the layout library are inlined.

Every user string is hostile (names, formulas, details): HTML text and attributes go through
`outputs.html.h`, the drawing's data through `outputs.html.script_json` (JSON inside a
non-executable script element, which the page script sets as textContent only).

The page is bounded whatever the run: drawings as graph_view.py bounds them (values drawn, dot's
time budget for the whole page), at most MAX_FINDING_ROWS findings and MAX_PARAMETER_ROWS
parameters listed per graph, and past MAX_PAGE_BYTES the remaining graphs (passing ones last) are
listed in the index only. A drawing that fails is replaced by a note and a warning on stderr.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from ..graph_view import build_view, layout_budget
from ..report import row_status
from .html import h, script_json
from .text import clip

HEATMAP_COLUMNS = 32  # a 1-D parameter wraps after this many cells
CELL = 12  # heatmap cell size, px
# The page stays small whatever the run (chain_256 alone drew 540 heatmaps, 7.7 MB): per graph the
# heatmaps of the worst parameters only, and per heatmap at most this many cells (a larger parameter is
# drawn in blocks, each the worst of its elements).
HEATMAP_MAX_PARAMETERS = 6
HEATMAP_MAX_CELLS = 256
PARAMETER_ROWS = 20  # parameter table rows shown before the rest is collapsed
MAX_PARAMETER_ROWS = 500  # parameter rows listed at all (the rest counted: the JSON report has every one)
MAX_FINDING_ROWS = 200  # finding rows listed (the rest counted)
MAX_PAGE_BYTES = 20 * 2**20  # past this, the remaining graphs' sections are left out (named in the index)
FAILED = ("fail", "invalid", "error")  # verdicts listed first


@dataclass
class RunItem:
    label: str  # the graph file, or the graph's name
    graph: object = None  # gradcheck.v1.Graph, when it could be read
    report: dict | None = None  # the JSON report, when there is one
    error: str = ""  # why there is no report
    no_graph: str = ""  # why the graph is not drawn, when there is a report but no graph
    timelines: dict = field(default_factory=dict)  # run -> [(step label, live bytes)], when recorded


def _asset(name: str) -> str:
    return resources.files("gradcheck_core").joinpath(name).read_text(encoding="utf-8")


def _finite(x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def num(x, digits: int = 4) -> str:
    """A number as people read it: integers as integers, others to `digits` significant digits
    (1.1000622635037871e-10 -> 1.1e-10); anything else as it is."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int) or (math.isfinite(x) and x.is_integer() and abs(x) < 1e15):
        return str(int(x))
    return f"{x:.{digits}g}"


def label(name) -> str:
    """finite_differences -> finite differences."""
    return str(name).replace("_", " ")


def _worst(w: dict | None, subject: str = "engine") -> str:
    if not w:
        return ""
    return f"{subject} {num(w.get('engine'))} vs reference {num(w.get('reference'))} at {w.get('index')}"


def _subject(report: dict) -> str:
    """What the verdict is on, when it is not the engine: the claimed gradients sent with the graph."""
    if report.get("subject") != "claimed":
        return ""
    return ("<p class='subject'>Subject: <strong>the claimed gradients</strong> (computed by other code and sent "
            "with the graph), checked against the references; the engine's gradients are a third witness.</p>")


def _findings_table(report: dict) -> str:
    rows = report.get("findings") or []
    if not rows:
        return "<p>No findings.</p>"
    out = ["<table class='findings'><tr><th>severity</th><th>node</th><th>op</th><th>cause</th>"
           "<th>parameters</th><th>detail</th><th>worst element</th></tr>"]
    for f in rows[:MAX_FINDING_ROWS]:
        out.append(f"<tr class='{h(f.get('severity'), 20)}'><td>{h(f.get('severity'), 20)}</td>"
                   f"<td class='mono'>{h(f.get('node'), 80)}</td><td>{h(f.get('op'), 40)}</td>"
                   f"<td>{h(f.get('cause'), 40)}</td><td class='mono'>"
                   f"{h(', '.join(map(str, f.get('parameters') or [])), 200)}</td><td>{h(f.get('detail'), 600)}</td>"
                   f"<td>{h(_worst(f.get('worst_element')), 200)}</td></tr>")
    out.append("</table>")
    out.append(_more(len(rows) - MAX_FINDING_ROWS, "findings"))
    return "".join(out)


def _more(left: int, what: str) -> str:
    return f"<p class='note'>{left} more {what} not listed (the JSON report lists every one).</p>" if left > 0 else ""


def _parameter_table(report: dict) -> str:
    rows = report.get("parameters") or []
    if not rows:
        return "<p>No parameters (no input has requires_grad).</p>"
    head = ("<table class='parameters'><tr><th>parameter</th><th>shape</th><th>status</th>"
            "<th>judged against</th><th>max abs err (verdict reference)</th><th>max abs err vs FD</th>"
            "<th>worst element</th></tr>")
    out = [head]
    # failing parameters first (in the report's order otherwise); past PARAMETER_ROWS, the rest collapsed
    rows = sorted(rows, key=lambda p: not str(p.get("status", "")).startswith(("FAIL", "undecided", "not provided")))
    left, rows = len(rows) - MAX_PARAMETER_ROWS, rows[:MAX_PARAMETER_ROWS]
    who = "claimed" if report.get("subject") == "claimed" else "engine"
    for k, p in enumerate(rows):
        if k == PARAMETER_ROWS:
            out.append(f"</table><details class='more'><summary>{len(rows) - k} more parameters</summary>{head}")
        sym = p.get("symbolic")
        err = sym.get("max_abs_error") if isinstance(sym, dict) else p.get("max_abs_error")
        worst = {"index": p.get("worst_index"), "engine": p.get("engine_at_worst"),
                 "reference": p.get("reference_at_worst")} if "engine_at_worst" in p else None
        out.append(f"<tr><td class='mono'>{h(p.get('name'), 80)}</td><td>{h(p.get('shape'), 60)}</td>"
                   f"<td>{h(row_status(p.get('status'), p.get('passed')), 40)}</td>"
                   f"<td>{h(label(p.get('verdict_reference', '')), 40)}</td><td>{h(num(err), 40)}</td>"
                   f"<td>{h(num(p.get('max_abs_error')), 40)}</td><td>{h(_worst(worst, who), 200)}</td></tr>")
    out.append("</table></details>" if len(rows) > PARAMETER_ROWS else "</table>")
    out.append(_more(left, "parameters"))
    return "".join(out)


@dataclass
class _Errors:
    """One parameter's error per element (or per direction), as a fraction of its tolerance."""
    engine: np.ndarray
    ref: np.ndarray
    err: np.ndarray
    ratio: np.ndarray
    shape: list
    what: str

    @property
    def worst(self) -> float:  # non-finite counts as the worst
        return float(np.nanmax(np.where(np.isfinite(self.ratio), self.ratio, np.inf))) if self.ratio.size else 0.0


def _joint(p: dict) -> bool:
    """A row judged by the joint screen's directions (report key fd_checked_by "joint": cleared; "joint, by the
    screen": flagged and judged on its directional values, its elements not checked one by one): its reference
    is the whole graph's directional derivatives, not its elements."""
    return p.get("fd_checked_by") in ("joint", "joint, by the screen")


def _errors(p: dict) -> _Errors | None:
    sym = p.get("symbolic")
    if _joint(p):
        return None  # no element values to draw: _joint_agreement says what was checked
    if p.get("fd_mode") == "projection":
        engine, ref, what = p.get("engine_projection") or [], p.get("reference") or [], "directional derivatives"
        shape = [len(ref)]
    else:
        engine = p.get("gradient") or []
        ref = (sym.get("gradient") if isinstance(sym, dict) else None) or p.get("reference") or []
        what, shape = "elements", list(p.get("shape") or [])
    n = min(len(engine), len(ref))
    if not n:
        return None
    e, r = np.array([_finite(v) for v in engine[:n]]), np.array([_finite(v) for v in ref[:n]])
    tol = p.get("tolerance") or {}
    atol, rtol = _finite(tol.get("atol", 0.0)), _finite(tol.get("rtol", 0.0))
    # the verdict's bound (compare.bounds): atol's term as applied ("absolute": smaller for a vanishing float64
    # gradient, so the picture is never laxer than the verdict), plus the FD reference's own error bound
    noise = p.get("fd_error") if ref is p.get("reference") and what == "elements" else None
    noise = np.nan_to_num([_finite(v) for v in noise[:n]], nan=0.0, posinf=np.inf) \
        if noise and len(noise) >= n else 0.0
    with np.errstate(all="ignore"):
        finite_ref = np.abs(r[np.isfinite(r)])
        scale = max(1.0, float(finite_ref.max()) if finite_ref.size else 1.0)
        absolute = _finite(tol["absolute"]) if "absolute" in tol else atol * scale
        bound = absolute + rtol * np.abs(r) + noise
        err = np.abs(e - r)
        ratio = np.where(np.isfinite(err) & np.isfinite(bound) & (bound > 0), err / bound, np.inf)
        ratio = np.where(e == r, 0.0, ratio)
    return _Errors(e, r, err, ratio, shape, what)


def _color(x: float) -> str:
    return "#5b2a86" if not math.isfinite(x) else "#b00020" if x > 1 else \
        f"hsl({int(120 - 70 * min(1.0, x))}, 60%, {int(85 - 25 * min(1.0, x))}%)"


def _heatmap(p: dict, errors: _Errors | None = None) -> str:
    """|engine - reference| per element, as a fraction of the element's tolerance; a parameter of more
    than HEATMAP_MAX_CELLS elements in square blocks, each colored by its worst element."""
    errors = errors or _errors(p)
    if errors is None:
        return ""
    e, r, err, ratio, shape = errors.engine, errors.ref, errors.err, errors.ratio, errors.shape
    n = len(ratio)
    cols = shape[-1] if len(shape) >= 2 else min(HEATMAP_COLUMNS, n)
    cols = max(1, min(cols, n))
    rows = -(-n // cols)
    block = max(1, math.ceil(math.sqrt(rows * cols / HEATMAP_MAX_CELLS)))
    while block > 1 and -(-rows // block) * -(-cols // block) > HEATMAP_MAX_CELLS:  # the last blocks are partial
        block += 1
    grid = np.full(rows * cols, -1.0)  # -1: no element (the last row's padding)
    grid[:n] = np.where(np.isfinite(ratio), ratio, np.inf)
    grid = grid.reshape(rows, cols)
    cells = []
    if block == 1:
        for k in range(n):
            i, j = divmod(k, cols)
            x = ratio[k]
            idx = [int(i) for i in np.unravel_index(k, shape)] if shape and len(e) == math.prod(shape) else [k]
            cells.append(f"<rect class='cell' x='{j * CELL}' y='{i * CELL}' width='{CELL}' height='{CELL}' "
                         f"fill='{_color(x)}'><title>{h(idx, 80)}: engine {h(num(e[k]), 30)} vs "
                         f"{h(num(r[k]), 30)}, |error| {h(num(err[k]), 30)} = {h(num(x, 3), 20)} of the tolerance"
                         "</title></rect>")
        width, height = cols * CELL, rows * CELL
    else:
        br, bc = -(-rows // block), -(-cols // block)
        padded = np.full((br * block, bc * block), -1.0)
        padded[:rows, :cols] = grid
        worst = padded.reshape(br, block, bc, block).max(axis=(1, 3))
        for i in range(br):
            for j in range(bc):
                x = float(worst[i, j])
                if x < 0:
                    continue
                cells.append(f"<rect class='cell' x='{j * CELL}' y='{i * CELL}' width='{CELL}' height='{CELL}' "
                             f"fill='{_color(x)}'><title>rows {i * block}-{min(rows, (i + 1) * block) - 1}, "
                             f"columns {j * block}-{min(cols, (j + 1) * block) - 1}: worst |error| "
                             f"{h(num(x, 3), 20)} of the tolerance</title></rect>")
        width, height = bc * CELL, br * CELL
    more = "" if len(p.get("gradient") or []) >= math.prod(shape or [1]) or p.get("fd_mode") == "projection" \
        else " (the first values listed in the report)"
    blocks = f"; {block}×{block} elements per cell, each the worst of its block" if block > 1 else ""
    return (f"<figure><figcaption class='mono'>{h(p.get('name'), 80)}: {n} {errors.what}{more}{blocks}; "
            "green within tolerance, red beyond it, purple non-finite</figcaption>"
            f"<svg class='heatmap' width='{width}' height='{height}'>{''.join(cells)}</svg></figure>")


AFFECTED = ("FAIL", "undecided", "affected", "not provided")  # row statuses a heatmap ranks first


def _affected(p: dict) -> bool:
    return str(p.get("status", "")).startswith(AFFECTED) or p.get("passed") is False


def _heatmaps(report: dict) -> str:
    """The heatmaps of the HEATMAP_MAX_PARAMETERS worst parameters -- the affected ones (failing, undecided,
    affected by a fault) first, worst first -- with a note of how many were left out; then the parameters the
    joint screen cleared, as what was checked: the whole graph's directional derivatives."""
    params = report.get("parameters") or []
    rated = [(p, _errors(p)) for p in params]
    rated = [(p, e) for p, e in rated if e is not None]
    rated.sort(key=lambda pe: (not _affected(pe[0]), -pe[1].worst))
    shown = "".join(_heatmap(p, e) for p, e in rated[:HEATMAP_MAX_PARAMETERS])
    left = len(rated) - HEATMAP_MAX_PARAMETERS
    if left > 0:
        worst = "worst of the affected" if any(_affected(p) for p, _ in rated) else "worst"
        shown += (f"<p class='note'>{left} more parameters' heatmaps left out: the {HEATMAP_MAX_PARAMETERS} "
                  f"{worst} are shown (the parameter table lists every one).</p>")
    return shown + _joint_agreement([p for p in params if _joint(p)])


def _joint_agreement(rows: list) -> str:
    """The parameters the joint screen cleared: checked together along shared random directions, so there is
    no per-element value to draw; one line says how the directional derivatives agreed, green when they pass."""
    if not rows:
        return ""
    p = rows[0]
    e = np.array([_finite(v) for v in p.get("engine_projection") or []])
    r = np.array([_finite(v) for v in p.get("reference") or []])
    n = min(len(e), len(r))
    off = float(np.max(np.abs(e[:n] - r[:n]), initial=0.0)) if n else float("nan")
    ok = all(str(q.get("status", "")).startswith("ok") for q in rows)
    names = ", ".join(str(q.get("name")) for q in rows[:HEATMAP_MAX_PARAMETERS])
    more = f" and {len(rows) - HEATMAP_MAX_PARAMETERS} more" if len(rows) > HEATMAP_MAX_PARAMETERS else ""
    return (f"<p class='{'ok' if ok else 'error'} joint'>{len(rows)} parameter{'s' if len(rows) != 1 else ''} "
            f"checked jointly ({h(names, 400)}{more}): the whole graph's {n} directional derivatives "
            f"{'agree' if ok else 'disagree'} with finite differences (largest |engine - FD| {h(num(off), 30)}); "
            "no per-element values to draw</p>")


MEMORY_FIGURES = ("training_peak_bytes", "live_peak_bytes", "inference_peak_bytes", "data_bytes", "parameters_bytes",
                  "gradients_bytes", "optimizer_bytes", "activations_peak_bytes", "checkpoint_activations_peak_bytes",
                  "checkpoint_live_peak_bytes", "checkpoint_training_peak_bytes")
# the parts of the training and inference peaks (docs/memory.md: one accounting)
TRAINING_PARTS = (("data", "data_bytes"), ("params", "parameters_bytes"), ("grads", "peak_gradients_bytes"),
                  ("optimizer", "optimizer_bytes"), ("activations", "peak_activations_bytes"),
                  ("transients", "peak_transient_bytes"))
INFERENCE_PARTS = (("data", "data_bytes"), ("params", "parameters_bytes"), ("transients", "inference_transient_bytes"))
PART_COLORS = {"data": "#8c8c8c", "params": "#1f77b4", "grads": "#2ca02c", "optimizer": "#9467bd",
               "activations": "#d62728", "transients": "#ff7f0e"}
MAX_NODE_BARS = 20


def _bar_rows(rows: list, unit_text: str = " B") -> str:
    """Horizontal bars, one per (label, value), scaled to the largest."""
    top = max([v for _, v in rows if math.isfinite(v)] + [1.0])
    bars = [f"<g class='bar' transform='translate(0,{i * 20})'><text x='0' y='13'>{h(k, 60)}</text>"
            f"<rect x='250' y='3' height='13' width='{300 * v / top if math.isfinite(v) else 0:.1f}' "
            f"fill='#6b8cc7'></rect><text x='{256 + 300 * v / top if math.isfinite(v) else 256:.1f}' y='13'>"
            f"{h(int(v) if math.isfinite(v) else v, 30)}{unit_text}</text></g>" for i, (k, v) in enumerate(rows)]
    return f"<svg class='memory' width='700' height='{20 * len(rows) + 4}'>{''.join(bars)}</svg>"


def _stacked(mem: dict) -> str:
    """Training and inference side by side, each a bar split into its parts."""
    rows = [("training", TRAINING_PARTS, "training_peak_bytes"), ("inference", INFERENCE_PARTS, "inference_peak_bytes")]
    top = max(_finite(mem.get(total)) for _, _, total in rows)
    if not math.isfinite(top) or top <= 0:
        return ""
    out = []
    for i, (name, parts, total) in enumerate(rows):
        x, cells = 100.0, []
        for part, key in parts:
            v = _finite(mem.get(key))
            if not math.isfinite(v) or v <= 0:
                continue
            w = 500 * v / top
            cells.append(f"<rect class='part' data-part='{part}' x='{x:.1f}' y='{i * 24 + 3}' width='{w:.1f}' "
                         f"height='16' fill='{PART_COLORS[part]}'><title>{part} {int(v)} B</title></rect>")
            x += w
        out.append(f"<text x='0' y='{i * 24 + 16}'>{name}</text>{''.join(cells)}"
                   f"<text x='{x + 6:.1f}' y='{i * 24 + 16}'>{h(int(_finite(mem.get(total))), 30)} B</text>")
    legend = " ".join(f"<span style='border-color:{c}'>{p}</span>" for p, c in PART_COLORS.items())
    detail = " + ".join(f"{p} {h(mem.get(k), 30)}" for p, k in TRAINING_PARTS)
    return (f"<p class='legend'>{legend}</p><svg class='memory-parts' width='700' height='52'>{''.join(out)}</svg>"
            f"<p class='mono'>training {h(mem.get('training_peak_bytes'), 30)} B = {detail} "
            f"(optimizer {h(mem.get('optimizer'), 20)}, {h(mem.get('optimizer_dtype'), 20)}; parts at the live "
            f"peak, during {h(mem.get('peak_step'), 120)})</p>")


def _memory(report: dict, timelines: dict) -> str:
    mem = report.get("memory") or {}
    figures = [(k, _finite(mem.get(k))) for k in MEMORY_FIGURES if k in mem]
    out = []
    if "training_peak_bytes" in mem:
        out.append(_stacked(mem))
    if figures:
        out.append(_bar_rows(figures))
    nodes = [d for d in mem.get("activations_by_node") or [] if isinstance(d, dict)]
    if nodes:
        more = f" (the largest {MAX_NODE_BARS} of {len(nodes)})" if len(nodes) > MAX_NODE_BARS else ""
        out.append(f"<h4>Activation bytes by node{more}</h4>")
        rows = [(f"{clip(d.get('node'), 40)} ({clip(d.get('op'), 20)})", _finite(d.get("bytes")))
                for d in nodes[:MAX_NODE_BARS]]
        out.append(_bar_rows(rows).replace("class='memory'", "class='memory-nodes'", 1))
    if timelines:
        out.append(_timeline(timelines))
    else:
        out.append("<p>No per-step memory timeline in this report (verify with --memory-timeline).</p>")
    return "".join(out)


def _timeline(timelines: dict) -> str:
    """The most bytes held during each forward/backward step, one line per run (plain,
    checkpointed, inference): each line's maximum is the run's live peak in the report."""
    width, height, colors = 640, 200, ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
    steps = max((len(v) for v in timelines.values()), default=0)
    top = max((b for v in timelines.values() for _, b in v), default=1) or 1
    lines, legend = [], []
    for c, (run, points) in zip(colors * 4, timelines.items()):
        if not points:
            continue
        xy = " ".join(f"{40 + (width - 50) * i / max(1, steps - 1):.1f},{height - 20 - (height - 30) * b / top:.1f}"
                      for i, (_, b) in enumerate(points))
        lines.append(f"<polyline fill='none' stroke='{c}' stroke-width='1.5' points='{xy}'><title>{h(run, 60)}"
                     f"</title></polyline>")
        legend.append(f"<span style='border-color:{c}'>{h(run, 60)}: peak {max(b for _, b in points)} B</span>")
    axis = (f"<line x1='40' y1='{height - 20}' x2='{width - 10}' y2='{height - 20}' stroke='#888'/>"
            f"<text x='40' y='{height - 5}'>step</text><text x='0' y='12'>{top} B</text>")
    return (f"<div class='legend'>{''.join(legend)}</div>"
            f"<svg class='timeline' width='{width}' height='{height}'>{axis}{''.join(lines)}</svg>")


def _verdict(item: RunItem) -> str:
    return str(item.report.get("verdict", "")) if item.report is not None else "invalid"


def _badge(verdict: str) -> str:
    return f"<span class='badge verdict-{h(verdict, 10)}'>{h(verdict.upper(), 10)}</span>"


def _faults(report: dict) -> str:
    """The injected faults, as the text report says them: what was changed, and which backward read it."""
    rows = report.get("faults") or []
    return "".join(f"<p class='fault'>fault <span class='mono'>{h(f.get('fault'), 120)}</span> "
                   f"({h(num(f.get('before')), 30)} → {h(num(f.get('after')), 30)}), read in the backward of: "
                   f"<span class='mono'>{h(', '.join(map(str, f.get('read_by') or [])) or 'no node', 300)}</span></p>"
                   for f in rows)


MAX_WARNINGS = 20  # warning lines shown per graph (the rest counted; the JSON has them all)


def _warnings(report: dict) -> str:
    """The report's warnings, as the text report's `warning:` lines (defaulted attributes, faults with no
    effect, what was skipped): the page says what the text says."""
    rows = [str(w) for w in report.get("warnings") or []]
    out = "".join(f"<p class='warning'>warning: {h(w, 600)}</p>" for w in rows[:MAX_WARNINGS])
    return out + (_more(len(rows) - MAX_WARNINGS, "warnings") if len(rows) > MAX_WARNINGS else "")


def _custom_ops(report: dict) -> str:
    """Each expr node's formula and whether its hand-written derivative is right."""
    rows = report.get("custom_ops") or []
    if not rows:
        return ""
    out = ["<h3>Custom ops (expr)</h3><table class='custom-ops'><tr><th>node</th><th>formula</th>"
           "<th>user derivative</th><th>detail</th></tr>"]
    for c in rows:
        ok = c.get("user_grad_matches")
        verdict = "none given" if not c.get("user_grad") else "matches SymPy's" if ok else "WRONG"
        out.append(f"<tr><td class='mono'>{h(c.get('node'), 80)}</td><td class='mono'>{h(c.get('formula'), 300)}"
                   f"</td><td>{h(verdict, 20)}</td><td>{h(c.get('detail'), 400)}</td></tr>")
    return "".join(out) + "</table>"


def _index(items: list[RunItem], order: list[int]) -> str:
    """What the page holds, failures first: verdict, a jump link, what failed and where."""
    counts: dict[str, int] = {}
    for item in items:
        counts[_verdict(item)] = counts.get(_verdict(item), 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda vn: vn[0] not in FAILED))
    rows = []
    for k in order:
        item = items[k]
        report = item.report or {}
        failing = [str(p.get("name")) for p in report.get("parameters") or []
                   if str(p.get("status", "")).startswith(("FAIL", "undecided", "affected"))]
        errors = [f for f in report.get("findings") or [] if f.get("severity") == "error"]
        if not failing and errors:  # a failing verdict always names its parameters: those its errors affect
            failing = list(dict.fromkeys(str(q) for f in errors for q in f.get("parameters") or []))
        where = f"{errors[0].get('cause')} at node {errors[0].get('node')}" if errors else item.error
        rows.append(f"<tr><td>{_badge(_verdict(item))}</td><td class='mono'><a href='#item-{k}'>"
                    f"{h(item.label, 200)}</a></td><td class='mono'>{h(', '.join(failing), 200)}</td>"
                    f"<td>{h(where, 300)}</td></tr>")
    return (f"<nav class='index'><p><strong>{len(items)} graph{'s' if len(items) != 1 else ''}: "
            f"{h(summary, 200)}</strong></p><table><tr><th>verdict</th><th>graph</th><th>failing parameters</th>"
            f"<th>first error</th></tr>{''.join(rows)}</table></nav>")


def _drawing(item: RunItem, k: int, report: dict, graphs: list, integrity: str, layout: str,
             deadline: float) -> str:
    """The graph section: the drawing (its data appended to `graphs`), or a note saying why there is none."""
    try:
        view = build_view(item.graph, report, integrity=integrity, layout=layout, deadline=deadline)
    except Exception as exc:  # noqa: BLE001 -- a drawing never decides the run: a note instead, and a warning
        print(f"gradcheck: warning: cannot draw graph {clip(item.label, 200)} ({type(exc).__name__}: "
              f"{clip(exc, 200)}); the page lists its findings without the drawing", file=sys.stderr)
        return f"<h3>Graph</h3><p class='legend'>not drawn: {h(type(exc).__name__, 60)}</p>"
    note = f"<p class='note'>{h(view.note, 400)}</p>" if view.note else ""
    if not view.nodes:
        return f"<h3>Graph</h3>{note}"
    host = f"graph-{k}"
    graphs.append({"host": host, "view": view.to_dict()})
    faulty = f"; faulty node <span class='mono'>{h(view.faulty, 80)}</span> and its path to the loss " \
             "drawn in red" if view.faulty else ""
    return (f"<h3>Graph</h3>{note}<p class='legend'>laid out by {h(view.layout, 10)}{faulty}. "
            "<span class='ok'>ok</span><span class='info'>info</span><span class='warning'>warning"
            "</span><span class='error'>error</span> "
            "(hover a node for its op, shape, fingerprint and local error)</p>"
            f"<div class='graph-host' id='{host}'></div>")


def build_html(items: list[RunItem], *, title: str = "gradcheck report", integrity: str = "check",
               layout: str = "auto", layout_seconds: float | None = None, max_bytes: int = MAX_PAGE_BYTES) -> str:
    """`layout_seconds`: dot's time budget for the whole page (graph_view.layout_budget)."""
    sections, graphs = {}, []
    deadline = layout_budget(layout_seconds)
    # failures first, each open; passing graphs collapsed below them
    order = sorted(range(len(items)), key=lambda k: _verdict(items[k]) not in FAILED)
    size, left_out = 0, 0
    for k in order:
        item = items[k]
        report = item.report
        if size > max_bytes:
            left_out += 1
            sections[k] = "<p class='note'>left out: the page reached its size limit (the index lists it)</p>"
            continue
        if report is None:
            sections[k] = f"<p class='verdict-fail'>{h(item.error, 600)}</p>"
            continue
        verdict = str(report.get("verdict", ""))
        body = [f"<p class='verdict-{h(verdict, 10)}'><strong>{h(verdict.upper(), 10)}</strong> "
                f"(loss {h(num(report.get('loss')), 40)}, {h(report.get('dtype'), 20)}, "
                f"{h(report.get('device'), 20)})</p>", _subject(report), _faults(report), _warnings(report),
                _custom_ops(report)]
        if item.graph is not None:
            body.append(_drawing(item, k, report, graphs, integrity, layout, deadline))
        elif item.no_graph:
            body.append(f"<h3>Graph</h3><p class='legend'>{h(item.no_graph, 200)}</p>")
        body.append("<h3>Findings</h3>" + _findings_table(report))
        body.append("<h3>Parameters</h3>" + _parameter_table(report))
        heat = _heatmaps(report)
        if heat:
            body.append("<h3>Error per element</h3>" + heat)
        # each step's most bytes held (peak_bytes; reports before it had live_bytes only)
        timelines = item.timelines or {
            t.get("run", ""): list(zip(t.get("steps") or [], t.get("peak_bytes") or t.get("live_bytes") or []))
            for t in report.get("memory_timelines") or []}
        body.append("<h3>Memory</h3>" + _memory(report, timelines))
        sections[k] = "".join(body)
        size += len(sections[k]) + (len(str(graphs[-1])) if graphs and graphs[-1]["host"] == f"graph-{k}" else 0)
    if left_out:
        print(f"gradcheck: warning: the HTML page reached its size limit ({max_bytes} bytes): {left_out} "
              "graphs are listed in its index only", file=sys.stderr)
    page = [f"<details id='item-{k}' class='item'{' open' if _verdict(items[k]) in FAILED else ''}>"
            f"<summary><h2 class='mono'>{_badge(_verdict(items[k]))} {h(items[k].label, 200)}</h2></summary>"
            f"<section>{sections[k]}</section></details>" for k in order]
    needs_dagre = any(g["view"]["layout"] == "dagre" for g in graphs)
    scripts = (f"<script>{_asset('vendor/dagre.min.js')}</script>" if needs_dagre else "") + \
        f"<script>{_asset('report_page/page.js')}</script>"
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<link rel='icon' href='data:,'>"
            f"<title>{h(title, 200)}</title><style>{_asset('report_page/page.css')}</style></head><body>"
            f"<h1>{h(title, 200)}</h1>{_index(items, order)}{''.join(page)}<div id='gradcheck-tip' hidden></div>"
            f"<script type='application/json' id='gradcheck-data'>{script_json({'graphs': graphs})}</script>"
            f"{scripts}</body></html>")


def index_page(items: list[RunItem], *, title: str = "gradcheck report") -> str:
    """The fallback page: the index alone (verdict, graph, failing parameters, first error)."""
    order = sorted(range(len(items)), key=lambda k: _verdict(items[k]) not in FAILED)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><link rel='icon' href='data:,'>"
            f"<title>{h(title, 200)}</title><style>{_asset('report_page/page.css')}</style></head><body>"
            f"<h1>{h(title, 200)}</h1><p class='note'>The full page could not be made: the verdicts only.</p>"
            f"{_index(items, order)}</body></html>")
