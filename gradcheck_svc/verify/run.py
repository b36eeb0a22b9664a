"""verify(): run the engine and the oracles on a graph and compare.

engine (forward, optional fault injection, backward) -> finite differences
(float64, host) and the symbolic oracle (SymPy, mpmath; within its budget)
-> three-way per-parameter comparison (engine vs FD, engine vs symbolic,
FD vs symbolic) -> user-derivative checks of `expr` nodes -> diagnosis
(findings: cause, node; diagnose.py) -> Report.

The verdict of a parameter is engine vs symbolic when the symbolic oracle ran
(it is exact), engine vs FD otherwise.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..backend import get_backend
from ..engine import Program, backward, checkpoint_plan, forward, inject, parse_policy, prepare_feeds
from ..engine.faults import STALE_STEP, Fault
from ..engine.saved import INTEGRITY_MODES
from ..errors import OptionError
from ..graph.ir import Graph
from ..oracles.finite_diff import MODES as FD_MODES
from ..oracles.finite_diff import FDOptions, FiniteDifferences
from ..oracles.symbolic import SymbolicOptions, symbolic_gradients
from . import memory_profile, recompute_check
from .compare import Tolerance, compare
from .custom_ops import check_custom_ops
from .diagnose import Context, diagnose, overall_verdict
from .findings import Finding, parameters_through
from .report import FaultRecord, ParameterResult, Report

FD_VS_SYMBOLIC = Tolerance.for_dtype("float64")  # FD runs in float64 whatever the engine's dtype

DTYPES = {"float32": np.float32, "float64": np.float64}


@dataclass
class VerifyOptions:
    dtype: str | None = None  # None: the graph's declared float dtype
    device: str = "cpu"
    fd: FDOptions = field(default_factory=FDOptions)
    faults: tuple[Fault, ...] = ()
    atol: float | None = None
    rtol: float | None = None
    checkpoint: object = "none"  # none | sqrt | every:K | node names (list or "a,b"), see engine/checkpoint.py
    memory_timeline: bool = False  # record live bytes after every step (for --memory-plot)
    integrity: str = "check"  # saved-tensor fingerprints: "off" | "check"
    allow_inplace_hazards: bool = False  # compute the (wrong) gradient instead of stopping
    localize: bool = True  # find the faulty node when a parameter fails
    symbolic: SymbolicOptions = field(default_factory=SymbolicOptions)


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


def _gradient_run(program, backend, options, plan, faults, earlier, keep_adjoints=False):
    """forward (+ faults) + backward; returns (tape, device gradients, fault records, seconds).
    Each run gets fresh feeds: in-place nodes write into them."""
    t0 = time.perf_counter()
    feeds = prepare_feeds(program, backend)
    tape = forward(program, backend, feeds, grad=True, checkpoint=plan, record_timeline=options.memory_timeline,
                   integrity=options.integrity, allow_inplace_hazards=options.allow_inplace_hazards)
    records = []
    for f in faults:
        eff = inject(backend.xp, tape.store, f, backend.to_host, earlier)
        records.append(FaultRecord(str(f), eff.readers, eff.before, eff.after))
    grads = backward(tape, keep_adjoints=keep_adjoints)
    backend.synchronize()
    return tape, grads, records, time.perf_counter() - t0


def run_engine(graph: Graph, options: VerifyOptions, dtype: str, keep_adjoints: bool = False,
               profile: bool = True) -> EngineRun:
    """Up to three runs: gradients without checkpointing, a no-grad forward, and gradients under
    the checkpoint policy -- the requested one, whose gradients are reported, or else sqrt as a
    what-if for the memory profile (not for graphs with in-place nodes). Faults are injected
    into the run whose gradients are reported. profile=False: only the gradient runs (no
    memory profile), e.g. to re-trace adjoints for localization."""
    backend = get_backend(options.device)
    program = Program(graph, DTYPES[dtype])
    if options.integrity not in INTEGRITY_MODES:
        raise OptionError(f"unknown integrity mode '{options.integrity}' (expected off or check)", field="integrity")
    for f in options.faults:
        if f.node not in program.shapes:
            raise OptionError(f"fault names unknown value '{f.node}'", field="fault")
    policy = parse_policy(options.checkpoint)
    requested = checkpoint_plan(program, policy)
    ckpt_plan = requested
    if ckpt_plan is None and profile and not program.inplace_root:
        ckpt_plan = checkpoint_plan(program, "sqrt")
    earlier = _earlier_values(program, backend, options.faults)
    in_plain = requested is None
    plain, grads, records, seconds = _gradient_run(program, backend, options, None,
                                                   options.faults if in_plain else (), earlier,
                                                   keep_adjoints and in_plain)
    inference = forward(program, backend, prepare_feeds(program, backend), grad=False,
                        record_timeline=options.memory_timeline) if profile else None
    ckpt = ckpt_grads = None
    if ckpt_plan is not None:
        ckpt, ckpt_grads, ckpt_records, ckpt_seconds = _gradient_run(
            program, backend, options, ckpt_plan, () if in_plain else options.faults, earlier,
            keep_adjoints and not in_plain)
        if not in_plain:
            records, seconds = ckpt_records, ckpt_seconds

    reported, reported_grads = (plain, grads) if in_plain else (ckpt, ckpt_grads)
    host = {p: np.asarray(backend.to_host(g), dtype=np.float64) for p, g in reported_grads.items()}
    equal = None
    if ckpt is not None:
        equal = all(np.array_equal(backend.to_host(grads[p]), backend.to_host(ckpt_grads[p])) for p in grads)
    memory = memory_profile.profile(
        [prepare_feeds(program, backend)[p] for p in program.params], plain, grads, inference,
        policy=str(policy), sampled=backend.memory_sampler() is not None, checkpointed=ckpt,
        profile_plan=ckpt_plan, gradients_equal=equal) if profile else {}
    findings = recompute_check.findings(program, ckpt.checkpoint if ckpt is not None else None,
                                        str(ckpt_plan.policy) if ckpt_plan else "", not in_plain)
    timelines = {}
    if options.memory_timeline and profile:
        timelines = {"none": plain.live.timeline, "inference": inference.live.timeline}
        if ckpt is not None:
            timelines[str(ckpt_plan.policy)] = ckpt.live.timeline
    loss = float(np.asarray(backend.to_host(reported.loss), dtype=np.float64).reshape(-1)[0])
    f64 = lambda a: np.asarray(backend.to_host(a), dtype=np.float64)  # noqa: E731
    return EngineRun(loss, host, memory, records, seconds, reported.store.events, program,
                     {k: f64(v) for k, v in reported.adjoints.items()},
                     {k: f64(v) for k, v in reported.contributions.items()}, findings, timelines)


def _check_options(options: VerifyOptions) -> None:
    """FD settings and tolerances that would make the verdict meaningless are user errors."""
    for name in ("atol", "rtol"):
        value = getattr(options, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise OptionError(f"{value} is not a finite number >= 0", field=name)
    if options.fd.mode not in FD_MODES:
        raise OptionError(f"unknown fd mode '{options.fd.mode}' (expected one of {', '.join(FD_MODES)})",
                          field="fd")
    if options.fd.directions < 1:
        raise OptionError(f"{options.fd.directions}: needs at least 1 direction", field="directions")


def verify(graph: Graph, options: VerifyOptions | None = None) -> Report:
    options = options or VerifyOptions()
    dtype = options.dtype or graph.declared_float_dtype
    if dtype not in DTYPES:
        raise OptionError(f"unknown dtype '{dtype}' (expected float32 or float64)", field="dtype")
    _check_options(options)
    t_start = time.perf_counter()
    engine = run_engine(graph, options, dtype)

    t0 = time.perf_counter()
    symbolic = symbolic_gradients(graph, options.symbolic)
    t_sym = time.perf_counter() - t0

    t0 = time.perf_counter()
    fd = FiniteDifferences(graph, options.fd)
    tol = Tolerance.for_dtype(dtype, options.atol, options.rtol)
    results = []
    for name in graph.parameters:
        ref = fd.gradient(name)
        g = engine.gradients[name]
        if ref.mode == "projection":
            engine_proj = ref.directions @ g.reshape(-1)
            cmp = compare(engine_proj, ref.reference, tol, ref.noise)
        else:
            engine_proj = None
            cmp = compare(g, ref.reference, tol, ref.noise)
        sym = sym_cmp = fd_sym = None
        if symbolic.ran:
            sym = symbolic.gradients[name]
            sym_cmp = compare(g, sym, tol)
            sym_of_fd = ref.directions @ sym.reshape(-1) if ref.mode == "projection" else sym
            fd_sym = compare(ref.reference, sym_of_fd, FD_VS_SYMBOLIC, ref.noise)
        results.append(ParameterResult(
            name=name, shape=tuple(g.shape), mode=ref.mode, gradient=g, reference=ref.reference,
            engine_projection=engine_proj, max_abs_error=cmp.max_abs_error, max_rel_error=cmp.max_rel_error,
            worst_index=cmp.worst_index, engine_at_worst=cmp.engine_at_worst,
            reference_at_worst=cmp.reference_at_worst, atol=tol.atol, rtol=tol.rtol,
            passed=sym_cmp.passed if sym_cmp is not None else cmp.passed,
            evaluations=ref.evaluations, fd_passed=cmp.passed, symbolic=sym, symbolic_comparison=sym_cmp,
            fd_vs_symbolic=fd_sym))
    t_fd = time.perf_counter() - t0

    t0 = time.perf_counter()
    custom = check_custom_ops(graph, symbolic.mp_values if symbolic.ran else fd.base,
                              timeout_s=options.symbolic.simplify_timeout_s)
    t_custom = time.perf_counter() - t0

    why = (" (under checkpointing only the last segment saves in the forward pass; the others are recomputed)"
           if engine.memory.get("checkpoint", "none") != "none" else "")
    warnings = [f"fault {f.fault} had no effect: no backward step reads '{f.fault.split(':')[0]}'{why}"
                for f in engine.faults if not f.readers]
    if not graph.parameters:
        warnings.append("no input has requires_grad: nothing to check")
    if symbolic.status == "skipped":
        warnings.append(f"symbolic oracle skipped: {symbolic.reason}; the verdict uses finite differences")
    t0 = time.perf_counter()
    findings = engine.findings + diagnose(Context(graph, options, dtype, engine, results, fd, tol))
    findings += _wrong_user_derivatives(custom, findings, engine.program)
    t_diag = time.perf_counter() - t0
    verdict = overall_verdict(results, findings)
    timings = {"engine_s": engine.seconds, "finite_differences_s": t_fd, "symbolic_s": t_sym,
               "diagnosis_s": t_diag}
    if custom:
        timings["custom_ops_s"] = t_custom
    timings["total_s"] = time.perf_counter() - t_start
    return Report(
        graph=graph.name, verdict=verdict, loss=engine.loss, dtype=dtype, device=options.device,
        parameters=results, memory=engine.memory, timings=timings,
        faults=engine.faults, warnings=warnings, findings=findings, timelines=engine.timelines,
        symbolic=symbolic, custom_ops=custom)


def _wrong_user_derivatives(custom, findings, program) -> list:
    """A user derivative that disagrees with SymPy's is a rule_error at its node, whether or
    not the gradient check happened to localize it (e.g. a parameter-free branch)."""
    named = {f.node for f in findings if f.cause == "rule_error"}
    out = []
    for c in custom:
        if c.user_grad_matches is False and c.node not in named:
            out.append(Finding(node=c.node, op="expr", cause="rule_error", severity="error",
                               detail=f"user derivative disagrees with SymPy's: {c.detail}",
                               parameters=parameters_through(program, c.node)))
    return out
