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
projection: k random unit directions v_j, 2k forwards; compares the
    directional derivatives (g . v_j) instead of elements. Used automatically
    for parameters above `projection_threshold` elements, and for the costliest
    parameters while a full check of the graph would exceed `full_cost_budget`.

The public API is every difference the verifier takes -- the one place central,
one-sided and projected differences are computed:
    FiniteDifferences.gradient(value)     dL/d(value), of a parameter or of an
                                          intermediate value (the sub-graph downstream)
    FiniteDifferences.one_sided(value, directions, steps)
                                          left/right second-order one-sided differences
    FiniteDifferences.losses(value, stack)  the loss at each perturbed copy of a value
    local_vjp(step, xs, k, adjoint, directions)
                                          J_k^T a of one op by differences of its forward
    random_directions(n, k, seed)         the projection directions (FDResult.directions)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..backend import NUMPY
from ..engine import Program, forward, forward_batched, prepare_feeds
from ..engine.executor import run_step_batched
from ..graph.ir import Graph

EPS = np.finfo(np.float64).eps
STEP_SCALE = EPS ** (1.0 / 3.0)
MODES = ("auto", "full", "projection")


@dataclass
class FDOptions:
    mode: str = "auto"  # full | projection | auto
    projection_threshold: int = 100_000  # elements per parameter above which auto projects
    # auto also projects the costliest parameters while the whole graph's full check would
    # evaluate more than this many values (2 x elements x values downstream, summed);
    # ~1e9 is a few seconds of NumPy on one core
    full_cost_budget: float = 1e9
    directions: int = 16
    seed: int = 0
    # memory budget for one stacked batch: small enough that a chunk's values stay in
    # cache (bench/bench_fd.py: 8 MiB is ~2x faster than 128 MiB at 2,000 elements)
    chunk_bytes: int = 8 * 2**20


@dataclass
class FDResult:
    mode: str  # "full" | "projection"
    reference: np.ndarray  # full: dL/dp (shape of p); projection: directional derivatives (k,)
    noise: np.ndarray  # estimated rounding error of each reference value
    directions: np.ndarray | None = None  # projection: (k, n) unit vectors
    evaluations: int = 0


def random_directions(n: int, k: int, seed: int = 0) -> np.ndarray:
    """k random unit vectors in R^n, (k, n): the same seed gives the same directions."""
    v = np.random.default_rng(seed).standard_normal((k, n))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def element_steps(flat: np.ndarray) -> np.ndarray:
    """Per-element step cbrt(eps) * max(1, |x|), rounded so that x + h - x == h exactly."""
    h = STEP_SCALE * np.maximum(1.0, np.abs(flat))
    return (flat + h) - flat


def projection_step(flat: np.ndarray) -> float:
    """One step for a whole direction: scaled by the largest element."""
    return STEP_SCALE * max(1.0, float(np.max(np.abs(flat))) if flat.size else 1.0)


def local_vjp(step, xs: list, k: int, a: np.ndarray, directions: np.ndarray | None):
    """J_k^T a of one step at inputs xs (float64, host), by central differences of its forward alone:
    every element of input k (directions None) or projected on directions (m, n). Returns
    (values, noise)."""
    x = np.asarray(xs[k], dtype=np.float64)
    flat = x.reshape(-1)
    n = flat.size
    d = np.eye(n) if directions is None else directions
    m = d.shape[0]
    h = projection_step(flat)
    stack = np.concatenate([flat + h * d, flat - h * d]).reshape((2 * m,) + x.shape)
    args = list(xs)
    args[k] = stack
    with np.errstate(all="ignore"):
        out = run_step_batched(np, step, args, [i == k for i in range(len(xs))])
        weighted = (np.asarray(out, dtype=np.float64) * a).reshape(2 * m, -1)
        proj = weighted.sum(axis=1)
        ref = (proj[:m] - proj[m:]) / (2 * h)
        noise = 8 * EPS * (np.abs(weighted).sum(axis=1)[:m] + 1.0) / h
    return ref, noise


