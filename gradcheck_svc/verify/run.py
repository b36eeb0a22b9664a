"""verify(): run the engine and the oracles on a graph and compare.

engine (forward, optional fault injection, backward) -> finite differences
(float64, host) -> per-parameter comparison -> Report.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..backend import get_backend
from ..engine import Program, backward, checkpoint_plan, forward, inject, parse_policy, prepare_feeds
from ..engine.faults import Fault
from ..errors import OptionError
from ..graph.ir import Graph
from ..oracles.finite_diff import FDOptions, FiniteDifferences
from . import memory_profile, recompute_check
from .compare import Tolerance, compare
from .report import FaultRecord, ParameterResult, Report

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


@dataclass
class EngineRun:
    """The engine's side of a verification."""

    loss: float
    gradients: dict  # name -> float64 host array
    memory: dict
    faults: list[FaultRecord]
    seconds: float
    findings: list[dict] = field(default_factory=list)
    timelines: dict = field(default_factory=dict)  # run label -> [(step label, live bytes)]


def _gradient_run(program, backend, feeds, plan, faults, timeline: bool):
    """forward (+ faults) + backward; returns (tape, device gradients, fault records)."""
    tape = forward(program, backend, feeds, grad=True, checkpoint=plan, record_timeline=timeline)
    records = []
    for f in faults:
        eff = inject(backend.xp, tape.store, f, backend.to_host)
        records.append(FaultRecord(str(f), eff.readers, eff.before, eff.after))
    grads = backward(tape)
    backend.synchronize()
    return tape, grads, records


def run_engine(graph: Graph, options: VerifyOptions, dtype: str) -> EngineRun:
    """Three runs: gradients without checkpointing, a no-grad forward, and gradients under the
    checkpoint policy -- the requested one, whose gradients are reported, or else sqrt as a
    what-if for the memory profile. Faults are injected into the run whose gradients are reported."""
    backend = get_backend(options.device)
    program = Program(graph, DTYPES[dtype])
    for f in options.faults:
        if f.node not in program.shapes:
            raise OptionError(f"fault names unknown value '{f.node}'", field="fault")
    policy = parse_policy(options.checkpoint)
    requested = checkpoint_plan(program, policy)
    ckpt_plan = requested if requested is not None else checkpoint_plan(program, "sqrt")
    timeline = options.memory_timeline
    t0 = time.perf_counter()
    feeds = prepare_feeds(program, backend)
    plain, grads, records = _gradient_run(program, backend, feeds, None,
                                          options.faults if requested is None else (), timeline)
    inference = forward(program, backend, feeds, grad=False, record_timeline=timeline)
    ckpt = ckpt_grads = None
    if ckpt_plan is not None:
        ckpt, ckpt_grads, ckpt_records = _gradient_run(program, backend, feeds, ckpt_plan,
                                                       options.faults if requested is not None else (), timeline)
        records = records or ckpt_records
    seconds = time.perf_counter() - t0

    reported, reported_grads = (ckpt, ckpt_grads) if requested is not None else (plain, grads)
    host = {p: np.asarray(backend.to_host(g), dtype=np.float64) for p, g in reported_grads.items()}
    equal = None
    if ckpt is not None:
        other = grads if requested is not None else ckpt_grads
        equal = all(np.array_equal(backend.to_host(other[p]), backend.to_host(reported_grads[p])) for p in grads)
    memory = memory_profile.profile(
        [feeds[p] for p in program.params], plain, grads, inference, policy=str(policy),
        sampled=backend.memory_sampler() is not None, checkpointed=ckpt, profile_plan=ckpt_plan,
        gradients_equal=equal)
    findings = recompute_check.findings(program, ckpt.checkpoint if ckpt is not None else None,
                                        str(ckpt_plan.policy) if ckpt_plan else "", requested is not None)
    timelines = {}
    if timeline:
        timelines = {"none": plain.live.timeline, "inference": inference.live.timeline}
        if ckpt is not None:
            timelines[str(ckpt_plan.policy)] = ckpt.live.timeline
    loss = float(np.asarray(backend.to_host(reported.loss), dtype=np.float64).reshape(-1)[0])
    return EngineRun(loss, host, memory, records, seconds, findings, timelines)


def verify(graph: Graph, options: VerifyOptions | None = None) -> Report:
    options = options or VerifyOptions()
    dtype = options.dtype or graph.declared_float_dtype
    if dtype not in DTYPES:
        raise OptionError(f"unknown dtype '{dtype}' (expected float32 or float64)", field="dtype")
    t_start = time.perf_counter()
    engine = run_engine(graph, options, dtype)

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
        results.append(ParameterResult(
            name=name, shape=tuple(g.shape), mode=ref.mode, gradient=g, reference=ref.reference,
            engine_projection=engine_proj, max_abs_error=cmp.max_abs_error, max_rel_error=cmp.max_rel_error,
            worst_index=cmp.worst_index, engine_at_worst=cmp.engine_at_worst,
            reference_at_worst=cmp.reference_at_worst, atol=tol.atol, rtol=tol.rtol, passed=cmp.passed,
            evaluations=ref.evaluations))
    t_fd = time.perf_counter() - t0

    why = (" (under checkpointing only the last segment saves in the forward pass; the others are recomputed)"
           if engine.memory.get("checkpoint", "none") != "none" else "")
    warnings = [f"fault {f.fault} had no effect: no backward step reads '{f.fault.split(':')[0]}'{why}"
                for f in engine.faults if not f.readers]
    if not graph.parameters:
        warnings.append("no input has requires_grad: nothing to check")
    errors = any(f["severity"] == "error" for f in engine.findings)
    verdict = "pass" if all(r.passed for r in results) and not errors else "fail"
    return Report(
        graph=graph.name, verdict=verdict, loss=engine.loss, dtype=dtype, device=options.device,
        parameters=results, memory=engine.memory,
        timings={"engine_s": engine.seconds, "finite_differences_s": t_fd,
                 "total_s": time.perf_counter() - t_start},
        faults=engine.faults, warnings=warnings, findings=engine.findings, timelines=engine.timelines)
