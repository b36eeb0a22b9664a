"""The reference is the function's values (issue 42, item 2): torch's gradient against directional
differences of the whole function, re-run as the user wrote it.

The captured graph follows the ops torch dispatched; a path autograd does not see -- a `.detach()`,
`.item()` or `.data` read, a `torch.no_grad()` block, a `.numpy()` round trip -- is a constant there, so
the graph agrees with torch's gradient even when the function's values depend on the input through it.
torch.autograd.gradcheck's numerical Jacobian differentiates the values, and so does this screen: the
function (module hooks, tensor and parameter hooks all as registered) is re-run at x + t v along
SCREENS seeded Gaussian directions v over every checked tensor, and

    d/dt L(x + t v) at 0  (central differences at steps h and h/2, Richardson-extrapolated, error bound:
                           their gap plus the rounding term 4 eps M / (h/2), M the reduction's |terms|)

(M also covers the largest intermediate's magnitude: `x + 1e8 - 1e8` rounds at 1e8's scale) is
compared with <g, v>, g torch's gradient as claimed in the main check, as an opaque node's element is
(opaque._judged: beyond twice the bound plus opaque.RTOL relative fails; at a kink along v -- the
one-sided derivatives differ -- <g, v> must lie between them). The screen only adds failures: it never
passes what the graph check failed. What it resolves: a gradient error e with |<e, v>| above that; for a
Gaussian v, |<e, v>| < 1e-3 |e| has probability about 1e-3 per direction. Where the differences'
truncation is not small (a kink within the step) the screen is inconclusive and says so; with a cut
seen in the capture, the report is then "undecided", never "pass".

The capture records where the forward cut torch's graph on a traced tensor (capture.cuts: a detached
alias read by a later op, `.item()`, an op under no_grad outside a custom Function's forward,
`.numpy()`); a failing screen names those lines.
"""
from __future__ import annotations

import numpy as np
import torch

from . import culprits
from .culprits import values_line
from .opaque import _Difference, _judged

EPS = float(np.finfo(np.float64).eps)
SCREENS = 2  # directions; each costs four forward runs, and the unmoved one a fifth once


class ShapeMoved(Exception):
    """A re-run's output has another shape than the checked run's: no difference of the values exists."""


def output_tensors(out) -> list:
    """fn's outputs in order: a tensor, or the leaves of a tuple or list of them, nested as nn.LSTM's
    (output, (h, c)) is."""
    return torch.utils._pytree.tree_leaves(out) if isinstance(out, (tuple, list)) else [out]


def reducer(out, kept: list, weights: list):
    """The main check's reduction of fn's output to a scalar: each output it kept (those depending on a checked
    input, found by position in `out`) times its cotangent weights (None: a scalar output itself)."""
    outs = output_tensors(out)
    picks = [next(i for i, o in enumerate(outs) if o is k) for k in kept]
    shapes = [tuple(outs[i].shape) for i in picks]

    def reduce(out):
        outs = output_tensors(out)
        moved = [(s, tuple(outs[i].shape)) for s, i in zip(shapes, picks) if tuple(outs[i].shape) != s]
        if moved:
            raise ShapeMoved(f"the output's shape depends on the input's values ({list(moved[0][0])} at the "
                             f"input, {list(moved[0][1])} beside it)")
        terms = [(outs[i].detach().reshape(()) if c is None else outs[i].detach() * c) for i, c in zip(picks, weights)]
        return (float(sum(t.sum() for t in terms)), float(sum(t.abs().sum() for t in terms)))
    return reduce


def screen(run, leaves: dict, reduce, grads: dict, capture, seed: int, eps: float = EPS) -> dict:
    """The screen's entry: verdict (pass | fail | undecided), detail, and the cuts seen. Each direction is judged
    as an opaque node's element is (opaque._judged): at a kink along v, torch's value must lie between the
    one-sided derivatives."""
    names = [n for n, t in leaves.items() if t.numel()]
    cuts = capture.cuts
    # the forward's rounding is relative to its largest intermediate (x + 1e8 - 1e8), not only to its output
    size = max([0.0] + [float(t.detach().abs().max()) for t, _ in capture.produced if t.numel()])
    rng = np.random.default_rng([seed, 42])
    inconclusive, zero = None, []  # zero: L(x) itself, run once for every direction
    for k in range(SCREENS):
        v = {n: torch.from_numpy(rng.standard_normal(tuple(leaves[n].shape))).to(leaves[n]) for n in names}
        claimed = sum(float((torch.from_numpy(np.asarray(grads[n])).to(v[n]) * v[n]).sum()) for n in names)
        try:
            verdict, ref, bound = _judged(_directional(run, leaves, reduce, v, eps, size, zero), claimed)
        except ShapeMoved as exc:  # never a pass: the report is undecided, whatever the capture saw
            return {**_entry("undecided", cuts, f"not screened: {exc}"), "decisive": True}
        if verdict == "fail":
            return _entry("fail", cuts, f"along direction {k} (seeded N(0, 1) over {', '.join(names)}): torch's "
                                        f"gradient gives {claimed:.6g}, the function's values {ref:.6g} +- {bound:.2g}")
        if verdict == "undecided":
            inconclusive = f"direction {k}: the differences' truncation is not small next to them"
    if inconclusive is not None:
        return _entry("undecided", cuts, f"inconclusive: {inconclusive}")
    return _entry("pass", cuts, f"torch's gradient follows the function's values along {SCREENS} seeded directions")