class FiniteDifferences:
    def __init__(self, graph: Graph, options: FDOptions | None = None):
        self.graph = graph
        self.options = options or FDOptions()
        self.program = Program(graph, np.float64)
        base = forward(self.program, NUMPY, prepare_feeds(self.program, NUMPY), grad=False, keep_values=True)
        self.base = base.values
        self.loss = float(np.asarray(base.loss).reshape(-1)[0])
        self._row_bytes: dict[str, int] = {}
        self._auto_projected = self._over_budget()

    def _over_budget(self) -> set[str]:
        """Parameters auto mode projects: above the size threshold, then the costliest
        ones until a full check of the rest fits the cost budget."""
        size = {p: math.prod(self.program.shapes[p]) for p in self.program.params}
        cost = {p: 2 * size[p] * self.row_bytes(p) / 8 for p in self.program.params}
        projected = {p for p in self.program.params if size[p] > self.options.projection_threshold}
        total = sum(c for p, c in cost.items() if p not in projected)
        for p in sorted(cost, key=cost.get, reverse=True):
            if total <= self.options.full_cost_budget:
                break
            if p not in projected:
                projected.add(p)
                total -= cost[p]
        return projected

    def mode_for(self, param: str) -> str:
        mode = self.options.mode
        if mode == "auto":
            return "projection" if param in self._auto_projected else "full"
        return mode

    def row_bytes(self, name: str) -> int:
        """Bytes one batch row costs: every value downstream of `name`."""
        if name not in self._row_bytes:
            self._row_bytes[name] = 8 * max(1, sum(math.prod(self.program.shapes[v])
                                                   for v in self.program.downstream([name])))
        return self._row_bytes[name]

    def losses(self, param: str, stack: np.ndarray) -> np.ndarray:
        """Loss for each row of stack (B, *shape), in memory-bounded chunks."""
        rows = max(1, self.options.chunk_bytes // self.row_bytes(param))
        out = np.empty(stack.shape[0])
        for s in range(0, stack.shape[0], rows):
            out[s:s + rows] = forward_batched(self.program, NUMPY, self.base, {param: stack[s:s + rows]})
        return out

    def _noise(self, h) -> np.ndarray:
        return 4 * EPS * (abs(self.loss) + 1.0) / h

    def gradient(self, param: str, mode: str | None = None, directions: int | None = None) -> FDResult:
        """dL/d(param); param may also be an intermediate value (fault localization perturbs it and
        re-runs only what is downstream). mode/directions override the options for this call."""
        if self.program.output not in self.program.downstream([param]):
            shape = self.program.shapes[param]  # the loss does not depend on it
            return FDResult("full", np.zeros(shape), np.zeros(shape))
        if (mode or self.mode_for(param)) == "projection":
            return self._projection(param, directions or self.options.directions)
        return self._full(param)

    def _full(self, param: str) -> FDResult:
        x = np.asarray(self.base[param], dtype=np.float64)
        flat = x.reshape(-1)
        n = flat.size
        h = element_steps(flat)
        ref = np.empty(n)
        rows = max(1, min(n, self.options.chunk_bytes // (2 * self.row_bytes(param))))
        # One buffer of 2*rows copies of x serves every chunk: perturb m elements (rows
        # [0, m) get +h, rows [m, 2m) get -h), evaluate, then restore just those elements,
        # instead of copying the whole stack again for each chunk.
        buf = np.broadcast_to(flat, (2 * rows, n)).copy()
        for s in range(0, n, rows):
            idx = np.arange(s, min(n, s + rows))
            m = idx.size
            plus, minus = np.arange(m), m + np.arange(m)
            buf[plus, idx] = flat[idx] + h[idx]
            buf[minus, idx] = flat[idx] - h[idx]
            losses = self.losses(param, buf[:2 * m].reshape((2 * m,) + x.shape))
            buf[plus, idx] = buf[minus, idx] = flat[idx]
            with np.errstate(all="ignore"):  # inf - inf: the verifier reports NaN/Inf itself
                ref[idx] = (losses[:m] - losses[m:]) / (2 * h[idx])
        return FDResult("full", ref.reshape(x.shape), self._noise(h).reshape(x.shape), evaluations=2 * n)

    def _projection(self, param: str, k: int) -> FDResult:
        x = np.asarray(self.base[param], dtype=np.float64)
        flat = x.reshape(-1)
        v = random_directions(flat.size, k, self.options.seed)
        h = projection_step(flat)
        stack = np.concatenate([flat + h * v, flat - h * v]).reshape((2 * k,) + x.shape)
        losses = self.losses(param, stack)
        with np.errstate(all="ignore"):
            ref = (losses[:k] - losses[k:]) / (2 * h)
        return FDResult("projection", ref, np.full(k, self._noise(h)), directions=v, evaluations=2 * k)

    def one_sided(self, param: str, directions: np.ndarray, steps: np.ndarray):
        """(left, right): second-order one-sided differences of L along each direction (m, n) of
        param, with step steps[j] for direction j. O(h^2) on each smooth piece -- a first-order
        one-sided difference would be off by O(h f'') -- so at a kink they bracket a right
        (sub)gradient closely."""
        x = np.asarray(self.base[param], dtype=np.float64)
        flat = x.reshape(-1)
        m = len(directions)
        multiples = (1, 2, -1, -2)
        stack = np.concatenate([flat + k * steps[:, None] * directions for k in multiples])
        losses = self.losses(param, stack.reshape((4 * m,) + x.shape)).reshape(4, m)
        with np.errstate(all="ignore"):
            right = (-3 * self.loss + 4 * losses[0] - losses[1]) / (2 * steps)
            left = (3 * self.loss - 4 * losses[2] + losses[3]) / (2 * steps)
        return left, right
