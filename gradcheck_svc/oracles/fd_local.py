"""One op's differences: J_k^T a of a single step by differences of its forward alone (localization, claims).

    local_vjp(step, xs, k, a, directions)              central differences, every element or projected
    refine_local_vjp(step, xs, k, a, directions, which)  those values refined on the ladder
    local_one_sided(step, xs, k, a, directions, steps) one-sided on each side (at a kink)

Frozen like the parameter-level differences (the step on the piece it took at xs), except the one-sided
ones, which judge the kink itself and so use the ordinary forward. The formulas are fd_formulas'.
"""
from __future__ import annotations

import numpy as np

from ..engine.executor import HELD, frozen_step, run_step, run_step_batched, selection_of
from .fd_formulas import EPS, Moves, Refined, central, ladder, one_sided_pair, projection_step


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
                y = np.asarray(run_step(np, step, list(xs)), dtype=np.float64)
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


def local_one_sided(step, xs: list, k: int, a: np.ndarray, directions: np.ndarray, steps: np.ndarray):
    """(left, right): second-order one-sided differences of J_k^T a of one step along each direction
    (m, n) of input k, step steps[j] for direction j -- the derivatives on each side of a kink."""
    flat = np.asarray(xs[k], dtype=np.float64).reshape(-1)
    evaluate = _weighted_output(step, xs, k, a, frozen=False)  # both sides of the kink, never frozen
    base = float(evaluate(flat[None, :])[0][0])
    return one_sided_pair(lambda stack: evaluate(stack)[0], base, Moves(flat, directions=directions), steps)
