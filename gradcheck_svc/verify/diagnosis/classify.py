"""Why the node localization found is wrong: at a declared kink -> nondifferentiable_point (a
warning when the engine's gradient lies between the one-sided differences); its vjp wrong in
isolation at the forward's values -> rule_error; right in float64 but the float32 engine is off
by no more than a float32 evaluation of the same rule -> precision (a note); right in isolation
yet wrong in the run beyond rounding -> the backward read different values than the forward
made (cache_corruption, inferred). Every consumer right but their sum wrong -> precision
(accumulation); beyond rounding with a single consumer there is no sum to blame: a gradient_mismatch
naming the value.
"""
from __future__ import annotations

import numpy as np

from ...engine.program import Step
from ...oracles.fd_modes import FDMode
from ...oracles.finite_diff import EPS, STEP_SCALE, element_steps, projection_step
from ..compare import Tolerance, compare
from ..fd_check import fd_check
from ..findings import Finding, WorstElement
from .context import Context, inputs_at
from .localize import LocalCheck, Located
from .rules import rule_contribution

EPS32 = float(np.finfo(np.float32).eps)
KINK_BAND = 100 * STEP_SCALE  # relative distance to a kink within which FD straddles it
FLIP_BAND = 64 * EPS32  # relative distance within which a float32 forward may choose another piece
ONE_SIDED_MAX = 64  # failing elements checked one-sidedly per parameter


def _worst_of(check: LocalCheck, values: np.ndarray, reference: np.ndarray | None = None) -> WorstElement:
    """Worst element of a local check: an index of the input (full) or a direction (projection)."""
    if check.directions is None:
        ref = check.reference if reference is None else reference
        cmp = compare(values.reshape(-1), ref, Tolerance.for_dtype("float64"))
        idx = np.unravel_index(cmp.worst_index[0], check.engine.shape) if check.engine.shape else ()
        return WorstElement(tuple(int(i) for i in idx), cmp.engine_at_worst, cmp.reference_at_worst)
    proj = check.directions @ values.reshape(-1)
    j = int(np.argmax(np.abs(proj - check.reference)))
    return WorstElement(("direction", j), float(proj[j]), float(check.reference[j]))


def _projected(check: LocalCheck, values: np.ndarray) -> np.ndarray:
    return values.reshape(-1) if check.directions is None else check.directions @ values.reshape(-1)


def classify(ctx: Context, loc: Located, params: list[str]) -> Finding:
    if loc.culprit is None:
        # every local derivative agrees (a tie split evenly matches a central difference), yet the
        # total does not: first suspect a kink under the parameter-level differences
        for c in loc.consumers:
            near = near_kink(c.step, [ctx.fd.base[n] for n in c.step.inputs], ctx.fd.frozen, ctx.dtype)
            if near is not None:
                return _nondifferentiable(ctx, c.step, near, params)
        return _accumulation(ctx, loc, params)
    c = loc.culprit
    step, k = c.step, c.k
    name = step.inputs[k]
    where = f"input {k} ('{name}')"
    xs64 = [ctx.fd.base[n] for n in step.inputs]
    near = near_kink(step, xs64, ctx.fd.frozen, ctx.dtype)
    if near is not None:
        return _nondifferentiable(ctx, step, near, params)
    shape = ctx.program.shapes[name]
    rule64 = rule_contribution(step, xs64, ctx.fd.base[step.name], c.adjoint, k, shape)
    # the same FD error bound as the check that found it: refined where the rule disagrees
    rule_cmp = fd_check(_projected(c, rule64), c.reference, c.error, Tolerance.for_dtype("float64"),
                        c.refine).comparison
    if not rule_cmp.passed:
        w = _worst_of(c, rule64)
        return Finding(step.name, step.op.name, "rule_error", "error",
                       f"its vjp disagrees with the derivative of its own forward at the forward's values, for "
                       f"{where}: {w.engine:.8g} vs {w.reference:.8g}", params, w)
    if ctx.dtype == "float32":
        note = _precision(ctx, c, rule64, params)
        if note is not None:
            return note
    w = _worst_of(c, c.engine, _projected(c, rule64) if c.directions is None else None)
    return Finding(step.name, step.op.name, "cache_corruption", "error",
                   f"its vjp is right at the forward's values, yet the backward's gradient for {where} differs "
                   f"({w.engine:.8g} vs {w.reference:.8g}): it read values other than the forward's "
                   f"(integrity checking {ctx.options.integrity})", params, w)


