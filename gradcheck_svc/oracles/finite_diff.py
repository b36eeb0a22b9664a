"""Finite-difference reference gradients, in float64 on the host.

Independent of the engine's derivative code: it only evaluates the forward
pass (shared op forwards, NumPy, float64), never a vjp.

Central differences with a per-element step h_i = cbrt(eps) * max(1, |x_i|),
rounded so that x_i + h_i - x_i == h_i exactly. The truncation error is
O(h^2 f''') and the rounding error O(eps |L| / h); cbrt(eps) balances the two.

full: every element of every parameter. The 2n perturbed forwards of a
    parameter are evaluated as stacked batches -- a leading perturbation axis
    carried through the part of the graph downstream of that parameter --
    in chunks sized to a memory budget, not as a Python loop of whole-graph runs.
    A one-element perturbation changes one slice of the value (a row or column),
    and ops that keep it to one slice (matmul's columns, elementwise ops) compute
    only that slice (ops/slices.py): the unperturbed rest is computed once.
projection: k random unit directions v_j, 2k forwards; compares the
    directional derivatives (g . v_j) instead of elements. (auto screens parameters
    above `projection_threshold` elements jointly instead.)
joint: k random directions spanning every parameter at once, 2k forwards of the
    whole graph however many parameter tensors there are. Each direction is a
    random unit vector per parameter block (so a 32-element bias moves as much as
    a 10^5-element weight), and the whole graph's directional derivative
    sum_p g_p . v_p is compared (verify/joint_check.py); blocks are split in
    halves only where it disagrees, down to the parameters to check on their own.
    Auto uses it when a per-parameter check of the graph would exceed
    `full_cost_budget`; parameters cheap to check in full (together no more
    than JOINT_FULL_SHARE of what the joint pass costs) are still checked in full.

The public API is every difference the verifier takes -- the one place central,
one-sided and projected differences are computed:
    FiniteDifferences.gradient(value)     dL/d(value), of a parameter or of an
                                          intermediate value (the sub-graph downstream)
    FiniteDifferences.one_sided(value, directions, steps)
                                          left/right second-order one-sided differences
    FiniteDifferences.losses(value, stack)  the loss at each perturbed copy of a value
    FiniteDifferences.joint(directions, params, rows)
                                          directional derivatives along JointDirections
                                          restricted to some parameter blocks (and refine_joint)
    local_vjp(step, xs, k, adjoint, directions)
                                          J_k^T a of one op by differences of its forward
    local_one_sided(step, xs, k, adjoint, directions, steps)
                                          the same, one-sided on each side (at a kink)
    random_directions(n, k, seed)         the projection directions (FDResult.directions)

Frozen branches: every perturbed forward but the one-sided ones (the local ones of one op included)
evaluates each piecewise op on the piece the unperturbed forward took (OpDef.select / frozen: relu's sign, max_pool's argmax, clip's
segment; comparisons held), so no difference straddles a kink; at an exact tie the piece is the one
the op's declared convention names. The one-sided differences (one_sided, local_one_sided) use the
ordinary forward: they judge the kink itself, on both sides.

Every value comes with an estimate of its own error (FDResult.noise). The first pass
is the cheap one above, whose estimate is the rounding term alone (~eps |L| / h): where
it already agrees with the engine, the step was small enough. The values that do not
agree are refined (FiniteDifferences.refine, refine_local_vjp), as numdifftools does:
central differences on a ladder of steps halving from ~2h down to well below |x| (a step
not small next to x -- a denominator b -> 0 -- is what made the first pass wrong),
their Richardson extrapolation, and second-order one-sided differences on each side (the
only finite ones next to a domain edge, log or sqrt near 0+). Each estimate's error is
bounded by its distance to its neighbours on the ladder (truncation: the estimates
converge as h shrinks) plus the rounding term eps |L| / h; the refined value is the
estimate with the smallest bound. An infinite bound means no step gave a finite estimate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..backend import NUMPY
from ..engine import forward, forward_batched, prepare_feeds, selections
from ..engine.program import program_of
from ..engine.executor import HELD, frozen_step, run_step, run_step_batched, selection_of
from ..graph.ir import Graph
from ..ops.slices import one_hot

EPS = np.finfo(np.float64).eps
STEP_SCALE = EPS ** (1.0 / 3.0)
MODES = ("auto", "full", "projection", "joint")


@dataclass
class FDOptions:
    mode: str = "auto"  # full | projection | joint | auto
    projection_threshold: int = 100_000  # elements per parameter above which auto projects
    # auto screens the parameters jointly when checking each on its own would evaluate more than
    # this many values (2 x elements x values downstream, summed: counted densely, and where that
    # is over, measured on one sliced copy); ~1e9 is a few seconds of NumPy on one core
    full_cost_budget: float = 1e9
    directions: int = 16
    seed: int = 0
    # memory budget for one stacked batch: small enough that a chunk's values stay in
    # cache (bench/bench_fd.py: 8 MiB is ~2x faster than 128 MiB at 2,000 elements)
    chunk_bytes: int = 8 * 2**20
    # frozen branches: the perturbed forwards evaluate every piecewise op on the piece the unperturbed
    # forward took (OpDef.select / frozen), so no difference straddles a kink (off: ordinary parameter-
    # level forwards, for comparison; the one-sided differences at a kink are always ordinary, one op's
    # local differences always frozen)
    frozen_branches: bool = True


# a copy of the whole graph is large and its steps many: per-step overhead, not cache misses, is
# what the joint pass pays (chain_256: 32 copies in 4 chunks of 8 MiB 0.09 s, in one of 26 MiB 0.05 s)
JOINT_CHUNK_BYTES = 32 * 2**20

# auto's full checks next to the joint screen: the cheapest parameters, while their values together
# stay within this share of the joint pass's. Counted in values, a full check's one-element copies
# cost more per value than the joint pass's whole-graph ones (ResNet-18: its 16 cheapest tensors,
# within the joint pass's values, took 6x its time; 4 within an eighth, 60% of it). The screen covers
# them all the same; full checks add element-wise detail where it is cheap (chain_256's last biases)
JOINT_FULL_SHARE = 1 / 16

# the refinement ladder: steps H 2^-j, j = 0..J, with H the power of two just above 2h (so every
# step is exact in binary and each halves the last); J reaches 1e-3 |x| below the smallest |x|
# the direction touches, within these bounds
LADDER_MIN = 10
LADDER_MAX = 30
LADDER_REACH = 1e-3
SETTLE_LEVEL = 3  # the first level a value may stop at: the one-sided estimates' first bound needs levels 1-3


@dataclass
class Refined:
    """Refined differences for some values of an FDResult (indices `which` into its reference)."""

    which: np.ndarray
    values: np.ndarray  # best estimate per value
    error: np.ndarray  # its estimated error: truncation + rounding; inf when no step gave one
    step: np.ndarray  # the step of the chosen estimate
    method: list[str]  # "central" | "richardson" | "right" | "left" (one-sided)


@dataclass
class FDResult:
    mode: str  # "full" | "projection"
    reference: np.ndarray  # full: dL/dp (shape of p); projection: directional derivatives (k,)
    noise: np.ndarray  # estimated error of each reference value (first pass: rounding; refined: both)
    directions: np.ndarray | None = None  # projection: (k, n) unit vectors
    evaluations: int = 0


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
        out = run(stack)
        with np.errstate(all="ignore"):
            change = ((out - y) * weights).reshape(len(stack), -1)
            size = np.where(out != y, np.abs(weights) * (np.abs(out) + np.abs(y)), 0.0).reshape(len(stack), -1)
            return change.sum(axis=1), size.sum(axis=1)
    return evaluate


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
        ref = (proj[:m] - proj[m:]) / (2 * h)
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
    if directions is None:
        return _ladder(evaluate, base, flat, h0, np.abs(flat[which]), which=which, settled=settled)
    d = directions[which]
    out = _ladder(evaluate, base, flat, h0, _support_scale(flat, d), directions=d, settled=settled)
    out.which = which
    return out


def local_one_sided(step, xs: list, k: int, a: np.ndarray, directions: np.ndarray, steps: np.ndarray):
    """(left, right): second-order one-sided differences of J_k^T a of one step along each direction
    (m, n) of input k, step steps[j] for direction j -- the derivatives on each side of a kink."""
    flat = np.asarray(xs[k], dtype=np.float64).reshape(-1)
    evaluate = _weighted_output(step, xs, k, a, frozen=False)  # both sides of the kink, never frozen
    base = float(evaluate(flat[None, :])[0][0])
    m = len(directions)
    stack = np.concatenate([flat + c * steps[:, None] * directions for c in (1, 2, -1, -2)])
    f = evaluate(stack)[0].reshape(4, m)
    with np.errstate(all="ignore"):
        right = (-3 * base + 4 * f[0] - f[1]) / (2 * steps)
        left = (3 * base - 4 * f[2] + f[3]) / (2 * steps)
    return left, right


def _ladder(evaluate, base: float, flat: np.ndarray, h0: np.ndarray, scale: np.ndarray,
            which: np.ndarray | None = None, directions: np.ndarray | None = None, settled=None) -> Refined:
    """Refined derivatives of a scalar function F of flat (n,) along m directions: unit vectors at
    the elements `which`, or the rows of `directions` (m, n). evaluate(stack (B, n)) -> (F, |F|
    magnitude for the rounding term), base = F(flat), h0 (m,) the first pass's steps, scale (m,)
    the smallest |x| each direction touches. settled(values, error) -> mask: directions whose
    estimate is good enough for the caller; they stop descending the ladder (a mismatch far
    beyond the truncation error is confirmed in four levels, not thirty)."""
    m = len(h0)
    if m == 0:
        return Refined(np.zeros(0, np.intp), np.zeros(0), np.zeros(0), np.zeros(0), [])
    with np.errstate(all="ignore"):  # a non-finite x: NaN steps, NaN estimates, an infinite bound
        top = 2.0 ** np.ceil(np.log2(2 * h0))
        need = np.where(scale > 0, np.ceil(np.log2(top / (LADDER_REACH * np.maximum(scale, 1e-300)))), 0)
    need = need[np.isfinite(need)]
    depth = int(np.clip(np.max(need, initial=0), LADDER_MIN, LADDER_MAX))
    steps = top[None, :] * 2.0 ** -np.arange(depth + 1)[:, None]  # (J+1, m)
    plus, minus, mag = (np.full((depth + 1, m), np.nan) for _ in range(3))  # NaN: level not evaluated
    which = None if which is None else np.asarray(which)
    active = np.ones(m, bool)
    for j in range(depth + 1):
        rows = np.flatnonzero(active)
        k = rows.size
        if which is not None:  # NaN steps (non-finite x) make NaN rows, as they should
            stack = np.broadcast_to(flat, (2 * k, flat.size)).copy()
            stack[np.arange(k), which[rows]] += steps[j, rows]
            stack[k + np.arange(k), which[rows]] -= steps[j, rows]
        else:
            d = directions[rows]
            stack = np.concatenate([flat + steps[j, rows][:, None] * d, flat - steps[j, rows][:, None] * d])
        f, size = evaluate(stack)
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
    names = ("central", "richardson", "right", "left")
    cols = np.arange(m)
    return Refined(np.asarray(which if which is not None else cols), values, error,
                   steps[pick % (depth + 1), cols], [names[p // (depth + 1)] for p in pick])


def _best(plus, minus, mag, steps, base):
    """(value, error bound, index of the candidate) per direction: the estimate with the smallest
    bound among central differences, their Richardson extrapolation and the one-sided ones, on
    the levels evaluated so far (NaN rows are levels not evaluated)."""
    with np.errstate(all="ignore"):
        rounding = 4 * EPS * mag / steps
        central = (plus - minus) / (2 * steps)
        richardson = np.full_like(central, np.nan)
        richardson[1:] = (4 * central[1:] - central[:-1]) / 3
        right, left = (np.full_like(central, np.nan) for _ in range(2))  # one-sided, second order
        right[1:] = (-3 * base + 4 * plus[1:] - plus[:-1]) / (2 * steps[1:])
        left[1:] = (3 * base - 4 * minus[1:] + minus[:-1]) / (2 * steps[1:])
        candidates, bounds = [], []
        for values, round_factor in ((central, 1), (richardson, 2), (right, 4), (left, 4)):
            gap = np.abs(np.diff(values, axis=0))  # gap[j-1] = |E_j - E_(j-1)|
            # an estimate is as far from the truth as from its coarser neighbour (truncation shrinks
            # at least 4x per halving), and from its finer one: two neighbours, so one chance
            # agreement far from the truth is not taken for convergence (NaN until both exist)
            err = np.full_like(values, np.nan)
            err[1:] = gap
            err[1:-1] = np.maximum(err[1:-1], gap[1:])
            err += round_factor * rounding
            candidates.append(values)
            bounds.append(err)
        est = np.stack(candidates)  # (4, J+1, m)
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


def _support_scale(flat: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Per direction, the smallest |x| among the elements it moves noticeably."""
    big = np.abs(directions) > 1e-2 * np.max(np.abs(directions), axis=1, keepdims=True)
    return np.min(np.where(big, np.abs(flat)[None, :], np.inf), axis=1)


