"""Finite-difference reference gradients, in float64 on the host: the evaluator, and the oracle's public API.

Independent of the engine's derivative code: it only evaluates the forward
pass (shared op forwards, NumPy, float64), never a vjp.

Central differences with a per-element step h_i = cbrt(eps) * max(1, |x_i|),
rounded so that x_i + h_i - x_i == h_i exactly. The truncation error is
O(h^2 f''') and the rounding error O(eps |L| / h); cbrt(eps) balances the two.

The oracle in four rooms: fd_plan.py decides what to difference, by which scheme, at what cost (an
FDPlan, stated in the report); this module evaluates the perturbed copies the plan's schemes need
(stacked batches in memory-bounded chunks); fd_formulas.py turns losses into differences (central,
one_sided and the refinement ladder, each written once); fd_local.py takes one op's differences.

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
    Auto uses it when checking every parameter in full would cost more than the
    joint pass (fd_plan.py); parameters cheap to check in full (together no more
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
    FiniteDifferences.plan                the FDPlan: each parameter's mode, the first pass's cost
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

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..backend import NUMPY
from ..engine import forward, forward_batched, prepare_feeds, selections
from ..engine.executor import Pair
from ..engine.program import program_of
from ..graph.ir import Graph
from ..ops.slices import one_hot
from . import fd_complex as cx
from .fd_formulas import (EPS, STEP_SCALE, Moves, Refined, central, element_steps, ladder, one_sided_pair,
                          projection_step, random_directions)
from .fd_joint import JointDirections, content_seed
from .fd_local import local_one_sided, local_vjp, refine_local_vjp
from .fd_modes import FDMode
from .fd_plan import MODES, Costs, FDOptions, FDPlan, own_mode, plan, plan_of_record, plan_record

__all__ = ["EPS", "MODES", "STEP_SCALE", "FDOptions", "FDPlan", "FDResult", "FiniteDifferences", "JointDirections",
           "Refined", "element_steps", "local_one_sided", "local_vjp", "projection_step", "random_directions",
           "refine_local_vjp"]

# a copy of the whole graph is large and its steps many: per-step overhead, not cache misses, is
# what the joint pass pays (chain_256: 32 copies in 4 chunks of 8 MiB 0.09 s, in one of 26 MiB 0.05 s)
JOINT_CHUNK_BYTES = 32 * 2**20
# ... but no more than one forward's values and the parameters (what training holds too), unless that
# is under the options' chunk_bytes (the full checks' budget): then the process peak of a graph whose
# training peak is above chunk_bytes stays near twice that peak (a 32 MiB chunk was 2.5x the training
# peak of a 32/64-channel CNN at 4x3x64x64, 8x that of a 16/32-channel one at 2x3x48x48)


@dataclass
class FDResult:
    mode: FDMode  # FULL | PROJECTION | JOINT
    reference: np.ndarray  # full: dL/dp (shape of p); projection: directional derivatives (k,)
    noise: np.ndarray  # estimated error of each reference value (first pass: rounding; refined: both)
    directions: np.ndarray | None = None  # projection: (k, n) unit vectors
    evaluations: int = 0
    method: str = cx.CENTRAL  # central | complex (fd_complex.py): how the reference was taken


class _Made(Mapping):
    """A mapping made when first read (made()); the values of `at_hand` (the graph's inputs) are read without it."""

    def __init__(self, make, at_hand: dict | None = None):
        self._make, self._at_hand, self._made = make, at_hand or {}, None

    def made(self) -> dict:
        if self._made is None:
            self._made = self._make()
        return self._made

    def __getitem__(self, name):
        if self._made is None and name in self._at_hand:
            return self._at_hand[name]
        return self.made()[name]

    def __iter__(self):
        return iter(self.made())

    def __len__(self) -> int:
        return len(self.made())


@dataclass
class BaseRecord:
    """What a process made of a graph's base forward, for another process of the same split (fd_shards.py): the
    loss, the plan as planned (plan_record: before any screen or fallback changed it) and the steps a complex
    forward cannot pass. check(loss): called with the loss of a base forward made against the record (raises
    where it differs)."""
    loss: float
    plan: dict
    lacking: dict
    check: object = None

    @staticmethod
    def of(loss: float, plan_: FDPlan, lacking: dict) -> "BaseRecord":
        return BaseRecord(loss, plan_record(plan_), dict(lacking))

    def fd_plan(self) -> FDPlan:
        return plan_of_record(self.plan)


class FiniteDifferences:
    def __init__(self, graph: Graph, options: FDOptions | None = None, recorded: BaseRecord | None = None):
        """recorded: what another process of a split made of this graph's base forward (its loss, plan and
        complex-step blockers: fd_shards.py); the base forward is then made only when a value of it is asked
        for (a follow-up's perturbed copies, the diagnosis), and its loss must be the record's."""
        self.graph = graph
        self.options = options or FDOptions()
        self.program = program_of(graph, np.float64)
        self.inputs = prepare_feeds(self.program, NUMPY)  # the graph's inputs: the base forward's own feeds
        self._recorded = recorded
        self.base = _Made(self._forward, self.inputs)  # every value of the base forward (a keep_values one)
        # step -> the piece its op took here (engine/executor.selections): what every perturbed forward
        # but the one-sided ones evaluates on
        self.frozen = _Made(lambda: selections(self.program, np, self.base.made()) if self.options.frozen_branches
                            else {})
        self.loss = recorded.loss if recorded is not None else self._forward_loss()
        if recorded is None:  # made here and now: plain dicts from here on
            self.base, self.frozen = self.base.made(), self.frozen.made()
        self.costs = Costs(self.program, self.base, self.frozen)
        self.joint_rows = 0  # perturbed copies joint_losses evaluated (the joint screen's cost)
        self.copies = 0  # perturbed copies of one value evaluated (losses_of, one_hot_losses): localization's cost
        self._direction_seed = None  # joint_directions' seed (content_seed), made when first asked for
        self._flat: dict = {}  # p -> the base's value, flat float64 (flat())
        # complex steps wherever the path allows (fd_complex.py); the rest keep central differences
        # (a loss that is not finite: central differences give NaN, as the non-finite diagnosis expects, where
        # an imaginary part would still carry a finite derivative of an infinite loss)
        off = ("fd_method central" if self.options.method != cx.COMPLEX else "frozen branches off"
               if not self.options.frozen_branches else None if np.isfinite(self.loss) else "the loss is not finite")
        self._complex_on = off is None
        self.slopes = cx.Slopes()  # the elementwise steps' slopes at the base, for complex steps' Pairs
        if recorded is not None:
            self._lacking, self.plan = dict(recorded.lacking), recorded.fd_plan()
        else:
            self._lacking = cx.lacks_complex(self.program, self.frozen, self.base) if self._complex_on else {}
            self.plan: FDPlan = plan(self.costs, self.options, cx.blockers(self.program, self.frozen, self.base, off))
        self.record = recorded or BaseRecord.of(self.loss, self.plan, self._lacking)  # as made, for a split's merge

    def _forward_loss(self) -> float:
        self.base.made()
        return self._base_loss

    def _forward(self) -> dict:
        """The base forward's values (its loss kept beside them); a recorded loss must be its, bit for bit."""
        tape = forward(self.program, NUMPY, self.inputs, grad=False, keep_values=True)
        self._base_loss = float(np.asarray(tape.loss).reshape(-1)[0])
        if self._recorded is not None:
            self._recorded.check(self._base_loss)
        return tape.values

    # -- the plan and its cost model (fd_plan.py) --

    def mode_for(self, param: str) -> FDMode:
        """The parameter's mode in the plan: full | projection | joint."""
        return self.plan[param]

    def own_mode(self, param: str) -> FDMode:
        """How to check one parameter on its own (a joint one the screen flagged): full | projection."""
        return own_mode(self.costs, self.options, param)

    def full_cost(self, p: str) -> float:
        return self.costs.full_cost(p)

    def row_bytes(self, name: str) -> int:
        return self.costs.row_bytes(name)

    def slice_axis(self, name: str) -> int | None:
        return self.costs.slice_axis(name)

    def method_for(self, names) -> str:
        """complex | central: complex steps when no step downstream of `names` lacks a complex form."""
        names = [names] if isinstance(names, str) else list(names)
        if not self._complex_on or any(self.plan.methods.get(n) == cx.CENTRAL for n in names):
            return cx.CENTRAL
        if self._lacking and any(n in self._lacking for n in self.program.downstream(names)):
            return cx.CENTRAL
        return cx.COMPLEX

    def _complex(self, names, evaluate, fallback):
        """evaluate() by complex steps, or fallback() where they do not apply -- or fail (an op that cast
        complex to real, a real part that is not the forward): then those parameters are central from here
        on, and the plan says why."""
        names = [names] if isinstance(names, str) else list(names)
        if self.method_for(names) == cx.CENTRAL:
            return fallback()
        try:
            with cx.ComplexGuard():
                return evaluate()
        except (cx.ComplexStepError, TypeError, np.exceptions.ComplexWarning) as exc:
            why = f"complex forward failed: {(str(exc).splitlines() or [''])[0][:160]}"
            for n in names:
                if n in self.plan.modes:  # a parameter: the report's plan says so
                    self.plan.methods[n], self.plan.fallback[n] = cx.CENTRAL, [why]
                else:  # an intermediate value (localization's): central from here on
                    self._lacking[n] = why
            return fallback()

    def element_noise(self, p: str) -> np.ndarray:
        """The first-pass error an element of p's own difference has before it is evaluated: the rounding
        term of its central difference, or 0 for a complex step (its rounding is relative to the value, and
        below any tolerance's relative part)."""
        x = np.asarray(self.base[p], dtype=np.float64).reshape(-1)
        return np.zeros(x.size) if self.method_for(p) == cx.COMPLEX else self.noise(element_steps(x))

    def step_noise(self, dirs, params, values=None) -> np.ndarray | float:
        """The first-pass error of joint values along dirs over params (values: those values, where known)."""
        if self.method_for(params) == cx.COMPLEX:
            return 0.0 if values is None else cx.first_noise(values)
        return self.noise(dirs.step) if values is None else np.full(len(values), self.noise(dirs.step))

    # -- perturbed copies evaluated: the loss of each --

    def losses(self, param: str, stack: np.ndarray, frozen: bool = True) -> np.ndarray:
        """Loss for each row of stack (B, *shape), in memory-bounded chunks; frozen: on the base's
        branches (self.frozen), else by the ordinary forward (which crosses kinks). A complex stack gives
        complex losses."""
        return self.losses_of(param, stack.shape[0], lambda s, e: stack[s:e], frozen, stack.dtype)

    def losses_of(self, param: str, b: int, rows_of, frozen: bool = True, dtype=np.float64) -> np.ndarray:
        """Loss for each of b copies of param, made by rows_of(s, e) -> (e - s, *shape) one memory-bounded
        chunk at a time (never all b at once: 2k directions of a large parameter would be GBs); dtype:
        the copies' (complex128 for complex steps: a copy costs twice a real one)."""
        rows = max(1, self.options.chunk_bytes // (self.row_bytes(param) * np.dtype(dtype).itemsize // 8))
        self.copies += b
        out = np.empty(b, dtype=dtype)
        pieces = self.frozen if frozen else None
        for s in range(0, b, rows):
            out[s:s + rows] = forward_batched(self.program, NUMPY, self.base, {param: rows_of(s, min(b, s + rows))},
                                              frozen=pieces, **self._complex_args(dtype))
        return out

    def one_hot_losses(self, name: str, flat_index: np.ndarray, new_values: np.ndarray) -> np.ndarray:
        """The loss with element flat_index[k] of `name` set to new_values[k], for each k: each copy
        carried as one changed slice, in memory-bounded chunks (complex new values: complex losses)."""
        dtype = np.result_type(np.float64, np.asarray(new_values).dtype)
        x = np.asarray(self.base[name], dtype=dtype)
        axis = self.slice_axis(name)
        if axis is None:  # a scalar: the stack itself is as small as it gets
            return self.losses(name, np.asarray(new_values, dtype=dtype).reshape((-1,) + x.shape))
        # the first chunk is sized as the rest, by twice what a copy holds at once -- for a parameter the
        # dense copy's (Costs.live_row_bytes: slices hold less), else every downstream value in full; the rest
        # by what a copy really held (a parameter near the loss sized by every value below it left a
        # second chunk of one copy: a second forward through the same steps)
        held = 2 * self.costs.live_row_bytes([name]) if name in self.program.param_set else self.row_bytes(name)
        rows = max(1, self.options.chunk_bytes // (held * x.itemsize // 8))
        out = np.empty(len(flat_index), dtype=dtype)
        self.copies += len(flat_index)
        s = 0
        while s < len(flat_index):
            stats = {}
            stack = one_hot(np, x, axis, flat_index[s:s + rows], new_values[s:s + rows])
            out[s:s + rows] = forward_batched(self.program, NUMPY, self.base, {name: stack}, stats, frozen=self.frozen,
                                              **self._complex_args(dtype))
            s += rows
            # what a copy held at once, twice (an op's temporaries while it runs): values are released
            # after their last reader, so a deep graph's copy holds far less than it makes
            rows = max(1, self.options.chunk_bytes // max(1, 2 * stats["peak_bytes"]))
        return out

    def joint_losses(self, params: list[str], b: int, rows_of, dtype=np.float64, row_bytes=None,
                     pairs: bool = False) -> np.ndarray:
        """The loss for each of b copies, all `params` perturbed together: rows_of(s, e) -> p ->
        (e - s, n_p), the flat copies s..e-1 of each parameter (or Pairs: pairs), made one memory-bounded chunk
        at a time (ResNet-18's 32 copies of its 11.7 M parameters would be 3 GB at once); a chunk's forward is
        done with it when the next is asked for (joint() writes them into one buffer). row_bytes: what a copy
        holds at most, where the caller knows it (else Costs.live_row_bytes)."""
        self.joint_rows += b
        budget = self._joint_chunk_bytes()
        # where even every value's footprint per copy fits all b copies in one chunk, so would what a copy holds
        # (Costs.held_bound: a small graph's chunk, without live_row_bytes' walk)
        if row_bytes is None and budget // self._joint_row(params, dtype, self.costs.held_bound(), pairs) >= b:
            rows = max(1, b)  # (no copies at all: a process of a split screen dealt none)
        else:
            rows = max(1, budget // self._joint_row(params, dtype, row_bytes or self.costs.live_row_bytes(params), pairs))
        out = np.empty(b, dtype=dtype)
        for s in range(0, b, rows):
            e = min(b, s + rows)
            chunk = rows_of(s, e)
            out[s:e] = forward_batched(self.program, NUMPY, self.base, {
                p: chunk[p] if isinstance(chunk[p], Pair) else chunk[p].reshape((-1,) + tuple(self.program.shapes[p]))
                for p in params}, frozen=self.frozen, **self._complex_args(dtype))
        return out

    def _joint_row(self, params: list[str], dtype, held: int, pairs: bool) -> int:
        """Bytes a joint copy of `dtype` costs where it holds `held` bytes as float64 values."""
        row = held * np.dtype(dtype).itemsize // 8
        if pairs:  # the parameters' copies are their imaginary parts alone: 8 bytes an element, not 16
            row = max(8, row - 8 * sum(self.costs.size(p) for p in params))
        return row

    def _complex_args(self, dtype) -> dict:
        """forward_batched's arguments for copies of `dtype`: complex ones are complex steps at the base point
        (a probe's moved real parts are the first step's alone: multilinear and linear ops pass the base's)"""
        if np.dtype(dtype).kind != "c":
            return {}
        return {"complex_steps": True, "slopes": self.slopes}

    def noise(self, h) -> np.ndarray:
        """The first pass's error estimate at step h: the rounding of the loss, ~eps |L| / h."""
        return 4 * EPS * (abs(self.loss) + 1.0) / h

    # -- the first pass: central differences by the plan's scheme --

    def gradient(self, param: str, mode: str | None = None, directions: int | None = None) -> FDResult:
        """dL/d(param); param may also be an intermediate value (fault localization perturbs it and
        re-runs only what is downstream). mode/directions override the options for this call."""
        if not self.costs.reaches_loss(param):
            shape = self.program.shapes[param]  # the loss does not depend on it
            return FDResult(FDMode.FULL, np.zeros(shape), np.zeros(shape))
        mode = mode or self.plan.get(param, self.options.mode)
        if mode == "auto":  # an intermediate value
            mode = FDMode.FULL
        elif mode == FDMode.JOINT:
            mode = self.own_mode(param)
        if mode == FDMode.PROJECTION:
            return self._projection(param, directions or self.options.count)
        shape = np.shape(self.base[param])
        every = self.elements(param, np.arange(int(np.prod(shape, dtype=np.int64))))
        return FDResult(FDMode.FULL, every.reference.reshape(shape), every.noise.reshape(shape),
                        evaluations=every.evaluations, method=every.method)

    def elements(self, param: str, index: np.ndarray) -> FDResult:
        """The flat elements `index` of param, each alone (one-element copies), by complex steps where the
        path allows, else central differences: a "full" FDResult over those elements, flat -- every element
        of a full check, or the few a flagged parameter was narrowed to (verify/joint_check.py)."""
        index = np.asarray(index, dtype=np.intp)
        return self._complex(param, lambda: self._complex_elements(param, index),
                             lambda: self._central_elements(param, index))

    def _complex_elements(self, param: str, index: np.ndarray) -> FDResult:
        x = np.asarray(self.base[param], dtype=np.float64).reshape(-1)[index]
        h = cx.steps(x)
        losses = self.one_hot_losses(param, index, x + 1j * h)
        cx.check_real_part(losses, self.loss)
        d = cx.derivative(losses, h)
        return FDResult(FDMode.FULL, d, cx.first_noise(d), evaluations=index.size, method=cx.COMPLEX)

    def _central_elements(self, param: str, index: np.ndarray) -> FDResult:
        x = np.asarray(self.base[param], dtype=np.float64).reshape(-1)[index]
        h = element_steps(x)
        with np.errstate(invalid="ignore"):  # a non-finite x has a NaN step: NaN rows, as they should
            losses = self.one_hot_losses(param, np.concatenate([index, index]), np.concatenate([x + h, x - h]))
        with np.errstate(all="ignore"):  # inf - inf: the verifier reports NaN/Inf itself
            ref = central(losses[:index.size], losses[index.size:], h)
        return FDResult(FDMode.FULL, ref, self.noise(h), evaluations=2 * index.size)

    def _projection(self, param: str, k: int) -> FDResult:
        v = random_directions(int(np.size(self.base[param])), k, self.options.seed)
        return self._complex(param, lambda: self._complex_projection(param, v),
                             lambda: self._central_projection(param, v))

    def _complex_projection(self, param: str, v: np.ndarray) -> FDResult:
        x = np.asarray(self.base[param], dtype=np.float64)
        flat, h = x.reshape(-1), cx.step_of(x)
        losses = self.losses_of(param, len(v), lambda s, e: (flat + 1j * h * v[s:e]).reshape((e - s,) + x.shape),
                                dtype=np.complex128)
        cx.check_real_part(losses, self.loss)
        d = cx.derivative(losses, h)
        return FDResult(FDMode.PROJECTION, d, cx.first_noise(d), directions=v, evaluations=len(v), method=cx.COMPLEX)

    def _central_projection(self, param: str, v: np.ndarray) -> FDResult:
        x = np.asarray(self.base[param], dtype=np.float64)
        flat, k = x.reshape(-1), len(v)
        h = projection_step(flat)

        def rows_of(s, e):  # copy j < k is flat + h v_j, copy k + j is flat - h v_j
            j = np.arange(s, e)
            return (flat + np.where(j < k, h, -h)[:, None] * v[j % k]).reshape((e - s,) + x.shape)
        losses = self.losses_of(param, 2 * k, rows_of)
        with np.errstate(all="ignore"):
            ref = central(losses[:k], losses[k:], h)
        return FDResult(FDMode.PROJECTION, ref, np.full(k, self.noise(h)), directions=v, evaluations=2 * k)

    def joint_directions(self, params: list[str], k: int | None = None) -> JointDirections:
        """k directions over `params`: per block random Gaussian levels (seeded by the options' seed and the
        graph's content, fd_joint.content_seed), each row about a unit vector."""
        if self._direction_seed is None:
            self._direction_seed = content_seed(self.program, self.inputs, self.options.seed)
        return JointDirections.random({p: self.base[p] for p in params}, k or self.options.count,
                                      self._direction_seed)

    def joint(self, dirs: JointDirections, params: list[str], rows: np.ndarray | None = None) -> FDResult:
        """Directional derivatives of L along the directions `rows` of dirs restricted to the blocks of
        `params` (the others stay put): sum over those p of g_p . v_p, one value per row; by complex steps
        where the path allows, else central differences."""
        rows = np.arange(dirs.k) if rows is None else np.asarray(rows, dtype=np.intp)
        return self._complex(params, lambda: self._complex_joint(dirs, params, rows),
                             lambda: self._central_joint(dirs, params, rows))

    def joint_many(self, dirs: JointDirections, checks: list) -> list[FDResult]:
        """joint() of each (params, rows) of `checks`, the same values, evaluated together: by complex steps,
        the copies of as many checks as fit a joint chunk in one batched forward, each copy perturbing only
        its own check's blocks (a bisection's step over disjoint groups: one forward of the graph below
        them, where a forward per group repeated the graph's per-node cost)."""
        union = list(dict.fromkeys(p for group, _ in checks for p in group))
        if len(checks) > 1 and self.method_for(union) == cx.COMPLEX:
            out = self._complex(union, lambda: [r for chunk, held in self._joint_chunks(checks)
                                                for r in self._complex_joint_many(dirs, chunk, held)], lambda: None)
            if out is not None:
                return out
        return [self.joint(dirs, group, rows) for group, rows in checks]

    def _joint_chunks(self, checks: list) -> list:
        """checks in consecutive runs whose copies together hold at most a joint chunk: each copy holds all
        of its run's blocks, at most the sum of what each check's copy holds (what one holds only grows with
        the blocks perturbed); a check alone over that is chunked by joint_losses. [(run, that sum)]"""
        budget, runs, run, held, copies = self._joint_chunk_bytes(), [], [], 0, 0
        for group, rows in checks:
            live = self.costs.live_row_bytes(group)
            if run and 2 * (copies + len(rows)) * (held + live) > budget:
                runs.append((run, held))
                run, held, copies = [], 0, 0
            run.append((group, rows))
            held, copies = held + live, copies + len(rows)
        return runs + [(run, held)]

    def _joint_chunk_bytes(self) -> int:
        """What one chunk of joint copies may hold."""
        held = 8 * (self.costs.forward_values() + sum(self.costs.size(p) for p in self.program.params))
        return max(self.options.chunk_bytes, min(JOINT_CHUNK_BYTES, held))

    def _complex_joint_many(self, dirs: JointDirections, checks: list, held: int) -> list[FDResult]:
        union = list(dict.fromkeys(p for group, _ in checks for p in group))
        row = np.concatenate([np.asarray(rows, dtype=np.intp) for _, rows in checks])
        start = np.cumsum([0] + [len(rows) for _, rows in checks])  # each check's first copy
        h = self.complex_step_of(dirs)

        def rows_of(s, e):  # copy c: its check's blocks along row[c], every other block at the base -- as Pairs
            imag = {p: np.zeros((e - s, self.costs.size(p))) for p in union}  # (executor.Pair: the base shared)
            for (group, _), a, b in zip(checks, start[:-1], start[1:]):
                a, b = max(s, a), min(e, b)
                for p in group if a < b else ():
                    dirs.perturbed_imag(p, h, row[a:b], imag[p][a - s:b - s])
            shapes = {p: tuple(self.program.shapes[p]) for p in union}
            return {p: Pair(self.flat(p).reshape(shapes[p]), v.reshape((e - s,) + shapes[p])) for p, v in imag.items()}
        losses = self.joint_losses(union, len(row), rows_of, dtype=np.complex128, row_bytes=held, pairs=True)
        cx.check_real_part(losses, self.loss)  # as _joint_derivatives: a densified Pair recomputes the real part
        d = cx.derivative(losses, h)
        return [FDResult(FDMode.JOINT, v, cx.first_noise(v), evaluations=len(v), method=cx.COMPLEX)
                for v in np.split(d, start[1:-1])]

    def _joint_derivatives(self, dirs: JointDirections, params: list[str], rows: np.ndarray, x0: dict,
                           f: float = 1.0) -> np.ndarray:
        """Im L / h along dirs' `rows` over `params`, from base points x0 (p -> flat real values), the
        complex step f x the directions' own (one copy per row)."""
        h = f * self.complex_step_of(dirs)
        # at the base point itself each copy is carried as its imaginary part (executor.Pair: the real part
        # the base's, shared); a probe's moved base point (f != 1) is a whole complex copy per row
        pairs = f == 1.0 and all(x0[p] is self.flat(p) for p in params)
        dtype = np.float64 if pairs else np.complex128
        buffers = {p: np.empty((0, x.size), dtype) for p, x in x0.items()}

        def rows_of(s, e):
            for p in params:
                if len(buffers[p]) < e - s:
                    buffers[p] = np.empty((e - s, x0[p].size), dtype)
            if not pairs:
                return {p: dirs.perturbed_complex(p, x0[p], h, rows[s:e], buffers[p]) for p in params}
            return {p: Pair(x0[p].reshape(self.program.shapes[p]), dirs.perturbed_imag(p, h, rows[s:e], buffers[p])
                            .reshape((e - s,) + tuple(self.program.shapes[p]))) for p in params}
        losses = self.joint_losses(params, len(rows), rows_of, dtype=np.complex128, pairs=pairs)
        if f == 1.0:
            cx.check_real_part(losses, self.loss)
        return cx.derivative(losses, h)

    def complex_step_of(self, dirs: JointDirections) -> float:
        """The complex step of joint directions: their (central) step scaled to fd_complex.STEP."""
        return dirs.step * (cx.STEP / STEP_SCALE)

    def flat(self, p: str) -> np.ndarray:
        """The base's value of p as flat float64 (made once: the joint screen's base point)."""
        if p not in self._flat:
            self._flat[p] = np.asarray(self.base[p], dtype=np.float64).reshape(-1)
        return self._flat[p]

    def _complex_joint(self, dirs: JointDirections, params: list[str], rows: np.ndarray) -> FDResult:
        flat = {p: self.flat(p) for p in params}
        d = self._joint_derivatives(dirs, params, rows, flat)
        return FDResult(FDMode.JOINT, d, cx.first_noise(d), evaluations=len(rows), method=cx.COMPLEX)

    def _central_joint(self, dirs: JointDirections, params: list[str], rows: np.ndarray) -> FDResult:
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
            ref = central(losses[:m], losses[m:], h)
        return FDResult(FDMode.JOINT, ref, np.full(m, self.noise(h)), evaluations=2 * m)

    # -- refinement (fd_formulas.ladder) and one-sided differences, of what the first pass took --

    def refine(self, param: str, result: FDResult, which: np.ndarray, settled=None) -> Refined:
        """The values of `result` (a gradient of param) at flat indices `which`, refined on the ladder
        of steps: for full results the elements, for projections the directions. settled: see
        fd_formulas.ladder (the caller's test of "good enough", which stops a value's descent)."""
        flat = np.asarray(self.base[param], dtype=np.float64).reshape(-1)
        which = np.asarray(which, dtype=np.intp)
        if result.method == cx.COMPLEX:  # probed; where a complex forward fails now, the ladder below
            probed = self._complex(param, lambda: self._probe(param, result, which), lambda: None)
            if probed is not None:
                return probed

        def evaluate(stack):
            losses = self.losses(param, stack.reshape((len(stack),) + np.shape(self.base[param])))
            return losses, np.abs(losses)
        if result.mode == FDMode.FULL:
            return ladder(evaluate, self.loss, Moves(flat, index=which), element_steps(flat[which]), which, settled)
        return ladder(evaluate, self.loss, Moves(flat, directions=result.directions[which]),
                      np.full(which.size, projection_step(flat)), which, settled)

    def refine_joint(self, dirs: JointDirections, params: list[str], rows: np.ndarray, which: np.ndarray,
                     settled=None, first=None) -> Refined:
        """joint()'s values at positions `which` of `rows`, refined on the ladder of steps (complex
        steps: probed, fd_complex.probed; first: the complex first pass's values there, not evaluated again)."""
        which = np.asarray(which, dtype=np.intp)
        if self.method_for(params) == cx.COMPLEX:
            x0 = {p: np.asarray(self.base[p], dtype=np.float64).reshape(-1) for p in params}
            sel = np.asarray(rows, dtype=np.intp)[which]
            probed = self._complex(params, lambda: cx.probed(
                lambda x, f: self._joint_derivatives(dirs, params, sel, x, f), x0, which,
                self.complex_step_of(dirs), first=first), lambda: None)  # a complex forward failing: the ladder
            if probed is not None:
                return probed
        cuts = np.cumsum([self.costs.size(p) for p in params])[:-1]
        flat = np.concatenate([np.asarray(self.base[p], dtype=np.float64).reshape(-1) for p in params])
        d = np.concatenate([dirs.block(p, np.asarray(rows)[which]) for p in params], axis=1)

        def evaluate(stack):
            losses = self.joint_losses(params, len(stack),
                                       lambda s, e: dict(zip(params, np.split(stack[s:e], cuts, axis=1))))
            return losses, np.abs(losses)
        return ladder(evaluate, self.loss, Moves(flat, directions=d), np.full(which.size, dirs.step), which, settled)

    def _probe(self, param: str, result: FDResult, which: np.ndarray):
        """A complex-step result's values `which` (flat elements, or directions of a projection) probed."""
        x = np.asarray(self.base[param], dtype=np.float64)
        flat = x.reshape(-1)
        if result.mode == FDMode.FULL:
            h = cx.steps(flat[which])

            def evaluate(x0, f):
                return cx.derivative(self.one_hot_losses(param, which, x0["x"] + 1j * f * h), f * h)

            def many(points):  # every probe's copies in one batched forward
                losses = self.one_hot_losses(param, np.tile(which, len(points)),
                                             np.concatenate([x0["x"] + 1j * f * h for x0, f in points]))
                return [cx.derivative(row, f * h) for row, (_, f) in zip(losses.reshape(len(points), -1), points)]
            # the base point's values are the first pass's own (the same one-element copies, the same step),
            # where it covers the whole parameter (`which` indexes the parameter, not a subset's result)
            ref = np.asarray(result.reference, dtype=np.float64).reshape(-1)
            return cx.probed(evaluate, {"x": flat[which]}, which, h, many, first=ref[which] if ref.size == flat.size
                             else None)
        v, h = result.directions[which], cx.step_of(flat)

        def along(x0, f):
            return cx.derivative(self.losses_of(param, len(v), lambda s, e: (
                x0["x"] + 1j * f * h * v[s:e]).reshape((e - s,) + x.shape), dtype=np.complex128), f * h)
        return cx.probed(along, {"x": flat}, which, h)

    def one_sided(self, param: str, directions: np.ndarray, steps: np.ndarray):
        """(left, right): second-order one-sided differences of L along each direction (m, n) of
        param, with step steps[j] for direction j (fd_formulas.one_sided). By the ordinary forward,
        never frozen: they must see both sides of a kink."""
        shape = np.shape(self.base[param])
        flat = np.asarray(self.base[param], dtype=np.float64).reshape(-1)
        return one_sided_pair(lambda stack: self.losses(param, stack.reshape((len(stack),) + shape), frozen=False),
                              self.loss, Moves(flat, directions=directions), steps)