def near_kink(step: Step, xs: list, frozen=(), dtype: str = "float64"):
    """The kink an input of this step sits at (or within a finite-difference step of), or None. A step
    finite differences evaluate on its frozen piece (its name in `frozen`, FiniteDifferences.frozen)
    straddles no kink: only an input exactly at one counts (where the piece is a convention) -- or, for
    a float32 engine, within FLIP_BAND of one, where its forward may take another piece than the float64
    forward the differences froze."""
    band = (FLIP_BAND if dtype == "float32" else 0.0) if step.name in frozen else KINK_BAND
    for kink in step.op.kinks:
        if kink.distance is None:
            continue
        d = np.asarray(kink.distance(xs, step.attrs), dtype=np.float64)
        scale = max(1.0, max((float(np.max(np.abs(x))) for x in xs if np.size(x)), default=1.0))
        if d.size and float(np.min(d)) <= band * scale:
            at = np.unravel_index(int(np.argmin(d)), d.shape) if d.shape else ()
            return kink, tuple(int(i) for i in at)
    return None


def _nondifferentiable(ctx: Context, step: Step, near, params: list[str]) -> Finding:
    """Engine (sub)gradient vs the one-sided differences on each side, per failing parameter."""
    kink, at = near
    outside = []
    worst = None
    for r in ctx.results:
        if r.name not in params or r.passed:
            continue
        dirs, hs, eng, labels = _moves(ctx, r)
        lo, hi, _, _ = one_sided(ctx, r, (dirs, hs, eng, labels))
        slack = side_slack(ctx.tol, lo, hi)
        bad = (eng < lo - slack) | (eng > hi + slack)
        bad |= ~bad & _wrong_beside(ctx, r.name, dirs, hs, eng, lo, hi, slack)
        if bad.any() or not eng.size:  # (no moves of its own: never shown within the one-sided differences)
            outside.append(r.name)
        if worst is None and eng.size:
            j = int(np.argmax(bad)) if bad.any() else 0
            worst = WorstElement(labels[j], float(eng[j]), float(0.5 * (lo[j] + hi[j])))
    x = inputs_at(step, ctx.fd.base, at)
    d = np.asarray(kink.distance([ctx.fd.base[n] for n in step.inputs], step.attrs), dtype=np.float64)
    gap = float(d[at]) if d.shape else float(d)
    # exactly on it, the value is a convention; near it, the differences straddle it
    head = (f"an input is exactly at its kink {kink.where} ({x}; convention: {kink.convention})" if gap == 0 else
            f"an input is near its kink {kink.where}, {gap:.3g} from it -- within a finite-difference step "
            f"({x}; convention at the kink: {kink.convention})")
    if outside:
        return Finding(step.name, step.op.name, "nondifferentiable_point", "error",
                       f"{head}, and {ctx.whose} gradient of {', '.join(outside)} lies outside the one-sided "
                       "differences (at the kink: between them; beside it: the one derivative that differences at "
                       "a step below its distance give)", params, worst)
    return Finding(step.name, step.op.name, "nondifferentiable_point", "warning",
                   f"{head}; central differences straddle it, and {ctx.whose} (sub)gradient lies between the "
                   "one-sided differences: not a failure", params, worst)


def side_slack(tol: Tolerance, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How far outside the one-sided differences [lo, hi] a (sub)gradient may lie: the tolerance, plus the
    differences' own error (O(h^2) on each piece, ~1e-6 of their gap)."""
    return tol.atol * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi))) + \
        tol.rtol * np.maximum(np.abs(lo), np.abs(hi)) + 1e-6 * np.maximum(1.0, np.abs(hi - lo))


BESIDE_LEVELS = (6, 10, 14)  # finer one-sided steps tried beside a kink: h / 2**k


