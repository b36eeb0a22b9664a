"""The engine's runs of one verification: forward (with faults injected), backward, and the
memory profile's extra runs. Below both verify() (run.py) and the diagnosis, which re-runs the
engine keeping every adjoint to localize a fault.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from gradcheck_core.hints import hint

from ..backend import get_backend
from ..engine import Program, backward, checkpoint_plan, forward, inject, parse_policy, prepare_feeds
from ..engine.faults import STALE_STEP
from ..engine.program import program_of
from ..errors import OptionError
from ..graph.ir import Graph
from ..engine import budget
from . import memory_profile, recompute_check
from .options import DTYPES, VerifyOptions
from .report import FaultRecord


@dataclass
class EngineRun:
    """The engine's side of a verification."""

    loss: float
    gradients: dict  # name -> float64 host array
    memory: dict
    faults: list[FaultRecord]
    seconds: float
    events: list = field(default_factory=list)  # SavedStore events: corruption / in-place writes
    program: Program | None = None
    adjoints: dict = field(default_factory=dict)  # keep_adjoints: name -> float64 host dL/dv
    contributions: dict = field(default_factory=dict)  # keep_adjoints: (step, input index) -> host array
    findings: list = field(default_factory=list)  # recompute mismatches under checkpointing
    timelines: dict = field(default_factory=dict)  # run label -> [(step label, live bytes)]


def _earlier_values(program: Program, backend, faults) -> dict | None:
    """Values of an earlier forward (every parameter STEP smaller), for stale-cache faults."""
    stale = [f for f in faults if f.kind == "stale"]
    if not stale:
        return None
    step = stale[0].value if stale[0].value is not None else STALE_STEP
    shifted = {p: program.graph.inputs[p].value - step for p in program.params}
    return forward(program, backend, prepare_feeds(program, backend, shifted), grad=False, keep_values=True).values


class _Setup(NamedTuple):
    """What every gradient run of one run_engine shares: earlier, the stale-cache faults' values
    (_earlier_values); profile: record the timeline and which node saved what (the memory profile reads both)."""

    program: Program
    backend: object
    options: VerifyOptions
    earlier: dict | None
    profile: bool


def _gradient_run(setup: _Setup, plan, faults, keep_adjoints=False, integrity=None, twin=False):
    """forward (+ faults) + backward; returns (tape, device gradients, fault records, seconds).
    Each run gets fresh feeds: in-place nodes write into them. twin: count the no-grad forward's
    figures beside this run's forward (tape.inference; executor.forward)."""
    program, backend, options, earlier, profile = setup
    t0 = time.perf_counter()
    feeds = prepare_feeds(program, backend)
    tape = forward(program, backend, feeds, grad=True, checkpoint=plan,
                   record_timeline=options.memory_timeline or profile,
                   integrity=integrity or options.integrity, allow_inplace_hazards=options.allow_inplace_hazards,
                   inference_twin=twin)
    if profile:
        tape.saved_by_node = tape.store.saved_by_node()  # before faults and the backward change the store
    records = []
    for f in faults:
        eff = inject(backend.xp, tape.store, f, backend.to_host, earlier)
        records.append(FaultRecord(str(f), eff.readers, eff.before, eff.after, eff.index))
    grads = backward(tape, keep_adjoints=keep_adjoints)
    backend.synchronize()
    return tape, grads, records, time.perf_counter() - t0


def _metering_forward(program, backend):
    """The plain gradient run's forward, counted without keeping what it saves (its timeline and
    who saved what: the memory profile's and the budget planner's input)."""
    tape = forward(program, backend, prepare_feeds(program, backend), grad=True, metering=True, record_timeline=True)
    tape.saved_by_node = tape.store.saved_by_node()
    return tape


@dataclass
class _GradientRun:
    """One forward (+ faults) + backward: its tape, device gradients, fault records and seconds."""

    tape: object
    grads: dict
    records: list
    seconds: float


def _check_engine_options(program, options: VerifyOptions, dtype: str) -> None:
    """What only the program can tell: a fault's node exists; the optimizer's dtype is one. (The options
    that are wrong whatever the graph were checked once, at the edge: verify/options.check.)"""
    for f in options.faults:
        if f.node not in program.shapes:
            raise OptionError(f"fault names unknown value '{f.node}'{hint(f.node, program.shapes, what='values')}",
                              field="fault")
    memory_profile.optimizer_state_bytes(options.optimizer, options.optimizer_dtype or dtype, 0)  # (its errors, now)