def _entry(verdict: str, cuts: list, detail: str) -> dict:
    return {"verdict": verdict, "detail": detail, "cuts": list(cuts),
            "checked": f"the function re-run at x + t v, {SCREENS} seeded directions v, central differences "
                       "(h, h/2, Richardson) against torch's gradient along v"}


def _directional(run, leaves: dict, reduce, v: dict, eps: float, size: float, zero: list) -> _Difference:
    """d/dt L(x + t v) at 0 (opaque._Difference: Richardson's value, bound, one-sided ones), each leaf moved in
    place and restored; `size`: the largest intermediate's magnitude, which the rounding term covers too;
    `zero`: [L(x)] once a direction has run it (the same for every direction), else [] (filled here)."""
    base = {n: leaves[n].detach().clone() for n in v}
    h = float(np.cbrt(eps)) * max(1.0, max(float(b.abs().max()) for b in base.values()))
    h /= max(1.0, max(float(d.abs().max()) for d in v.values()))

    def at(t: float):
        with torch.no_grad():
            for n, d in v.items():
                leaves[n].copy_(base[n] + t * d)
        try:
            return reduce(run())
        finally:
            with torch.no_grad():
                for n in v:
                    leaves[n].copy_(base[n])
    (p1, m1), (n1, m2), (p2, m3), (n2, m4) = (at(s) for s in (h, -h, h / 2, -h / 2))
    if not zero:
        zero.append(at(0.0))
    l0, m0 = zero[0]
    d1, d2 = (p1 - n1) / (2 * h), (p2 - n2) / h
    value = (4 * d2 - d1) / 3
    truncation = abs(value - d2)
    rounding = 4 * eps * max(m0, m1, m2, m3, m4, size) / (h / 2)
    return _Difference(value, truncation + rounding, truncation, rounding,
                       left=(3 * l0 - 4 * n2 + n1) / h, right=(-3 * l0 + 4 * p2 - p1) / h)


def judged(report) -> None:
    """The screen's verdict in the report: a failing screen fails it, naming the lines where torch's graph was
    cut; an inconclusive one with a cut seen leaves a passing report undecided."""
    entry = report.data.get("check", {}).get("function_values")
    if not entry or entry["verdict"] == "pass":
        return
    cuts = entry["cuts"]
    where = ("; torch's graph was cut at " + ", ".join(cuts)) if cuts else ""
    if any(e.get("verdict") == "surrogate" for key in ("opaque", "custom_functions") for e in report.data.get(key, ())):
        # a declared surrogate's backward is deliberately not the derivative of the values: the screen would
        # flag the declaration itself, so it is waived -- and the report says so. A cut of torch's graph
        # elsewhere is then decided by nothing: not a pass (torch's gradcheck fails it)
        entry["verdict"] = "waived"
        report.text = ("the function's values: not screened (a declared surrogate's backward is, by "
                       f"declaration, not their derivative)\n{report.text}")
        if cuts and report.verdict == "pass":
            report.verdict = report.data["verdict"] = "undecided"
            _below_culprits(report, values_line("UNDECIDED", f"torch's graph was cut at {', '.join(cuts)}, and a "
                                                "declared surrogate waives the screen that would decide whether "
                                                "that matters"))
        return
    if entry["verdict"] == "fail":
        report.verdict = report.data["verdict"] = "fail"
        _below_culprits(report, values_line("FAIL", "torch's gradient disagrees with the derivative of the function's "
                                                f"values, {entry['detail']}{where}"))
    elif (cuts or entry.get("decisive")) and report.verdict == "pass":
        report.verdict = report.data["verdict"] = "undecided"
        _below_culprits(report, values_line("UNDECIDED", f"{entry['detail']}{where}"))


def _below_culprits(report, line: str) -> None:
    """line on top of the report's text, but below the lines naming a custom Function or opaque node that did not
    pass, or the node the graph's check localized (culprits.heading): the culprit named stays the first line (the
    screen says only that torch's gradient is off)."""
    lines, k = report.text.split("\n"), culprits.heading(report)
    report.text = "\n".join(lines[:k] + [line] + lines[k:])