def _wrong_beside(ctx: Context, name: str, dirs, hs, eng, lo, hi, slack) -> np.ndarray:
    """Of the values inside the hull [lo, hi] of the straddling one-sided differences, those a rule wrong
    *beside* the kink gives: where one-sided differences at a finer step (below the distance to the kink)
    agree, the value is not at the kink but beside it, with one derivative v; only v is right there -- or,
    for a float32 engine whose forward may take the other piece (FLIP_BAND), either piece's own derivative,
    lo or hi (the straddling differences, off by at most about the fine step's share of their gap). The
    hull excuses only values exactly at a kink, where no step separates the sides (issue 44: relu's rule
    50% wrong 1e-8 from 0 passed in float32 as ok (kink))."""
    wrong = np.zeros(len(eng), bool)
    todo = np.ones(len(eng), bool)
    noise = 4 * EPS * (abs(ctx.fd.loss) + 1.0)
    for k in BESIDE_LEVELS:
        if not todo.any():
            break
        rows = np.flatnonzero(todo)
        fine = hs[rows] * 2.0 ** -k
        left, right = ctx.fd.one_sided(name, dirs[rows], fine)
        rounding = 4 * noise / fine
        agree = np.abs(left - right) <= slack[rows] + 2 * rounding
        v = 0.5 * (left + right)
        right_here = np.abs(eng[rows] - v) <= slack[rows] + rounding
        if ctx.dtype == "float32":
            reach = slack[rows] + 2 ** (4 - k) * (hi[rows] - lo[rows])  # the straddle's error, t < 16 fine
            right_here |= (np.abs(eng[rows] - lo[rows]) <= reach) | (np.abs(eng[rows] - hi[rows]) <= reach)
        wrong[rows] = agree & ~right_here
        todo[rows] = ~agree
    return wrong


def _moves(ctx: Context, r):
    """(directions, steps, engine, labels) for the failing elements (full) or directions (projection) of
    parameter r: what one_sided differences along."""
    fd = ctx.fd
    x = np.asarray(fd.base[r.name], dtype=np.float64).reshape(-1)
    if r.fd.mode is FDMode.JOINT:  # judged by the joint screen's directions: none of its own to difference along
        return np.zeros((0, x.size)), np.zeros(0), np.zeros(0), []
    elements = _off_the_witness(ctx, r) if r.fd.mode is FDMode.PROJECTION else None
    if elements is not None:
        return _element_moves(r, x, elements)
    if r.fd.mode is FDMode.PROJECTION:
        dirs = r.fd.directions
        eng = np.asarray(r.fd.engine_projection)
        hs = np.full(len(dirs), projection_step(x))
        labels = [("direction", j) for j in range(len(dirs))]
    else:
        g, ref = r.gradient.reshape(-1), np.asarray(r.fd.reference).reshape(-1)
        bound = ctx.tol.absolute(float(np.max(np.abs(ref)))) + ctx.tol.rtol * np.abs(ref)
        return _element_moves(r, x, np.flatnonzero(~(np.abs(g - ref) <= bound))[:ONE_SIDED_MAX])
    return dirs, hs, eng, labels


def _element_moves(r, x: np.ndarray, failing: np.ndarray):
    """_moves along the coordinate directions of elements `failing` (flat)."""
    dirs = np.zeros((failing.size, x.size))
    dirs[np.arange(failing.size), failing] = 1.0
    labels = [tuple(int(i) for i in np.unravel_index(f, r.shape)) for f in failing]
    return dirs, element_steps(x[failing]), r.gradient.reshape(-1)[failing], labels


def _off_the_witness(ctx: Context, r) -> np.ndarray | None:
    """A claim checked by projections, at a kink: the elements where it differs from the engine's gradient
    (the third witness), when the engine's agrees with every directional difference and they are few --
    each is then judged against its own one-sided differences. Along a dense direction through many ties
    (a max-pool's windows, weighted with both signs) the one-sided differences bound the projections of only
    some of the subgradients: another valid convention (each window's last maximum) fell outside them.
    None: judge the projections."""
    witness = ctx.subject.witness(ctx.engine, r.name)
    if witness is None or r.fd.directions is None:
        return None
    witness = np.asarray(witness, dtype=np.float64).reshape(-1)
    if not compare(r.fd.directions @ witness, r.fd.reference, ctx.tol, r.fd.error).passed:
        return None
    g = r.gradient.reshape(-1)
    bound = ctx.tol.absolute(float(np.max(np.abs(witness), initial=0.0))) + ctx.tol.rtol * np.abs(witness)
    off = np.flatnonzero(~(np.abs(g - witness) <= bound))
    return off if 0 < off.size <= ONE_SIDED_MAX else None


