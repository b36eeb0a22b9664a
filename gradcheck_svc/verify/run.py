"""verify(): run the engine and the oracles on a graph and compare.

engine (forward, optional fault injection, backward) -> finite differences
(float64, host) and the symbolic oracle (SymPy, mpmath; within its budget)
-> three-way per-parameter comparison (engine vs FD, engine vs symbolic,
FD vs symbolic) -> user-derivative checks of `expr` nodes -> Report.

The verdict of a parameter is engine vs symbolic when the symbolic oracle ran
(it is exact), engine vs FD otherwise.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..backend import get_backend
from ..engine import Program, backward, forward, inject, prepare_feeds
from ..engine.faults import Fault
from ..errors import OptionError
from ..graph.ir import Graph
from ..oracles.finite_diff import FDOptions, FiniteDifferences
from ..oracles.symbolic import SymbolicOptions, symbolic_gradients
from .compare import Tolerance, compare
from .custom_ops import check_custom_ops
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
    symbolic: SymbolicOptions = field(default_factory=SymbolicOptions)


@dataclass
class EngineRun:
    """The engine's side of a verification."""

    loss: float
    gradients: dict  # name -> float64 host array
    memory: dict
    faults: list[FaultRecord]
    seconds: float


def run_engine(graph: Graph, options: VerifyOptions, dtype: str) -> EngineRun:
    backend = get_backend(options.device)
    program = Program(graph, DTYPES[dtype])
    for f in options.faults:
        if f.node not in program.shapes:
            raise OptionError(f"fault names unknown value '{f.node}'", field="fault")
    t0 = time.perf_counter()
    feeds = prepare_feeds(program, backend)
    tape = forward(program, backend, feeds, grad=True)
    records = []
    for f in options.faults:
        eff = inject(backend.xp, tape.store, f, backend.to_host)
        records.append(FaultRecord(str(f), eff.readers, eff.before, eff.after))
    grads = backward(tape)
    backend.synchronize()
    seconds = time.perf_counter() - t0
    host = {p: np.asarray(backend.to_host(g), dtype=np.float64) for p, g in grads.items()}
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    inference = forward(program, backend, feeds, grad=False)
    memory = {
        "parameters_bytes": int(sum(feeds[p].nbytes for p in program.params)),
        "gradients_bytes": int(sum(g.size for g in host.values()) * itemsize),
        "activations_peak_bytes": int(tape.store.saved.peak),
        "live_peak_bytes": int(tape.live.peak),
        "inference_peak_bytes": int(inference.live.peak),
        "op_evaluations": tape.op_evaluations,
    }
    loss = float(np.asarray(backend.to_host(tape.loss), dtype=np.float64).reshape(-1)[0])
    return EngineRun(loss, host, memory, records, seconds)


def verify(graph: Graph, options: VerifyOptions | None = None) -> Report:
    options = options or VerifyOptions()
    dtype = options.dtype or graph.declared_float_dtype
    if dtype not in DTYPES:
        raise OptionError(f"unknown dtype '{dtype}' (expected float32 or float64)", field="dtype")
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

    warnings = [f"fault {f.fault} had no effect: no backward step reads '{f.fault.split(':')[0]}'"
                for f in engine.faults if not f.readers]
    if not graph.parameters:
        warnings.append("no input has requires_grad: nothing to check")
    if symbolic.status == "skipped":
        warnings.append(f"symbolic oracle skipped: {symbolic.reason}; the verdict uses finite differences")
    wrong_rules = [c for c in custom if c.user_grad_matches is False]
    verdict = "pass" if all(r.passed for r in results) and not wrong_rules else "fail"
    timings = {"engine_s": engine.seconds, "finite_differences_s": t_fd, "symbolic_s": t_sym}
    if custom:
        timings["custom_ops_s"] = t_custom
    timings["total_s"] = time.perf_counter() - t_start
    return Report(
        graph=graph.name, verdict=verdict, loss=engine.loss, dtype=dtype, device=options.device,
        parameters=results, memory=engine.memory, timings=timings,
        faults=engine.faults, warnings=warnings, symbolic=symbolic, custom_ops=custom)