def profile_asked(options: VerifyOptions) -> bool:
    """Whether the memory profile's extra runs are made: unless memory_profile is off (a timeline, which
    the profile records, turns it on)."""
    return options.memory_profile or options.memory_timeline


def run_engine(graph: Graph, options: VerifyOptions, dtype: str, keep_adjoints: bool = False,
               profile: bool | None = None, what_if: bool = True) -> EngineRun:
    """The engine's phases: the gradient run whose gradients are reported (faults injected into it),
    then -- for the memory profile only (`profile`, default profile_asked(options)) -- an inference
    (no-grad) forward and a checkpointed what-if. Without a checkpoint policy the what-if is sqrt (not
    for graphs with in-place nodes); under a policy the reported run is checkpointed and the
    un-checkpointed figures come from a metering forward, so the process never holds every activation
    at once. profile=False: only the reported gradient run, e.g. to re-trace adjoints for localization.
    what_if=False: the profile without the sqrt what-if, which another process makes (what_if_figures)."""
    profile = profile_asked(options) if profile is None else profile
    backend = get_backend(options.device)
    program = program_of(graph, DTYPES[dtype])
    _check_engine_options(program, options, dtype)
    policy = parse_policy(options.checkpoint)
    metered = chosen = None
    if policy.kind == "budget":  # the segments come from what the plain run would save: meter it first
        if program.inplace_root:
            raise OptionError("checkpointing a graph with in-place nodes is not supported", field="checkpoint")
        metered = _metering_forward(program, backend)
        chosen = budget.plan_for_budget(program, metered, policy.k)
    requested = checkpoint_plan(program, policy, ends=chosen.ends if chosen else None)
    setup = _Setup(program, backend, options, _earlier_values(program, backend, options.faults), profile)
    run = lambda plan, **kw: _GradientRun(*_gradient_run(setup, plan, **kw))  # noqa: E731
    # the inference figures: counted beside the reported run's forward (the same holds and drops a
    # no-grad forward makes), or -- from a device's samples -- a no-grad forward of their own
    twin = profile and backend.memory_sampler() is None
    if requested is None:
        reported = run(None, faults=options.faults, keep_adjoints=keep_adjoints, twin=twin)
        plain, inference = reported.tape, _inference(program, backend, reported, profile and not twin)
        what_if_plan = checkpoint_plan(program, "sqrt") if profile and what_if and not program.inplace_root else None
        # the sqrt what-if reports memory, not gradients: its saved tensors need no fingerprints
        checked = run(what_if_plan, faults=(), integrity="off") if what_if_plan is not None else None
        equal = _bitwise_equal(backend, reported.grads, checked.grads) if checked is not None else None
        profile_plan = what_if_plan
    else:
        checked = reported = run(requested, faults=options.faults, keep_adjoints=keep_adjoints, twin=twin)
        inference = _inference(program, backend, reported, profile and not twin)
        # Under a policy the un-checkpointed run is never made: its activations are what the
        # policy exists to avoid holding. Its figures come from a metering forward (counted, not
        # kept), and the gradients are bit for bit those without checkpointing exactly when every
        # recomputed value matched the first forward's (the backward is the same code over the
        # same values) and no fault changed what the backward read.
        plain = (metered or _metering_forward(program, backend)) if profile else None
        equal = not reported.tape.checkpoint.mismatches and not any(r.readers for r in reported.records)
        profile_plan = requested
    ckpt = checked.tape if checked is not None else None
    memory, timelines = {}, {}
    if profile:
        runs = memory_profile.ProfileRuns(
            plain, reported.grads, inference, policy=str(policy), sampled=backend.memory_sampler() is not None,
            metered=requested is not None, checkpointed=ckpt, profile_plan=profile_plan, gradients_equal=equal,
            budget_plan=chosen)
        memory, timelines = memory_profile.profile(program, prepare_feeds(program, backend), runs, options.optimizer,
                                                   options.optimizer_dtype, dtype)
        if not options.memory_timeline:
            timelines = {}
    findings = recompute_check.findings(program, ckpt.checkpoint if ckpt is not None else None,
                                        str(profile_plan.policy) if profile_plan else "", requested is not None)
    return _engine_run(backend, program, reported, memory, findings, timelines)


def what_if_apart(graph: Graph, options: VerifyOptions, dtype: str) -> bool:
    """Whether the memory profile's checkpointed what-if is a run of its own that another process can make
    (what_if_figures; a finite-difference split deals it to a shard of its own, verify/fd_shards.py): the
    profile asked without a timeline (a merge makes that whole) and without a checkpoint policy (under one
    the checkpointed run is the reported one), for a graph with no in-place node, its figures the engine's own
    count of its arrays (a device pool's samples would depend on what the process allocated before)."""
    return profile_asked(options) and not options.memory_timeline and parse_policy(options.checkpoint).kind == "none" \
        and not program_of(graph, DTYPES[dtype]).inplace_root and get_backend(options.device).memory_sampler() is None