# columns per piece when a sign block is widened to float64 (JointDirections.project): 16 rows x
# 8,192 columns is 1 MiB, a piece that stays in cache; the whole (k, n) float64 block never exists
PROJECT_COLUMNS = 8192


@dataclass
class JointDirections:
    """k directions spanning several parameters at once. Per parameter a (k, n_p) block of random
    signs (int8 +-1) times one weight per block, 1/sqrt(n_p) to begin with, so each row of a block
    is a unit vector and each block moves as much whatever its size; one step for them all.
    Signs, not Gaussians: one byte per element (ResNet-18's 11.7 M parameters x 16 directions as
    float64 were 1.5 GB, and building them and the perturbed copies from them took 15 s against
    0.6 s for the forwards themselves), a copy is one multiply and one add per element, and every
    element moves by the same amount, so none is all but left out of a direction."""

    signs: dict[str, np.ndarray]  # p -> (k, n_p) int8, +-1
    weight: dict[str, float]  # p -> |v| of every element of the block
    step: float

    @property
    def k(self) -> int:
        return len(next(iter(self.signs.values()))) if self.signs else 0

    def block(self, p: str, rows=None) -> np.ndarray:
        """The (rows of the) block as float64 directions (len(rows), n_p)."""
        s = self.signs[p] if rows is None else self.signs[p][np.asarray(rows)]
        return np.multiply(s, self.weight[p], dtype=np.float64)

    def project(self, p: str, values: np.ndarray) -> np.ndarray:
        """(k,) the block's directions times values (n_p,): sum_i v_ji values_i, in float64 pieces
        (the whole (k, n_p) float64 block never exists)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        s, out = self.signs[p], np.zeros(self.k)
        for lo in range(0, values.size, PROJECT_COLUMNS):
            out += s[:, lo:lo + PROJECT_COLUMNS].astype(np.float64) @ values[lo:lo + PROJECT_COLUMNS]
        return out * self.weight[p]

    def perturbed(self, p: str, x: np.ndarray, h: float, rows: np.ndarray, negative: np.ndarray,
                  out: np.ndarray) -> np.ndarray:
        """(len(rows), n_p): copy c is x + h v_j with j = rows[c], or x - h v_j where negative[c]. h v is
        +-fl(h |v|) at every element, exactly, so these are the float64 values x + fl(h v) gives.
        out: a float64 buffer of at least that many rows, written into (a fresh 100 MB array per
        copy spends more on page faults than on the arithmetic)."""
        hv = h * self.weight[p]
        out = out[:len(rows)]
        for c, (j, neg) in enumerate(zip(rows, negative)):  # row by row: a scalar factor is the fast loop
            np.multiply(self.signs[p][j], -hv if neg else hv, out=out[c], dtype=np.float64)
            out[c] += x
        return out


class FiniteDifferences:
    def __init__(self, graph: Graph, options: FDOptions | None = None):
        self.graph = graph
        self.options = options or FDOptions()
        self.program = program_of(graph, np.float64)
        base = forward(self.program, NUMPY, prepare_feeds(self.program, NUMPY), grad=False, keep_values=True)
        self.base = base.values
        self.loss = float(np.asarray(base.loss).reshape(-1)[0])
        # step -> the piece its op took here (engine/executor.selections): what every perturbed forward
        # but the one-sided ones evaluates on
        self.frozen = selections(self.program, np, self.base) if self.options.frozen_branches else {}
        self._row_bytes: dict[str, int] = {}
        self._sliced_cost: dict[str, float] = {}
        self._to_loss: set[str] = set()  # parameters the loss depends on (_param_row_bytes)
        self.joint_rows = 0  # perturbed copies joint_losses evaluated (the joint screen's cost)
        self.plan = self._plan()

    def _size(self, p: str) -> int:
        return math.prod(self.program.shapes[p])

    def full_cost(self, p: str) -> float:
        """Values a full check of p evaluates: 2 x elements x values one copy evaluates, measured on
        one sliced copy (slices make it far below the dense bound)."""
        if p not in self._sliced_cost:
            self._sliced_cost[p] = 2 * self._size(p) * self._sliced_row_values(p) if self._size(p) else 0.0
        return self._sliced_cost[p]

    def joint_cost(self) -> float:
        """Values the joint pass evaluates: 2k copies of everything downstream of the parameters."""
        params = list(self.program.params)
        if not params:
            return 0.0
        return 2 * self.options.directions * max(1, sum(math.prod(self.program.shapes[v])
                                                       for v in self.program.downstream(params)))

    def _plan(self) -> dict[str, str]:
        """Each parameter's mode. full / projection / joint: all of them so (projection, joint: the
        tiny or huge ones too). auto: joint above the size threshold, full for the rest -- unless
        that would evaluate more than the cost budget; then the joint screen for all but the
        cheapest, checked in full while their cost together stays within JOINT_FULL_SHARE of the
        joint pass's."""
        params = list(self.program.params)
        mode = self.options.mode
        if mode != "auto":
            return {p: mode for p in params}
        # above the size threshold, the joint screen rather than projections of each parameter: the same 2k
        # forwards, and a flag is narrowed to elements (verify/joint_check.py) -- a few random projections
        # would not see one wrong element of 10^5 (it moves each by e / sqrt(n))
        plan = {p: "joint" if self._size(p) > self.options.projection_threshold else "full" for p in params}
        rest = [p for p in params if plan[p] == "full"]
        dense = {p: 2 * self._size(p) * self.row_bytes(p) / 8 for p in rest}
        if sum(dense.values()) <= self.options.full_cost_budget:
            return plan
        # the dense bound is over: what do slices really cost? Measured costliest first (one sliced
        # copy each), until the rest fits (dense bounds for the unmeasured) or what is measured
        # alone is over
        total, measured = sum(dense.values()), 0.0
        for p in sorted(rest, key=dense.get, reverse=True):
            if total <= self.options.full_cost_budget:
                return plan
            if measured > self.options.full_cost_budget:
                break
            total += self.full_cost(p) - dense[p]
            measured += self.full_cost(p)
        if total <= self.options.full_cost_budget:
            return plan
        cheap, spent, budget = set(), 0.0, JOINT_FULL_SHARE * self.joint_cost()
        for p in sorted(rest, key=dense.get):
            if spent + dense[p] > budget:
                break
            cheap.add(p)
            spent += dense[p]
        return {p: "full" if p in cheap else "joint" for p in params}

    def mode_for(self, param: str) -> str:
        """The parameter's mode in the plan: full | projection | joint."""
        return self.plan[param]

    def own_mode(self, param: str) -> str:
        """How to check one parameter on its own (a joint one the screen flagged): full unless it is
        over the size threshold or its full check alone would exceed the cost budget."""
        if self._size(param) > self.options.projection_threshold or \
                self.full_cost(param) > self.options.full_cost_budget:
            return "projection"
        return "full"

    def _reaches_loss(self, name: str) -> bool:
        if name in self.program.params:
            self.row_bytes(name)  # computes the parameters' reach, the loss's among it
            return name in self._to_loss
        return self.program.output in self.program.downstream([name])

    def _param_row_bytes(self) -> None:
        """row_bytes of every parameter in one pass over the steps (a reachability matrix: value x
        parameter), not one pass per parameter -- a graph of 512 parameters spent 0.4 s here."""
        params = list(self.program.params)
        index = {p: i for i, p in enumerate(params)}
        reach = {p: np.eye(1, len(params), index[p], dtype=bool)[0] for p in params}
        total = np.array([math.prod(self.program.shapes[p]) for p in params], dtype=np.float64)
        for step in self.program.steps:
            rows = [reach[n] for n in step.inputs if n in reach]
            if rows:
                r = np.logical_or.reduce(rows) if len(rows) > 1 else rows[0]
                reach[step.name] = r
                total += self.program.footprint[step.name] * r
        for p in params:
            self._row_bytes[p] = 8 * max(1, int(total[index[p]]))
        out = reach.get(self.program.output)
        self._to_loss = {p for p in params if p == self.program.output or (out is not None and out[index[p]])}

    def row_bytes(self, name: str) -> int:
        """Bytes one batch row costs: every value downstream of `name`."""
        if name not in self._row_bytes and name in self.program.params:
            self._param_row_bytes()
        if name not in self._row_bytes:
            self._row_bytes[name] = 8 * max(1, sum(self.program.footprint[v]
                                                   for v in self.program.downstream([name])))
        return self._row_bytes[name]

    def losses(self, param: str, stack: np.ndarray, frozen: bool = True) -> np.ndarray:
        """Loss for each row of stack (B, *shape), in memory-bounded chunks; frozen: on the base's
        branches (self.frozen), else by the ordinary forward (which crosses kinks)."""
        return self.losses_of(param, stack.shape[0], lambda s, e: stack[s:e], frozen)

    def losses_of(self, param: str, b: int, rows_of, frozen: bool = True) -> np.ndarray:
        """Loss for each of b copies of param, made by rows_of(s, e) -> (e - s, *shape) one memory-bounded
        chunk at a time (never all b at once: 2k directions of a large parameter would be GBs)."""
        rows = max(1, self.options.chunk_bytes // self.row_bytes(param))
        out = np.empty(b)
        pieces = self.frozen if frozen else None
        for s in range(0, b, rows):
            out[s:s + rows] = forward_batched(self.program, NUMPY, self.base, {param: rows_of(s, min(b, s + rows))},
                                              frozen=pieces)
        return out

    def slice_axis(self, name: str) -> int | None:
        """The axis one-element perturbations of `name` are carried along (ops/slices.py): the first
        one a consumer prefers (matmul: a's rows, b's columns; conv: W's filters), else the last;
        None for a scalar."""
        rank = len(self.program.shapes[name])
        if rank == 0:
            return None
        for step in self.program.steps:
            prefer = step.op.sliced_axes
            for k, n in enumerate(step.inputs):
                if n == name and prefer:
                    axis = prefer[min(k, len(prefer) - 1)]
                    axis = axis - rank if axis >= 0 else axis  # OpDef.sliced_axes may count from the front
                    if -rank <= axis < 0:
                        return axis
        return -1

    def _sliced_row_values(self, name: str) -> float:
        """Values one perturbed copy of `name` really evaluates, carried as a slice: measured on one
        copy (what it costs is one copy's worth of the downstream graph, against 2n for a full check)."""
        x = np.asarray(self.base[name], dtype=np.float64)
        axis = self.slice_axis(name)
        if axis is None:
            return self.row_bytes(name) / 8
        stats = {}
        forward_batched(self.program, NUMPY, self.base, {name: one_hot(np, x, axis, [0], x.reshape(-1)[:1])}, stats,
                        frozen=self.frozen)
        return stats["row_bytes"] / 8

    def one_hot_losses(self, name: str, flat_index: np.ndarray, new_values: np.ndarray) -> np.ndarray:
        """The loss with element flat_index[k] of `name` set to new_values[k], for each k: each copy
        carried as one changed slice, in memory-bounded chunks."""
        x = np.asarray(self.base[name], dtype=np.float64)
        axis = self.slice_axis(name)
        if axis is None:  # a scalar: the stack itself is as small as it gets
            return self.losses(name, np.asarray(new_values, dtype=np.float64).reshape((-1,) + x.shape))
        # the first chunk is sized by the dense bound (every downstream value in full); the rest by
        # what a copy really held, which slices make far smaller
        rows = max(1, self.options.chunk_bytes // self.row_bytes(name))
        out = np.empty(len(flat_index))
        s = 0
        while s < len(flat_index):
            stats = {}
            stack = one_hot(np, x, axis, flat_index[s:s + rows], new_values[s:s + rows])
            out[s:s + rows] = forward_batched(self.program, NUMPY, self.base, {name: stack}, stats, frozen=self.frozen)
            s += rows
            rows = max(1, self.options.chunk_bytes // max(1, stats["row_bytes"]))
        return out

    def noise(self, h) -> np.ndarray:
        """The first pass's error estimate at step h: the rounding of the loss, ~eps |L| / h."""
        return 4 * EPS * (abs(self.loss) + 1.0) / h

    def gradient(self, param: str, mode: str | None = None, directions: int | None = None) -> FDResult:
        """dL/d(param); param may also be an intermediate value (fault localization perturbs it and
        re-runs only what is downstream). mode/directions override the options for this call."""
        if not self._reaches_loss(param):
            shape = self.program.shapes[param]  # the loss does not depend on it
            return FDResult("full", np.zeros(shape), np.zeros(shape))
        mode = mode or self.plan.get(param, self.options.mode)
        if mode == "auto":  # an intermediate value
            mode = "full"
        elif mode == "joint":
            mode = self.own_mode(param)
        if mode == "projection":
            return self._projection(param, directions or self.options.directions)
        return self._full(param)

    def _full(self, param: str) -> FDResult:
        shape = np.shape(self.base[param])
        every = self.elements(param, np.arange(int(np.prod(shape, dtype=np.int64))))
        return FDResult("full", every.reference.reshape(shape), every.noise.reshape(shape),
                        evaluations=every.evaluations)

    def elements(self, param: str, index: np.ndarray) -> FDResult:
        """Central differences of the flat elements `index` of param, each alone (one-element copies):
        a "full" FDResult over those elements, flat -- every element of a full check, or the few a
        flagged parameter was narrowed to (verify/joint_check.py)."""
        index = np.asarray(index, dtype=np.intp)
        x = np.asarray(self.base[param], dtype=np.float64).reshape(-1)[index]
        h = element_steps(x)
        with np.errstate(invalid="ignore"):  # a non-finite x has a NaN step: NaN rows, as they should
            losses = self.one_hot_losses(param, np.concatenate([index, index]), np.concatenate([x + h, x - h]))
        with np.errstate(all="ignore"):  # inf - inf: the verifier reports NaN/Inf itself
            ref = (losses[:index.size] - losses[index.size:]) / (2 * h)
        return FDResult("full", ref, self.noise(h), evaluations=2 * index.size)

    def _projection(self, param: str, k: int) -> FDResult:
        x = np.asarray(self.base[param], dtype=np.float64)
        flat = x.reshape(-1)
        v = random_directions(flat.size, k, self.options.seed)
        h = projection_step(flat)

        def rows_of(s, e):  # copy j < k is flat + h v_j, copy k + j is flat - h v_j
            j = np.arange(s, e)
            return (flat + np.where(j < k, h, -h)[:, None] * v[j % k]).reshape((e - s,) + x.shape)
        losses = self.losses_of(param, 2 * k, rows_of)
        with np.errstate(all="ignore"):
            ref = (losses[:k] - losses[k:]) / (2 * h)
        return FDResult("projection", ref, np.full(k, self.noise(h)), directions=v, evaluations=2 * k)

    def refine(self, param: str, result: FDResult, which: np.ndarray, settled=None) -> Refined:
        """The values of `result` (a gradient of param) at flat indices `which`, refined on the ladder
        of steps: for full results the elements, for projections the directions. settled: see
        _ladder (the caller's test of "good enough", which stops a value's descent)."""
        flat = np.asarray(self.base[param], dtype=np.float64).reshape(-1)
        which = np.asarray(which, dtype=np.intp)

        def evaluate(stack):
            losses = self.losses(param, stack.reshape((len(stack),) + np.shape(self.base[param])))
            return losses, np.abs(losses)
        if result.mode == "full":
            return _ladder(evaluate, self.loss, flat, element_steps(flat[which]), np.abs(flat[which]), which=which,
                           settled=settled)
        d = result.directions[which]
        out = _ladder(evaluate, self.loss, flat, np.full(which.size, projection_step(flat)),
                      _support_scale(flat, d), directions=d, settled=settled)
        out.which = which
        return out

    def one_sided(self, param: str, directions: np.ndarray, steps: np.ndarray):
        """(left, right): second-order one-sided differences of L along each direction (m, n) of
        param, with step steps[j] for direction j. O(h^2) on each smooth piece -- a first-order
        one-sided difference would be off by O(h f'') -- so at a kink they bracket a right
        (sub)gradient closely. By the ordinary forward, never frozen: they must see both sides."""
        x = np.asarray(self.base[param], dtype=np.float64)
        flat = x.reshape(-1)
        m = len(directions)
        multiples = (1, 2, -1, -2)
        stack = np.concatenate([flat + k * steps[:, None] * directions for k in multiples])
        losses = self.losses(param, stack.reshape((4 * m,) + x.shape), frozen=False).reshape(4, m)
        with np.errstate(all="ignore"):
            right = (-3 * self.loss + 4 * losses[0] - losses[1]) / (2 * steps)
            left = (3 * self.loss - 4 * losses[2] + losses[3]) / (2 * steps)
        return left, right

    # -- joint: directions spanning several parameters, the whole graph evaluated once per copy --

    def joint_directions(self, params: list[str], k: int | None = None) -> JointDirections:
        """k directions over `params`: per block random signs (seeded by the options' seed), each row
        a unit vector."""
        k = k or self.options.directions
        rng = np.random.default_rng(self.options.seed)
        sizes = [self._size(p) for p in params]
        total = sum(sizes)
        bits = np.unpackbits(np.frombuffer(rng.bytes((k * total + 7) // 8), np.uint8))[:k * total]
        bits = bits.reshape(k, total).view(np.int8)
        bits *= 2
        bits -= 1  # the signs, +-1
        signs, weight, lo, top = {}, {}, 0, 0.0
        for p, n in zip(params, sizes):
            signs[p] = bits[:, lo:lo + n]
            weight[p] = 1.0 / math.sqrt(n) if n else 0.0
            lo += n
            if n:  # projection_step of all the blocks together, without concatenating them
                top = max(top, float(np.max(np.abs(np.asarray(self.base[p], dtype=np.float64)))))
        return JointDirections(signs, weight, projection_step(np.array([top])))

    def _set_row_bytes(self, params) -> int:
        key = tuple(params)
        if key not in self._row_bytes:
            self._row_bytes[key] = 8 * max(1, sum(self.program.footprint[v]
                                                  for v in self.program.downstream(list(params))))
        return self._row_bytes[key]

    def joint_losses(self, params: list[str], b: int, rows_of) -> np.ndarray:
        """The loss for each of b copies, all `params` perturbed together: rows_of(s, e) -> p ->
        (e - s, n_p), the flat copies s..e-1 of each parameter, made one memory-bounded chunk at a time
        (ResNet-18's 32 copies of its 11.7 M parameters would be 3 GB at once); a chunk's forward is
        done with it when the next is asked for (joint() writes them into one buffer)."""
        self.joint_rows += b
        row = self._set_row_bytes(params) + 8 * sum(self._size(p) for p in params)
        rows = max(1, max(self.options.chunk_bytes, JOINT_CHUNK_BYTES) // row)
        out = np.empty(b)
        for s in range(0, b, rows):
            e = min(b, s + rows)
            chunk = rows_of(s, e)
            out[s:e] = forward_batched(self.program, NUMPY, self.base, {
                p: chunk[p].reshape((-1,) + tuple(self.program.shapes[p])) for p in params}, frozen=self.frozen)
        return out

    def joint(self, dirs: JointDirections, params: list[str], rows: np.ndarray | None = None) -> FDResult:
        """Central differences of L along the directions `rows` of dirs restricted to the blocks of
        `params` (the others stay put): sum over those p of g_p . v_p, one value per row."""
        rows = np.arange(dirs.k) if rows is None else np.asarray(rows, dtype=np.intp)
        h, m = dirs.step, len(rows)
        flat = {p: np.asarray(self.base[p], dtype=np.float64).reshape(-1) for p in params}
        buffers: dict = {}  # p -> one chunk's copies, written over by the next chunk

        def rows_of(s, e):  # copy c < m is row c's x + h v, copy m + c its x - h v
            c = np.arange(s, e)
            for p in params:
                if p not in buffers or len(buffers[p]) < len(c):
                    buffers[p] = np.empty((len(c), flat[p].size))
            return {p: dirs.perturbed(p, flat[p], h, rows[c % m], c >= m, buffers[p]) for p in params}
        losses = self.joint_losses(params, 2 * m, rows_of)
        with np.errstate(all="ignore"):
            ref = (losses[:m] - losses[m:]) / (2 * h)
        return FDResult("joint", ref, np.full(m, self.noise(h)), evaluations=2 * m)

    def refine_joint(self, dirs: JointDirections, params: list[str], rows: np.ndarray, which: np.ndarray,
                     settled=None) -> Refined:
        """joint()'s values at positions `which` of `rows`, refined on the ladder of steps."""
        which = np.asarray(which, dtype=np.intp)
        sizes = [self._size(p) for p in params]
        cuts = np.cumsum(sizes)[:-1]
        flat = np.concatenate([np.asarray(self.base[p], dtype=np.float64).reshape(-1) for p in params])
        d = np.concatenate([dirs.block(p, np.asarray(rows)[which]) for p in params], axis=1)

        def evaluate(stack):
            losses = self.joint_losses(params, len(stack),
                                       lambda s, e: dict(zip(params, np.split(stack[s:e], cuts, axis=1))))
            return losses, np.abs(losses)
        out = _ladder(evaluate, self.loss, flat, np.full(which.size, dirs.step), _support_scale(flat, d),
                      directions=d, settled=settled)
        out.which = which
        return out
