"""The joint screen: every parameter's gradient checked at once, then bisected where it disagrees.

k random directions span all the screened parameters together (finite_diff.JointDirections: a
random unit vector per parameter block, then weighted as below), so the whole graph's directional derivative
D_j = sum_p g_p . v_jp costs 2 forwards per direction however many parameter tensors there are.
The engine's side is known per block, c_jp = g_p . v_jp, and so is what the tolerance model
allows each block: with b_i = tol.absolute(max |g_p|) + rtol * |g_i| per element (compare.py), a_jp =
sqrt(sum_i (b_i v_jpi)^2 / n_p), the typical size of the projection of errors within tolerance
divided by sqrt(n_p): one element past its tolerance b_i moves a random unit projection by
about b_i / sqrt(n_p), and the screen is to see it (legitimate rounding, far inside the
tolerance, stays below; a false alarm only costs the flagged parameter's own check). Each
block's direction is weighted so that its a_jp is (on average over j) the same for all blocks --
a wrong 32-element bias is as visible as a wrong 10^5-element weight, and a block whose gradient
vanishes (early layers of a deep chain) as one whose gradient is large. A group of blocks G is held
to the root mean square of its a_jp, as strict as a projection of one block on its own, plus the
differences' own error (fd_check: refined on the ladder where the first pass misses).

Where the whole disagrees (or finite differences cannot decide it), the blocks are split in
halves, each half's directional derivative compared on the directions that failed, down to
single parameters: those are *flagged* and checked on their own (full or projected), which
attributes and localizes. A wrong parameter costs about 4 log2(P) forwards of part of the graph
per failing direction. A child is never held more loosely than its parent; where a group fails
while neither half does (a marginal error, or errors that cancel), the half further off is
followed all the same, so a disagreement always ends at a parameter checked on its own.

The screen is a screen: it never passes a verdict on a flagged parameter, only spares the
per-parameter work where the joint derivative agrees.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .compare import Comparison, Tolerance
from .fd_check import _over, fd_check

BISECT_ROWS = 4  # failing directions followed down the bisection (the worst ones)


@dataclass
class JointScreen:
    params: list[str]
    directions: object  # finite_diff.JointDirections
    engine: np.ndarray  # (k,) sum_p g_p . v_jp
    reference: np.ndarray  # (k,) finite differences of the whole, refined where needed
    error: np.ndarray  # (k,) their estimated error
    comparison: Comparison  # engine vs reference, each allowed its floor + FD error
    refined: np.ndarray
    flagged: list[str] = field(default_factory=list)  # to be checked on their own
    evaluations: int = 0  # forwards of (part of) the graph, bisection included
    sym_of_fd: np.ndarray | None = None  # the symbolic gradient's directional derivatives (run.py)


def _allowed(gradients: dict, tol: Tolerance, params: list[str]) -> dict:
    """Per parameter sum(b * b) / n: a^2 (k,) is that times the block's weight squared -- (v * v) @
    (b * b) / n, every element of a sign block moving by the weight."""
    out = {}
    for p in params:
        g = np.asarray(gradients[p], dtype=np.float64).reshape(-1)
        b = tol.absolute(float(np.max(np.abs(g), initial=0.0))) + tol.rtol * np.abs(g)
        out[p] = float(b @ b) / max(1, g.size)
    return out


def joint_screen(fd, gradients: dict, params: list[str], tol: Tolerance) -> JointScreen:
    dirs = fd.joint_directions(params)
    allowed = _allowed(gradients, tol, params)
    # each block weighted so that what its tolerance allows is the same for all (the smallest one's):
    # a bug past its own tolerance shows as much in a block whose gradient is 1e-5 as in one whose
    # gradient is 10, rather than drowning in the large blocks' allowance. No block moves more than
    # a unit direction would, and none is weighted below the differences' own rounding: a block held
    # to 1e-11 (chain_256's first layers, compare.py's vanishing gradients) would otherwise shrink every
    # other block's signal under what finite differences resolve, and a 1% error in b5 went unseen
    scale = {p: dirs.weight[p] * math.sqrt(allowed[p]) for p in params}
    least = min((v for v in scale.values() if v > 0), default=1.0)
    target = max(least, float(fd.noise(dirs.step)))
    for p in params:
        if scale[p] > target:
            dirs.weight[p] *= target / scale[p]
    a2 = {p: np.full(dirs.k, dirs.weight[p] ** 2 * allowed[p]) for p in params}
    c = {p: dirs.project(p, gradients[p]) for p in params}  # the engine's projections (k,)
    before = fd.joint_rows

    def check(group, rows, ceiling):
        """fd_check of the group's directional derivatives on `rows`, its floor never above ceiling:
        (the check, the floor, which rows fail or are undecided)."""
        ref = fd.joint(dirs, group, rows)
        eng = np.sum([c[p][rows] for p in group], axis=0)
        floor = np.minimum(np.sqrt(np.mean([a2[p][rows] for p in group], axis=0)), ceiling)
        chk = fd_check(eng, ref.reference, ref.noise, tol,
                       lambda which, settled: fd.refine_joint(dirs, group, rows, which, settled), floor=floor)
        failing = _over(eng, chk.reference, floor + chk.error)
        failing[chk.undecidable] = True
        with np.errstate(all="ignore"):
            ratio = np.nan_to_num(np.abs(eng - chk.reference) / floor, nan=np.inf)
        return chk, floor, failing, ratio

    flagged: list[str] = []

    def bisect(group, rows, ceiling):
        if len(group) == 1:
            flagged.extend(group)
            return
        mid = len(group) // 2
        halves = [(half, *check(half, rows, ceiling)) for half in (group[:mid], group[mid:])]
        bad = [(half, floor, failing) for half, _, floor, failing, _ in halves if failing.any()]
        if not bad:  # the whole disagreed, neither half does (a marginal error, or errors that cancel):
            # follow the half further off, on all these directions -- never clear the whole group
            half, _, floor, _, _ = max(halves, key=lambda h: float(np.max(h[4])))
            bad = [(half, floor, np.ones(len(rows), bool))]
        for half, floor, failing in bad:
            bisect(half, rows[failing], floor[failing])

    every = np.arange(dirs.k)
    top, top_floor, failing, ratio = check(params, every, np.inf)
    if failing.any():
        rows = every[failing][np.argsort(-ratio[failing], kind="stable")][:BISECT_ROWS]  # the worst ones
        bisect(params, rows, top_floor[rows])
    named = set(flagged)
    return JointScreen(params, dirs, np.sum([c[p] for p in params], axis=0), top.reference, top.error,
                       top.comparison, top.refined, [p for p in params if p in named], fd.joint_rows - before)


def usable(fd, gradients: dict, params: list[str]) -> bool:
    """The joint screen needs a finite loss, finite parameters and finite engine gradients: one NaN
    would make every joint value NaN (and NaN == NaN agrees); per-parameter checks and the
    non-finite diagnosis take such graphs."""
    if not params or not math.isfinite(fd.loss):
        return False
    return all(np.isfinite(np.asarray(fd.base[p], dtype=np.float64)).all() and
               np.isfinite(np.asarray(gradients[p], dtype=np.float64)).all() for p in params)
