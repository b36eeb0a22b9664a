"""What the joint screen judges in place of a low-precision gradient: the engine's float64 gradient of the
same graph, wherever the gradient under test is within its tolerance of it element by element.

Why. The screen holds a group of parameter blocks to a floor of about rms(b) / sqrt(n) per direction
(joint_check: one element of n past its tolerance b moves a unit projection by b / sqrt(n)), which assumes the
subject's legitimate rounding projects far below that. A float64 gradient's does (~1e-16 relative); a float32
one's does not: ~1e-7 relative in every element, whose projection does not shrink with sqrt(n). A correct
float32 MLP 256 wide (65,536-element weights) -- the engine's own float32 gradients or float32 claims -- had its
weights flagged, not narrowed below thousands of elements, and the verification FAILED as undecided.

What is judged instead. G, the engine's float64 gradient (of the FD oracle's own float64 program, at the
same point; made here for a float32/float16 engine, or the engine's run itself where the graph runs in float64
and only the claims are float32), element by element wherever the subject S is within its own tolerance of it
(|S_i - G_i| <= b_i, b as the screen's own, joint_check.element_bounds: an exact elementwise comparison, not a
projection); S_i itself wherever it is not. Sound: what the screen judges, M, is within b_i of S in every
element, so an element of S off the truth by (RESOLVE + 1) b_i leaves M off by at least RESOLVE b_i -- which
the screen sees at its stated power. A rule bug shows in G (the same rule in float64); a float32-only one (an
overflow, a cancellation) past the tolerance keeps S's value. Rows the screen cleared or narrowed then show
M's directional values; the plan names the parameters stood in (FDPlan.stand_in), the text report says so.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .engine_run import run_engine
from .joint_check import element_bounds

LOW_PRECISION = frozenset({"float32", "float16", "bfloat16"})


def screened(run, subject: dict, params: list[str], tol, tol_dtype: str) -> tuple[dict, dict]:
    """(what the screen judges per parameter, parameter -> why, for those stood in). run: the diagnosis
    context's Run (graph, options, dtype, engine); subject: the gradients under test; tol_dtype: the precision
    the subject is held to (subject.tolerance_dtype)."""
    if tol_dtype not in LOW_PRECISION or not params:
        return subject, {}
    g64 = run.engine.gradients if run.dtype == "float64" else float64_gradients(run.graph, run.options)
    said = f"the engine's float64 gradient where its {tol_dtype} elements are within tolerance"
    out, why = dict(subject), {}
    for p in params:
        s, g = np.asarray(subject[p], dtype=np.float64), np.asarray(g64[p], dtype=np.float64)
        if s.shape != g.shape:
            continue
        near = np.abs(s - g) <= element_bounds(s, tol).reshape(s.shape)  # NaN: never near
        if near.any():
            out[p], why[p] = np.where(near, g, s), said
    return out, why


def float64_gradients(graph, options) -> dict:
    """The engine's gradients of graph in float64: its reported run alone (no memory profile), with no fault
    injected -- a fault's effect on the subject then shows in the elementwise gate -- and no fingerprints (its
    saved tensors are the subject's run's business)."""
    plain = dataclasses.replace(options, faults=(), memory_timeline=False, integrity="off")
    return run_engine(graph, plain, "float64", profile=False).gradients
