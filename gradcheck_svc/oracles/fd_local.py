"""One op's differences: J_k^T a of a single step by differences of its forward alone (localization, claims).

    local_vjp(step, xs, k, a, directions)              central differences, every element or projected
    refine_local_vjp(step, xs, k, a, directions, which)  those values refined on the ladder
    local_one_sided(step, xs, k, a, directions, steps) one-sided on each side (at a kink); along single
                                                        elements, on the changed slice only

Frozen like the parameter-level differences (the step on the piece it took at xs), except the one-sided
ones, which judge the kink itself and so use the ordinary forward. The formulas are fd_formulas'.
"""
from __future__ import annotations

import numpy as np

from ..engine.executor import HELD, frozen_step, run_step, run_step_batched, selection_of
from ..ops.slices import one_hot
from .fd_formulas import EPS, ONE_SIDED, Moves, Refined, central, ladder, one_sided, one_sided_pair, projection_step


def _weighted_output(step, xs: list, k: int, a: np.ndarray, frozen: bool = True):
    """stack (B, n) of input k -> (sum(a * (step(..., x_k, ...) - y)), its rounding scale) per row, y the
    step's output at xs: the scalar whose gradient in x_k is J_k^T a, centered on y so that its rounding
    scales with what the perturbation changes, not with the whole output (a one-element change of a
    65,536-element matmul input moves one column: summing a * out over every element would bury a wrong
    contribution under the rounding of all the others). The scale sums |a| (|out| + |y|) over the
    elements that moved; those that did not are bit-identical and contribute exactly nothing.
    frozen: the step on its piece at xs (frozen branches, as the parameter-level differences), else by
    its ordinary forward (the one-sided differences at a kink)."""
    x = np.asarray(xs[k], dtype=np.float64)
    grads = [i == k for i in range(len(xs))]
    piece = selection_of(np, step, [np.asarray(v) for v in xs]) if frozen else None

    def run(stack):
        args = list(xs)
        args[k] = stack.reshape((len(stack),) + x.shape)
        with np.errstate(all="ignore"):
            if piece is HELD:  # piecewise constant: every copy is the unperturbed output
                y = np.asarray(run_step(np, step, list(xs)) if y is None else y, dtype=np.float64)
                return np.broadcast_to(y, (len(stack),) + y.shape)
            if piece is not None:
                return np.asarray(frozen_step(np, step, piece, args, grads), dtype=np.float64)
            return np.asarray(run_step_batched(np, step, args, grads), dtype=np.float64)
    y = run(x.reshape(1, -1))[0]
    weights = np.broadcast_to(np.asarray(a, dtype=np.float64), y.shape)

    def evaluate(stack):
        # one (B, *out) buffer for both sums, written in place: a 4-copy one-sided stack of a 524k-element
        # relu held five such temporaries at once (80 MiB for a 13 MiB training peak)
        out = run(stack)
        moved = out != y
        with np.errstate(all="ignore"):
            work = np.subtract(out, y)
            work *= weights
            change = work.reshape(len(stack), -1).sum(axis=1)
            np.abs(out, out=work)
            work += np.abs(y)
            work *= np.abs(weights)
            work[~moved] = 0.0
            return change, work.reshape(len(stack), -1).sum(axis=1)
    return evaluate


def _moves(flat: np.ndarray, directions: np.ndarray | None, which: np.ndarray) -> Moves:
    """The moves of values `which`: the elements themselves (directions None) or those rows of directions."""
    return Moves(flat, index=which) if directions is None else Moves(flat, directions=directions[which])


def local_vjp(step, xs: list, k: int, a: np.ndarray, directions: np.ndarray | None):
    """J_k^T a of one step at inputs xs (float64, host), by central differences of its forward alone:
    every element of input k (directions None) or projected on directions (m, n). Returns
    (values, noise)."""
    flat = np.asarray(xs[k], dtype=np.float64).reshape(-1)
    d = np.eye(flat.size) if directions is None else directions
    m = d.shape[0]
    h = projection_step(flat)
    proj, size = _weighted_output(step, xs, k, a)(np.concatenate([flat + h * d, flat - h * d]))
    with np.errstate(all="ignore"):
        ref = central(proj[:m], proj[m:], h)
        noise = 8 * EPS * (size[:m] + 1.0) / h
    return ref, noise


