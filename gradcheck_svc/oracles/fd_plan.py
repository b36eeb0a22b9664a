"""The finite-difference plan: what to difference, by which scheme, at what cost.

`plan(costs, options) -> FDPlan` decides each parameter's mode before any difference is taken, from a
cost model counted in values evaluated (Costs: every value downstream of what is perturbed, per perturbed
copy; a full check's one-element copies measured on one sliced copy, ops/slices.py). The FDPlan is plain
data: the modes, and what the first pass will cost -- perturbed forwards and values, and those values as
whole-graph evaluations -- which the report states (Report.fd_plan). Refinement and the joint screen's
bisection come on top, only where the first pass disagrees; the report's per-parameter `fd_evaluations`
count what was spent.

Each parameter's method (fd_complex.py): complex steps -- one complex forward per value, exact to its
rounding -- wherever no op downstream lacks a complex form, else real central differences (FDPlan.methods,
and FDPlan.fallback names the ops). A complex forward is counted as one forward and as two real values.

full: every element of every parameter. projection: k random directions per parameter. joint: k
directions spanning every parameter at once (finite_diff.py's docstring). auto: see plan().
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..backend import NUMPY
from ..engine import forward_batched
from ..ops.slices import one_hot
from .fd_complex import CENTRAL, COMPLEX
from .fd_modes import FDMode

MODES = tuple(m.value for m in FDMode)  # the fd option's values: auto, then the three modes

# auto's full checks next to the joint screen: the cheapest parameters, while their values together
# stay within this share of the joint pass's. Counted in values, a full check's one-element copies
# cost more per value than the joint pass's whole-graph ones (ResNet-18: its 16 cheapest tensors,
# within the joint pass's values, took 6x its time; 4 within an eighth, 60% of it). The screen covers
# them all the same; full checks add element-wise detail where it is cheap (chain_256's last biases)
JOINT_FULL_SHARE = 1 / 16
# directions: per projected parameter, and the joint screen's at most (its cap) where the option is not given
DIRECTIONS = 16
# the joint screen's least directions where the power chooses them (verify/joint_check.py joint_k): fewer would
# leave two opposite errors on neighbouring elements unseen too often -- they cancel in a direction where their
# two levels (fd_joint.LEVELS) are equal, probability 1/128, or at the default tolerances' worst within 1 of each
# other, ~3/128: in all 4 directions ~4e-9 to ~3e-7, against 2^-16 = 1.5e-5 for the 16 sign directions this
# screen began with
MIN_DIRECTIONS = 4


@dataclass
class FDOptions:
    mode: str = "auto"  # full | projection | joint | auto
    projection_threshold: int = 100_000  # elements per parameter above which auto projects
    # auto checks in full at most this many values (2 x elements x values downstream, summed: counted
    # densely, and where that is over, measured on one sliced copy), whatever the joint pass would cost
    # (plan(): in full only while no dearer than the joint screen); ~1e9 is a few seconds of NumPy on one
    # core. own_mode: a flagged parameter whose full check alone is over is narrowed or projected instead
    full_cost_budget: float = 1e9
    # random directions: exactly this many per projected parameter and for the joint screen; None (the default):
    # DIRECTIONS per projected parameter, and the joint screen's chosen by its power (joint_check.joint_k)
    directions: int | None = None
    seed: int = 0
    # memory budget for one stacked batch: small enough that a chunk's values stay in
    # cache (bench/bench_fd.py: 8 MiB is ~2x faster than 128 MiB at 2,000 elements)
    chunk_bytes: int = 8 * 2**20
    # frozen branches: the perturbed forwards evaluate every piecewise op on the piece the unperturbed
    # forward took (OpDef.select / frozen), so no difference straddles a kink (off: ordinary parameter-
    # level forwards, for comparison; the one-sided differences at a kink are always ordinary, one op's
    # local differences always frozen)
    frozen_branches: bool = True
    # "complex": complex-step differences (fd_complex.py) wherever the path allows (they need frozen branches),
    # real central ones elsewhere; "central": real central differences everywhere (the option fd_method)
    method: str = COMPLEX

    @property
    def count(self) -> int:
        """The directions asked for, or DIRECTIONS: a projection's, and the joint screen's at most."""
        return self.directions or DIRECTIONS


class Costs:
    """The cost model: values each kind of check evaluates, per perturbed copy and in all. program, and
    base (a keep_values forward) and frozen (its selections) for the one sliced copy a full check is
    measured on."""

    def __init__(self, program, base: dict, frozen: dict):
        self.program, self.base, self.frozen = program, base, frozen
        self._row_bytes: dict = {}
        self._sliced_cost: dict[str, float] = {}
        self._to_loss: set[str] = set()  # parameters the loss depends on (_param_row_bytes)
        self._axis: dict | None = None  # slice_axis, every value's (made in one pass over the steps)
        self._forward_values: int | None = None
        self._walk = None  # live_row_bytes' per-step tables (_walk_tables)
        self._reach: dict | None = None  # value -> the parameters it depends on, as bits (_param_row_bytes)
        self._held_bound: int | None = None

    def size(self, p: str) -> int:
        return math.prod(self.program.shapes[p])

    def forward_values(self) -> int:
        """Values one forward of everything downstream of the parameters evaluates (the joint pass's copy)."""
        if self._forward_values is None:  # asked per joint chunk: a walk over every step each time
            params = list(self.program.params)
            self._forward_values = max(1, sum(math.prod(self.program.shapes[v])
                                              for v in self.program.downstream(params))) if params else 1
        return self._forward_values

    def joint_cost(self, k: int) -> float:
        """Values the joint pass evaluates: 2k copies of everything downstream of the parameters."""
        return 2 * k * self.forward_values() if self.program.params else 0.0

    def dense_full_cost(self, p: str) -> float:
        """A full check of p counted densely: 2 x elements x every value downstream."""
        return 2 * self.size(p) * self.row_bytes(p) / 8

    def full_cost(self, p: str) -> float:
        """Values a full check of p evaluates: 2 x elements x values one copy evaluates, measured on
        one sliced copy (slices make it far below the dense bound)."""
        if p not in self._sliced_cost:  # never above the dense bound (own_mode's shortcut relies on it)
            self._sliced_cost[p] = min(2 * self.size(p) * self._sliced_row_values(p),
                                       self.dense_full_cost(p)) if self.size(p) else 0.0
        return self._sliced_cost[p]

    def projection_cost(self, p: str, k: int) -> float:
        """Values k projections of p evaluate: 2k copies of what is downstream."""
        return 2.0 * k * self.row_bytes(p) / 8

    def reaches_loss(self, name: str) -> bool:
        if name in self.program.params:
            self.row_bytes(name)  # computes the parameters' reach, the loss's among it
            return name in self._to_loss
        return self.program.output in self.program.downstream([name])

    def row_bytes(self, name: str) -> int:
        """Bytes one batch row costs: every value downstream of `name`."""
        if name not in self._row_bytes and name in self.program.params:
            self._param_row_bytes()
        if name not in self._row_bytes:
            self._row_bytes[name] = 8 * max(1, sum(self.program.footprint[v]
                                                   for v in self.program.downstream([name])))
        return self._row_bytes[name]

    def set_row_bytes(self, params) -> int:
        """Bytes one batch row costs when all of `params` are perturbed together."""
        key = tuple(params)
        if key not in self._row_bytes:
            self._row_bytes[key] = 8 * max(1, sum(self.program.footprint[v]
                                                  for v in self.program.downstream(list(params))))
        return self._row_bytes[key]

    def live_row_bytes(self, params) -> int:
        """The most bytes one copy holds at once, all of `params` (parameters) perturbed together, as
        forward_batched evaluates it (each value released after its last consumer; a value costs its op's
        temporary too while it is made), the perturbed parameters included: what a joint chunk's row costs.
        On the steps as arrays (which parameters each step's value depends on: _param_row_bytes), not a walk
        of the steps per call -- a bisection's level asks for each of its groups."""
        if self._walk is None:
            self._walk_tables()
        index, reached, size, footprint, at, of, freed = self._walk
        mask = np.zeros(len(index), bool)
        mask[[index[p] for p in params]] = True
        held = (reached & np.packbits(mask)).any(axis=1)  # the steps a copy makes (reads a perturbed value)
        live0 = int(sum(self.size(p) for p in set(params)))
        # made less released, at the steps it makes: a released value is one it made
        delta = held * (size - np.bincount(at, weights=held[of] * freed, minlength=len(size)).astype(np.int64))
        before = live0 + np.cumsum(delta) - delta
        peak = max(live0, int(np.max(np.where(held, before + footprint, 0), initial=0)))
        return 8 * max(1, peak)

    def held_bound(self) -> int:
        """Bytes no copy can hold more of, whatever is perturbed: every value's footprint (each input's and each
        step's, a value's size included) -- above live_row_bytes of any parameters, without its walk."""
        if self._held_bound is None:
            self._held_bound = 8 * max(1, sum(self.program.footprint.values()))
        return self._held_bound

    def _reached(self) -> np.ndarray:
        """(steps, parameters) bool: which parameters each step's value depends on, from the reachability of
        _param_row_bytes (one Python int of parameter bits per value: an OR per step, not a NumPy call)."""
        if self._reach is None:
            self._param_row_bytes()
        n, bits = len(self.program.params), self._reach
        width = max(1, (n + 7) // 8)
        raw = b"".join(bits.get(s.name, 0).to_bytes(width, "little") for s in self.program.steps)
        flat = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")
        return flat.reshape(len(self.program.steps), 8 * width)[:, :n].astype(bool)

    def _param_row_bytes(self) -> None:
        """row_bytes of every parameter in one pass over the steps (a reachability matrix: value x
        parameter), not one pass per parameter -- a graph of 512 parameters spent 0.4 s here."""
        params = list(self.program.params)
        reach = {p: 1 << i for i, p in enumerate(params)}  # value -> the parameters it depends on, as bits
        for step in self.program.steps:
            r = 0
            for n in step.inputs:
                r |= reach.get(n, 0)
            if r:
                reach[step.name] = r
        self._reach = reach
        sizes = np.array([math.prod(self.program.shapes[p]) for p in params], dtype=np.float64)
        footprint = np.array([self.program.footprint[s.name] for s in self.program.steps], dtype=np.float64)
        # every value's footprint summed per parameter it depends on: integers, exact in float64 in any order
        total = sizes + footprint @ self._reached() if params else sizes
        for i, p in enumerate(params):
            self._row_bytes[p] = 8 * max(1, int(total[i]))
        out = reach.get(self.program.output, 0)
        self._to_loss = {p for i, p in enumerate(params) if p == self.program.output or out >> i & 1}

    def _walk_tables(self) -> None:
        """live_row_bytes' tables: per step the parameters its value depends on (bits), its size and
        footprint; per value released, the step releasing it, the step making it, its size. Made when first
        asked for: a small graph's joint pass is one chunk without them (FiniteDifferences.joint_losses)."""
        steps, shapes = self.program.steps, self.program.shapes
        index = {p: i for i, p in enumerate(self.program.params)}
        reached = np.packbits(self._reached(), axis=1)
        made = {s.name: i for i, s in enumerate(steps)}
        freed = [(i, made[n]) for i, s in enumerate(steps) for n in s.release if n in made]
        at, of = (np.array([f[k] for f in freed], dtype=np.intp) for k in (0, 1))
        size = np.array([math.prod(shapes[s.name]) for s in steps], dtype=np.int64)
        footprint = np.array([self.program.footprint[s.name] for s in steps], dtype=np.int64)
        self._walk = (index, reached, size, footprint, at, of, size[of])

    def slice_axis(self, name: str) -> int | None:
        """The axis one-element perturbations of `name` are carried along (ops/slices.py): the first
        one a consumer prefers (matmul: a's rows, b's columns; conv: W's filters), else the last;
        None for a scalar."""
        if len(self.program.shapes[name]) == 0:
            return None
        if self._axis is None:
            self._axis = self._slice_axes()
        return self._axis.get(name, -1)

    def _slice_axes(self) -> dict:
        """slice_axis of every value a consumer prefers an axis of, in one pass over the steps."""
        out = {}
        for step in self.program.steps:
            prefer = step.op.sliced_axes
            for k, n in enumerate(step.inputs):
                if n in out or not prefer:
                    continue
                rank = len(self.program.shapes[n])
                axis = prefer[min(k, len(prefer) - 1)]
                axis = axis - rank if axis >= 0 else axis  # OpDef.sliced_axes may count from the front
                if -rank <= axis < 0:
                    out[n] = axis
        return out

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


@dataclass(frozen=True)
class FDPlan:
    """Each parameter's mode and what the first pass costs: `forwards` perturbed forwards (2 per element
    checked in full, 2k per projected parameter, 2k for the joint screen however many it spans), of part
    of the graph or all of it, evaluating `values` values -- `whole_graph_evaluations` forwards of the
    whole graph's worth (values / forward_values)."""

    mode: str  # the option: auto | full | projection | joint
    modes: dict = field(default_factory=dict)  # parameter -> full | projection | joint
    directions: int = 16
    forwards: int = 0
    values: float = 0.0
    forward_values: int = 1  # values one forward of the graph (downstream of its parameters) evaluates
    methods: dict = field(default_factory=dict)  # parameter -> complex | central
    fallback: dict = field(default_factory=dict)  # parameter on central differences -> why (the ops)
    # how the joint screen's directions were chosen (with_joint_directions; "" before a screen, or without one)
    directions_why: str = ""
    # parameters the joint screen judged through another gradient in the subject's place -> why
    # (verify/stand_in.py: a float32 subject within its tolerance of the engine's float64 gradient)
    stand_in: dict = field(default_factory=dict)

    def __getitem__(self, p: str) -> FDMode:
        return self.modes[p]

    def get(self, p: str, default=None):
        return self.modes.get(p, default)

    @property
    def whole_graph_evaluations(self) -> float:
        return self.values / self.forward_values

    def counts(self) -> dict:
        """Parameters per mode, in MODES' order."""
        out = {m: 0 for m in MODES[1:]}
        for m in self.modes.values():
            out[m] += 1
        return {m: n for m, n in out.items() if n}

    def to_dict(self) -> dict:
        return {"mode": self.mode, "parameters": self.counts(), "directions": self.directions,
                "forwards": int(self.forwards), "values": float(self.values),
                "forward_values": int(self.forward_values),
                "whole_graph_evaluations": round(self.whole_graph_evaluations, 3),
                "method": dict(self.methods), "method_fallback": {p: ", ".join(v) for p, v in self.fallback.items()},
                **({"directions_why": self.directions_why} if self.directions_why else {}),
                **({"stand_in": dict(self.stand_in)} if self.stand_in else {})}


def plan_record(plan_: FDPlan) -> dict:
    """The plan as JSON values (a copy: the plan's dicts may change later, a fallback's methods)."""
    d = dataclasses.asdict(plan_)
    d["modes"] = {p: str(m) for p, m in plan_.modes.items()}
    return d


def plan_of_record(d: dict) -> FDPlan:
    """plan_record's inverse: auto's modes are FDMode members (_auto_modes), an option's its text (plan())."""
    mode = str(d["mode"])
    modes = {str(p): FDMode(m) if mode == "auto" else str(m) for p, m in d["modes"].items()}
    values = d["values"]  # as counted: an int where only the joint screen's whole copies are (joint_cost)
    if not isinstance(values, (int, float)):
        raise TypeError("the plan's values are not a number")
    return FDPlan(mode, modes, int(d["directions"]), int(d["forwards"]), values, int(d["forward_values"]),
                  {str(p): str(m) for p, m in d["methods"].items()},
                  {str(p): [str(w) for w in v] for p, v in d["fallback"].items()}, str(d["directions_why"]),
                  {str(p): str(w) for p, w in d["stand_in"].items()})


def with_joint_directions(plan_: FDPlan, costs: Costs, k: int, why: str) -> FDPlan:
    """The plan with the joint screen's first pass at the k directions it chose (why: how), its cost recounted
    (the modes were planned at the cap, FDOptions.count, and stay)."""
    joint = [p for p, m in plan_.modes.items() if m == FDMode.JOINT]
    if not joint:
        return plan_
    per = 2 if any(plan_.methods.get(p) == CENTRAL for p in joint) else 1
    return dataclasses.replace(plan_, directions=k, forwards=plan_.forwards + per * (k - plan_.directions),
                               values=plan_.values + costs.joint_cost(k) - costs.joint_cost(plan_.directions),
                               directions_why=why)


def plan(costs: Costs, options: FDOptions, blocked: dict | None = None) -> FDPlan:
    """The plan of options.mode: every parameter so (projection, joint: the tiny or huge ones too), or
    auto's (_auto_modes), with its cost. blocked: parameter -> the ops that keep it on central differences
    (fd_complex.blockers); the others take complex steps, one forward per value instead of two."""
    params = list(costs.program.params)
    blocked = blocked or {}
    modes = _auto_modes(costs, options) if options.mode == "auto" else {p: options.mode for p in params}
    methods = {p: CENTRAL if p in blocked else COMPLEX for p in params}
    k = options.count
    forwards, values = 0, 0.0
    joint = [p for p, m in modes.items() if m == FDMode.JOINT]
    if joint:
        forwards, values = (2 if any(methods[p] == CENTRAL for p in joint) else 1) * k, costs.joint_cost(k)
    for p, m in modes.items():
        if not costs.reaches_loss(p):  # its gradient is zero without a difference taken
            continue
        per = 2 if methods[p] == CENTRAL else 1  # perturbed forwards per value
        if m == FDMode.FULL:
            forwards, values = forwards + per * costs.size(p), values + costs.full_cost(p)
        elif m == FDMode.PROJECTION:
            forwards, values = forwards + per * k, values + costs.projection_cost(p, k)
    return FDPlan(options.mode, modes, k, forwards, values, costs.forward_values(), methods,
                  {p: list(v) for p, v in blocked.items()})


def _auto_modes(costs: Costs, options: FDOptions) -> dict[str, str]:
    """auto: the cheaper of two plans, so that its cost never jumps as a graph grows (min of two costs that
    grow with the graph) -- every parameter in full, or the joint screen (2k forwards of the whole graph)
    with the cheapest parameters checked in full while their cost together stays within JOINT_FULL_SHARE
    of the joint pass's. In full, then, only while that costs no more than the screen (and stays within
    full_cost_budget): a full check's cost per parameter is never far above the screen's, and the whole
    first pass stays within (1 + JOINT_FULL_SHARE) 2k forwards of the graph. Parameters above the size
    threshold are screened jointly whatever the rest costs."""
    params = list(costs.program.params)
    joint = costs.joint_cost(options.count)
    # above the size threshold, the joint screen rather than projections of each parameter: the same 2k
    # forwards, and a flag is narrowed to elements (verify/joint_check.py) -- a few random projections
    # would not see one wrong element of 10^5 (it moves each by e / sqrt(n))
    modes = {p: FDMode.JOINT if costs.size(p) > options.projection_threshold else FDMode.FULL for p in params}
    rest = [p for p in params if modes[p] == FDMode.FULL]
    dense = {p: costs.dense_full_cost(p) for p in rest}
    budget = min(options.full_cost_budget, (1 + JOINT_FULL_SHARE) * joint)
    if len(rest) == len(params) and _fits(costs, dense, budget):
        return modes
    cheap, spent, share = set(), 0.0, min(options.full_cost_budget, JOINT_FULL_SHARE * joint)
    for p in sorted(rest, key=dense.get):
        if spent + dense[p] > share:
            break
        cheap.add(p)
        spent += dense[p]
    return {p: FDMode.FULL if p in cheap else FDMode.JOINT for p in params}


def _fits(costs: Costs, dense: dict, budget: float) -> bool:
    """Whether full checks of the parameters in `dense` (their dense costs) stay within budget: counted
    densely, and where that is over, measured (one sliced copy each) costliest first until the rest fits
    (dense bounds for the unmeasured) or what is measured alone is over."""
    total, measured = sum(dense.values()), 0.0
    if total <= budget:
        return True
    for p in sorted(dense, key=dense.get, reverse=True):
        if total <= budget:
            return True
        if measured > budget:
            break
        total += costs.full_cost(p) - dense[p]
        measured += costs.full_cost(p)
    return total <= budget


def own_mode(costs: Costs, options: FDOptions, param: str) -> FDMode:
    """How to check one parameter on its own (a joint one the screen flagged): full unless it is over the
    size threshold or its full check alone would exceed the cost budget. The full check is measured (a
    sliced copy's forward through everything downstream) only where its dense bound is over the budget: a
    deep fault flags hundreds of parameters, and measuring each cost a forward of its own."""
    over = options.full_cost_budget
    if costs.size(param) > options.projection_threshold or (
            costs.dense_full_cost(param) > over and costs.full_cost(param) > over):
        return FDMode.PROJECTION
    return FDMode.FULL
