"""The difference formulas, each written once: steps, central and one-sided differences, the ladder.

Everything here is arithmetic on losses already evaluated (or on a function `evaluate` that evaluates
a stack of perturbed copies): finite_diff.py and fd_local.py decide what is perturbed and how it is
evaluated (a whole graph's forward, one op's), this module how the differences are taken.

    central(plus, minus, h)          (F(x + h) - F(x - h)) / 2h
    one_sided(base, near, far, h)    (-3 F(x) + 4 F(x + h) - F(x + 2h)) / 2h: second order, h < 0 the left side
    Moves                            what is perturbed: unit vectors at some flat elements, or rows of directions
    ladder(...) -> Refined           the refinement on a ladder of halving steps (finite_diff's docstring)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPS = np.finfo(np.float64).eps
STEP_SCALE = EPS ** (1.0 / 3.0)

# the refinement ladder: steps H 2^-j, j = 0..J, with H the power of two just above 2h (so every
# step is exact in binary and each halves the last); J reaches 1e-3 |x| below the smallest |x|
# the direction touches, within these bounds
LADDER_MIN = 10
LADDER_MAX = 30
LADDER_REACH = 1e-3
SETTLE_LEVEL = 3  # the first level a value may stop at: the one-sided estimates' first bound needs levels 1-3
ONE_SIDED = (1, 2, -1, -2)  # the step multiples one_sided_pair evaluates: right near, right far, left near, left far
KINDS = ("central", "richardson", "right", "left")


def central(plus, minus, h):
    """Central difference from F(x + h) and F(x - h): O(h^2) truncation."""
    return (plus - minus) / (2 * h)


def one_sided(base, near, far, h):
    """Second-order one-sided difference from F(x), F(x + h), F(x + 2h); a negative h gives the left
    side's, from F(x - |h|) and F(x - 2|h|). O(h^2) on each smooth piece -- a first-order one-sided
    difference would be off by O(h f'') -- so at a kink they bracket a right (sub)gradient closely.
    (+ 0.0: a zero difference is +0 on either side.)"""
    return (-3 * base + 4 * near - far) / (2 * h) + 0.0


@dataclass
class Moves:
    """What a difference perturbs x (flat, n) along: the unit vectors at flat elements `index`, or the
    rows of `directions` (m, n)."""

    flat: np.ndarray
    index: np.ndarray | None = None
    directions: np.ndarray | None = None

    def copies(self, rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """(len(rows), n): x moved by steps[c] along move rows[c] (NaN steps make NaN rows)."""
        if self.index is None:
            return self.flat + steps[:, None] * self.directions[rows]
        out = np.broadcast_to(self.flat, (len(rows), self.flat.size)).copy()
        out[np.arange(len(rows)), self.index[rows]] += steps
        return out

    def scale(self) -> np.ndarray:
        """Per move, the smallest |x| among the elements it moves noticeably (how far down the ladder goes)."""
        if self.index is not None:
            return np.abs(self.flat[self.index])
        big = np.abs(self.directions) > 1e-2 * np.max(np.abs(self.directions), axis=1, keepdims=True)
        return np.min(np.where(big, np.abs(self.flat)[None, :], np.inf), axis=1)

    def __len__(self) -> int:
        return len(self.index) if self.index is not None else len(self.directions)


def random_directions(n: int, k: int, seed: int = 0) -> np.ndarray:
    """k random unit vectors in R^n, (k, n): the same seed gives the same directions."""
    v = np.random.default_rng(seed).standard_normal((k, n))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def element_steps(flat: np.ndarray) -> np.ndarray:
    """Per-element step cbrt(eps) * max(1, |x|), rounded so that x + h - x == h exactly."""
    with np.errstate(invalid="ignore"):  # inf - inf: a non-finite input has no step (NaN)
        h = STEP_SCALE * np.maximum(1.0, np.abs(flat))
        return (flat + h) - flat


def projection_step(flat: np.ndarray) -> float:
    """One step for a whole direction: scaled by the largest element."""
    return STEP_SCALE * max(1.0, float(np.max(np.abs(flat))) if flat.size else 1.0)


def one_sided_pair(evaluate, base: float, moves: Moves, steps: np.ndarray):
    """(left, right) one_sided differences of F along every move, step steps[j] for move j; evaluate(stack
    (B, n)) -> F per row, base = F(x)."""
    m = len(moves)
    rows = np.arange(m)
    f = np.asarray(evaluate(np.concatenate([moves.copies(rows, c * steps) for c in ONE_SIDED]))).reshape(4, m)
    with np.errstate(all="ignore"):
        return one_sided(base, f[2], f[3], -steps), one_sided(base, f[0], f[1], steps)


@dataclass
class Refined:
    """Refined differences for some values of an FDResult (indices `which` into its reference)."""

    which: np.ndarray
    values: np.ndarray  # best estimate per value
    error: np.ndarray  # its estimated error: truncation + rounding; inf when no step gave one
    step: np.ndarray  # the step of the chosen estimate
    method: list[str]  # "central" | "richardson" | "right" | "left" (one-sided)


def _depth(h0: np.ndarray, scale: np.ndarray):
    """(the ladder's first step per move, how many halvings): from ~2h down to LADDER_REACH below scale."""
    with np.errstate(all="ignore"):  # a non-finite x: NaN steps, NaN estimates, an infinite bound
        top = 2.0 ** np.ceil(np.log2(2 * h0))
        need = np.where(scale > 0, np.ceil(np.log2(top / (LADDER_REACH * np.maximum(scale, 1e-300)))), 0)
    need = need[np.isfinite(need)]
    return top, int(np.clip(np.max(need, initial=0), LADDER_MIN, LADDER_MAX))


def ladder(evaluate, base: float, moves: Moves, h0: np.ndarray, which, settled=None) -> Refined:
    """Refined derivatives of a scalar function F of x (moves.flat) along every move, labelled `which`
    (the caller's indices of those values). evaluate(stack (B, n)) -> (F, |F| magnitude for the rounding
    term), base = F(x), h0 (m,) the first pass's steps. settled(values, error) -> mask: moves whose
    estimate is good enough for the caller; they stop descending the ladder (a mismatch far beyond the
    truncation error is confirmed in four levels, not thirty)."""
    m = len(h0)
    if m == 0:
        return Refined(np.zeros(0, np.intp), np.zeros(0), np.zeros(0), np.zeros(0), [])
    top, depth = _depth(h0, moves.scale())
    steps = top[None, :] * 2.0 ** -np.arange(depth + 1)[:, None]  # (J+1, m)
    plus, minus, mag = (np.full((depth + 1, m), np.nan) for _ in range(3))  # NaN: level not evaluated
    active = np.ones(m, bool)
    for j in range(depth + 1):
        rows = np.flatnonzero(active)
        k = rows.size
        f, size = evaluate(np.concatenate([moves.copies(rows, steps[j, rows]), moves.copies(rows, -steps[j, rows])]))
        plus[j, rows], minus[j, rows] = f[:k], f[k:]
        mag[j, rows] = np.fmax(np.fmax(size[:k], size[k:]), abs(base))  # a NaN side leaves the other
        # not before every kind has a bounded estimate (one-sided ones: levels 1-3): across a kink a few
        # steps away, central differences are off by s/2 (1 - t/h), gaps that level off rather than shrink,
        # so alone they underestimate their error (a ResNet's correct bias gradient was confirmed wrong)
        if settled is not None and SETTLE_LEVEL <= j < depth:
            values, error, _ = _best(plus, minus, mag, steps, base)
            active &= ~np.asarray(settled(values, error), dtype=bool)
            if not active.any():
                break
    values, error, pick = _best(plus, minus, mag, steps, base)
    cols = np.arange(m)
    return Refined(np.asarray(which), values, error, steps[pick % (depth + 1), cols],
                   [KINDS[p // (depth + 1)] for p in pick])


def _estimates(plus, minus, steps, base):
    """The four kinds of estimate per level (K=4, J+1, m) and their rounding factors: central differences,
    their Richardson extrapolation, the one-sided ones on each side (second order: level j with j - 1,
    whose step is twice j's)."""
    cen = central(plus, minus, steps)
    richardson, right, left = (np.full_like(cen, np.nan) for _ in range(3))
    richardson[1:] = (4 * cen[1:] - cen[:-1]) / 3
    right[1:] = one_sided(base, plus[1:], plus[:-1], steps[1:])
    left[1:] = one_sided(base, minus[1:], minus[:-1], -steps[1:])
    return (cen, richardson, right, left), (1, 2, 4, 4)


def _best(plus, minus, mag, steps, base):
    """(value, error bound, index of the candidate) per direction: the estimate with the smallest
    bound among central differences, their Richardson extrapolation and the one-sided ones, on
    the levels evaluated so far (NaN rows are levels not evaluated)."""
    with np.errstate(all="ignore"):
        rounding = 4 * EPS * mag / steps
        kinds, factors = _estimates(plus, minus, steps, base)
        bounds = []
        for values, round_factor in zip(kinds, factors):
            gap = np.abs(np.diff(values, axis=0))  # gap[j-1] = |E_j - E_(j-1)|
            # an estimate is as far from the truth as from its coarser neighbour (truncation shrinks
            # at least 4x per halving), and from its finer one: two neighbours, so one chance
            # agreement far from the truth is not taken for convergence (NaN until both exist)
            err = np.full_like(values, np.nan)
            err[1:] = gap
            err[1:-1] = np.maximum(err[1:-1], gap[1:])
            err += round_factor * rounding
            bounds.append(err)
        est = np.stack(kinds)  # (4, J+1, m)
        err = np.stack(bounds)
        err = np.where(np.isfinite(err) & np.isfinite(est), err, np.inf)
        # the four kinds estimate one derivative: where their best estimates disagree beyond their bounds,
        # the bounds do not hold for all of them -- a kink nearer than every step of the ladder: central
        # differences converge (to the mean of the one-sided slopes) with a tiny gap, the one-sided ones
        # each to their side's slope -- and an estimate's bound must reach the others'
        err = np.maximum(err, _disagreement(est, err))
    m = est.shape[-1]
    flat_err = err.reshape(-1, m)
    pick = np.argmin(flat_err, axis=0)
    cols = np.arange(m)
    error = flat_err[pick, cols]
    values = np.where(np.isfinite(error), est.reshape(-1, m)[pick, cols], np.nan)
    return values, error, pick


def _disagreement(est: np.ndarray, err: np.ndarray) -> np.ndarray:
    """est, err (K kinds, J+1 levels, m): for each estimate, the error it has if another kind's best
    estimate best_k (bound bound_k) disagrees with it beyond both bounds -- the truth may be best_k, so
    |estimate - best_k| + bound_k, the largest over such kinds; -inf where none disagrees (the kinds
    agree within their bounds: nothing changes)."""
    level = np.argmin(err, axis=1)[:, None, :]  # (K, 1, m): each kind's best level
    best = np.take_along_axis(est, level, axis=1)[:, 0]  # (K, m)
    bound = np.take_along_axis(err, level, axis=1)[:, 0]
    out = np.full(est.shape, -np.inf)
    with np.errstate(invalid="ignore"):
        for b, e in zip(best, bound):
            off = np.abs(est - b)
            out = np.fmax(out, np.where(np.isfinite(e) & (off > err + e), off + e, -np.inf))
    return out