def refine_local_vjp(step, xs: list, k: int, a: np.ndarray, directions: np.ndarray | None,
                     which: np.ndarray, settled=None) -> Refined:
    """local_vjp's values at indices `which` (elements, or rows of directions), refined on the ladder."""
    flat = np.asarray(xs[k], dtype=np.float64).reshape(-1)
    evaluate = _weighted_output(step, xs, k, a)
    base = float(evaluate(flat[None, :])[0][0])
    which = np.asarray(which, dtype=np.intp)
    h0 = np.full(which.size, projection_step(flat))
    return ladder(evaluate, base, _moves(flat, directions, which), h0, which, settled)


def local_one_sided(step, xs: list, k: int, a: np.ndarray, directions: np.ndarray, steps: np.ndarray, y=None):
    """(left, right): second-order one-sided differences of J_k^T a of one step along each direction
    (m, n) of input k -- or along the unit vectors at flat elements `directions` (m,), integers --, step
    steps[j] for direction j: the derivatives on each side of a kink. y: the step's output at xs (float64),
    where the caller holds it (else it is evaluated)."""
    directions = np.asarray(directions)
    elements = directions.ndim == 1
    sliced = _one_sided_sliced(step, xs, k, a, directions, steps, y) if elements else None
    if sliced is not None:
        return sliced
    flat = np.asarray(xs[k], dtype=np.float64).reshape(-1)
    evaluate = _weighted_output(step, xs, k, a, frozen=False)  # both sides of the kink, never frozen
    base = float(evaluate(flat[None, :])[0][0])
    moves = Moves(flat, index=directions) if elements else Moves(flat, directions=directions)
    return one_sided_pair(lambda stack: evaluate(stack)[0], base, moves, steps)


def _one_sided_sliced(step, xs: list, k: int, a: np.ndarray, elements: np.ndarray, steps: np.ndarray, y=None):
    """local_one_sided along the flat `elements` of input k where the op keeps each change to one slice
    (OpDef.slice_rule: elementwise and windowed ops): the op evaluated on the changed slices only -- a kink
    note about one element of a 524k-element relu evaluated four whole copies of it (97 MiB traced for a
    12.7 MiB training peak). The same values bit for bit: where each copy's weighted change has at most one
    nonzero term (a one-hot cotangent), its sum over the slice is its sum over the whole output, the other
    elements being unchanged; otherwise (or a non-finite value, or a rule that declines) None, and the dense
    path runs."""
    rule = step.op.slice_rule
    x = np.asarray(xs[k], dtype=np.float64)
    if rule is None or x.ndim == 0:
        return None
    index = np.tile(elements.astype(np.intp), len(ONE_SIDED))
    at = x[np.unravel_index(index[:len(steps)], x.shape)]  # (not x.reshape(-1): a strided x would be copied)
    moved = np.concatenate([at + c * steps for c in ONE_SIDED])
    with np.errstate(all="ignore"):
        y = np.asarray(run_step(np, step, list(xs)) if y is None else y, dtype=np.float64)
        weights = np.broadcast_to(np.asarray(a, dtype=np.float64), y.shape)
        if not (np.isfinite(y).all() and np.isfinite(weights).all()):
            return None
        for axis in range(-1, -x.ndim - 1, -1):  # the first axis the op's rule keeps the change along
            args = list(xs)
            args[k] = one_hot(np, x, axis, index, moved)
            out = rule(np, step.op, args, y, step.attrs)
            if out is not None:
                break
        else:
            return None
        # (not take_slices: take() copies a strided or broadcast value whole first)
        y, weights = (np.moveaxis(v, out.axis, 0)[out.index] for v in (y, weights))
        terms = (np.asarray(out.values, dtype=np.float64) - y) * weights
        terms = terms.reshape(len(index), -1)
        if np.any(np.count_nonzero(terms, axis=1) > 1):
            return None
        f = terms.sum(axis=1).reshape(len(ONE_SIDED), -1)
        return one_sided(0.0, f[2], f[3], -steps), one_sided(0.0, f[0], f[1], steps)