def what_if_figures(graph: Graph, options: VerifyOptions, dtype: str, gradients: dict) -> tuple[dict, list]:
    """The sqrt what-if run_engine makes for the memory profile (where what_if_apart), made on its own after
    this process's reported run, whose gradients (`gradients`, host) it is compared with bit for bit:
    (its figures as memory_profile adds them to the profile, its recompute findings)."""
    backend = get_backend(options.device)
    program = program_of(graph, DTYPES[dtype])
    setup = _Setup(program, backend, options, _earlier_values(program, backend, options.faults), True)
    plan = checkpoint_plan(program, "sqrt")
    checked = _GradientRun(*_gradient_run(setup, plan, faults=(), integrity="off"))
    host = lambda a: np.asarray(backend.to_host(a), dtype=np.float64)  # noqa: E731 -- as _engine_run's
    equal = all(host(checked.grads[p]).tobytes() == np.asarray(g, dtype=np.float64).tobytes()
                for p, g in gradients.items())
    runs = memory_profile.ProfileRuns(None, checked.grads, None, policy=str(parse_policy(options.checkpoint)),
                                      checkpointed=checked.tape, profile_plan=plan, gradients_equal=equal)
    figures = memory_profile.checkpoint_figures(program, prepare_feeds(program, backend), runs, options.optimizer,
                                                options.optimizer_dtype, dtype)
    return figures, recompute_check.findings(program, checked.tape.checkpoint, str(plan.policy), False)


def recorded_run(graph: Graph, options: VerifyOptions, dtype: str, loss: float, gradients: dict, memory: dict,
                 findings: list, seconds: float) -> EngineRun:
    """The EngineRun another process made of this graph with these options (a finite-difference shard's,
    verify/fd_shards.py): its loss, host gradients, memory profile and findings, with no fault injected and no
    event recorded (the shard records none otherwise); the program built and the options checked here, as
    run_engine checks them, with no run made."""
    program = program_of(graph, DTYPES[dtype])
    _check_engine_options(program, options, dtype)
    parse_policy(options.checkpoint)
    return EngineRun(loss, gradients, memory, [], seconds, [], program, findings=findings)


def _inference(program, backend, reported: _GradientRun, run: bool):
    """The memory profile's no-grad forward's timeline (the inference figures): a forward of its own
    when `run`, else the twin counted beside the reported run's forward (None when it has none)."""
    if run:
        feeds = prepare_feeds(program, backend)
        return forward(program, backend, feeds, grad=False, record_timeline=True).live.timeline
    return reported.tape.inference.timeline if reported.tape.inference is not None else None


def _bitwise_equal(backend, grads: dict, other: dict) -> bool:
    """Bit for bit (NaNs included), parameter by parameter (_same_bits)."""
    return all(_same_bits(backend.to_host(grads[p]), backend.to_host(other[p])) for p in grads)


SAME_BITS_BY_BYTES = 1 << 16  # up to this many bytes, compare copies of the bytes


def _same_bits(a, b) -> bool:
    """a's bytes (in C order) are b's. A small array: one bytes comparison, not array_equal's elementwise
    pass (chain_1024 has 2,048 parameters); a larger one: its elements read as unsigned integers of their
    size, compared in place -- two copies of an 8 MiB gradient cost ~10x the comparison itself."""
    size = a.dtype.itemsize
    if a.nbytes <= SAME_BITS_BY_BYTES or a.shape != b.shape or b.dtype.itemsize != size or size not in (1, 2, 4, 8):
        return a.tobytes() == b.tobytes()
    words = np.dtype(f"u{size}")
    return bool(np.array_equal(a.view(words), b.view(words)))


def _engine_run(backend, program, reported: _GradientRun, memory, findings, timelines) -> EngineRun:
    f64 = lambda a: np.asarray(backend.to_host(a), dtype=np.float64)  # noqa: E731
    tape = reported.tape
    loss = float(f64(tape.loss).reshape(-1)[0])
    return EngineRun(loss, {p: f64(g) for p, g in reported.grads.items()}, memory, reported.records,
                     reported.seconds, tape.store.events, program,
                     {k: f64(v) for k, v in tape.adjoints.items()},
                     {k: f64(v) for k, v in tape.contributions.items()}, findings, timelines)