def one_sided(ctx: Context, r, moves=None):
    """(low, high, engine, labels) for the failing elements (full) or directions (projection) of
    parameter r: the one-sided differences on each side, and the engine's value (empty for a row the joint
    screen judged: _moves). moves: _moves(ctx, r), when the caller has them."""
    dirs, hs, eng, labels = moves or _moves(ctx, r)
    if not len(dirs):
        return np.zeros(0), np.zeros(0), eng, labels
    left, right = ctx.fd.one_sided(r.name, dirs, hs)
    return np.minimum(left, right), np.maximum(left, right), eng, labels


def _precision(ctx: Context, c: LocalCheck, rule64: np.ndarray, params: list[str]) -> Finding | None:
    """float32 engine, right rule: a note if the error is no bigger than a float32 evaluation of the
    same rule at the same values makes; None if it is bigger (then rounding does not explain it)."""
    step, k = c.step, c.k
    clean = ctx.clean()
    xs32 = [clean[n] for n in step.inputs]
    rule32 = rule_contribution(ctx.program.by_name[step.name], xs32, clean[step.name],
                               c.adjoint.astype(np.float32), k, ctx.program.shapes[step.inputs[k]])
    band = 4 * np.abs(_projected(c, rule32) - _projected(c, rule64)) + \
        4 * EPS32 * (np.abs(_projected(c, np.abs(rule64))) + 1e-30)
    err = np.abs(_projected(c, c.engine) - _projected(c, rule64))
    if not np.all(err <= band):
        return None
    w = _worst_of(c, c.engine, _projected(c, rule64) if c.directions is None else None)
    return Finding(step.name, step.op.name, "precision", "info",
                   f"float32 rounding: its vjp for input {k} ('{step.inputs[k]}') is off by no more than a "
                   f"float32 evaluation of the same rule at the same values ({w.engine:.8g} vs {w.reference:.8g}; "
                   f"band {float(np.max(band)):.3g}); pass", params, w)


def _accumulation(ctx: Context, loc: Located, params: list[str]) -> Finding:
    """Every consumer's contribution is right, their sum is not: cancellation when adding them up."""
    v = loc.value
    parts = loc.consumers
    dirs = parts[0].directions if parts else None
    total = sum(c.engine for c in parts) if parts else np.zeros(ctx.program.shapes[v])
    ref = sum(c.reference for c in parts) if parts else np.zeros(0)
    proj = (lambda a: a.reshape(-1)) if dirs is None else (lambda a: np.abs(dirs) @ a.reshape(-1))
    err = np.abs((total.reshape(-1) if dirs is None else dirs @ total.reshape(-1)) - ref)
    magnitude = proj(sum(np.abs(c.engine) for c in parts)) if parts else np.zeros(0)
    eps = EPS32 if ctx.dtype == "float32" else EPS
    band = 16 * eps * magnitude + ctx.tol.atol
    who = ", ".join(f"'{c.step.name}'" for c in parts)
    ok = bool(np.all(err <= band))
    if not ok and len(parts) < 2:  # beyond rounding, and nothing is summed: no cancellation to blame
        return Finding(v, ctx.op_of(v), "gradient_mismatch", "error",
                       f"its gradient is wrong ({loc.worst.engine:.8g} vs {loc.worst.reference:.8g}) beyond "
                       f"{ctx.dtype} rounding while the adjoint of {who or 'its consumer'} is right, yet that "
                       "contribution agrees with finite differences of its forward within their error: no single "
                       "node is confirmed", params, loc.worst)
    return Finding(v, ctx.op_of(v), "precision", "info" if ok else "error",
                   f"each contribution to its gradient (from {who}) is right, but their sum cancels "
                   f"({loc.worst.engine:.8g} vs {loc.worst.reference:.8g}): {ctx.dtype} rounding of terms as "
                   f"large as {float(np.max(magnitude, initial=0)):.3g}"
                   + ("; within the rounding band, pass" if ok else ", beyond the rounding band"),
                   params, loc.worst)
