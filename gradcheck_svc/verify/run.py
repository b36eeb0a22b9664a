"""verify(): run the engine and the oracles on a graph and compare.

engine (forward, optional fault injection, backward) -> finite differences
(float64, host) and the symbolic oracle (SymPy, mpmath; within its budget)
-> three-way per-parameter comparison (engine vs FD, engine vs symbolic,
FD vs symbolic) -> user-derivative checks of `expr` nodes -> diagnosis
(findings: cause, node; diagnosis/) -> Report. The engine runs live in
engine_run.py, below this module and the diagnosis alike.

The verdict of a parameter is engine vs symbolic when the symbolic oracle ran
(it is exact), engine vs FD otherwise.
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..engine import parse_policy
from ..engine.saved import INTEGRITY_MODES
from ..errors import OptionError
from ..graph.ir import Graph
from ..oracles.finite_diff import MODES as FD_MODES
from ..oracles.finite_diff import FDResult, FiniteDifferences
from ..oracles.symbolic import symbolic_gradients
from .compare import VANISHING, Tolerance, compare, magnitude
from . import claims, recompute_check
from .attributes import attributes_used
from .custom_ops import check_custom_ops
from .diagnosis.context import Context
from .diagnosis.diagnose import EXPLAINING, diagnose
from .engine_run import EngineRun, run_engine
from .fd_check import fd_check
from .joint_check import RESOLVE, joint_screen, usable
from .findings import Finding, WorstElement, parameters_through
from .options import DTYPES, VerifyOptions
from .report import ParameterResult, Report
from .verdict import settle

__all__ = ["DTYPES", "EngineRun", "VerifyOptions", "run_engine", "verify"]

FD_VS_SYMBOLIC = Tolerance.for_dtype("float64")  # FD runs in float64 whatever the engine's dtype


def check_options(options: VerifyOptions, field=lambda name: name) -> None:
    """Every option that is wrong whatever the graph (FD settings and tolerances that would make the
    verdict meaningless, an unknown dtype or integrity mode, a checkpoint policy that does not parse)
    is a user error, raised before any work; `field` maps the VerifyOptions name to what the error
    names (the batch command: its flag)."""
    for name in ("atol", "rtol"):
        value = getattr(options, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise OptionError(f"{value} is not a finite number >= 0", field=field(name))
    if options.fd.mode not in FD_MODES:
        raise OptionError(f"unknown fd mode '{options.fd.mode}' (expected one of {', '.join(FD_MODES)})",
                          field=field("fd"))
    if options.fd.directions < 1:
        raise OptionError(f"{options.fd.directions}: needs at least 1 direction", field=field("directions"))
    if options.dtype is not None and options.dtype not in DTYPES:
        raise OptionError(f"unknown dtype '{options.dtype}' (expected float32 or float64)", field=field("dtype"))
    if options.integrity not in INTEGRITY_MODES:
        raise OptionError(f"unknown integrity mode '{options.integrity}' (expected off or check)",
                          field=field("integrity"))
    try:
        parse_policy(options.checkpoint)
    except OptionError as exc:
        raise OptionError(exc.reason, field=field("checkpoint")) from None


def verify(graph: Graph, options: VerifyOptions | None = None, on_phase=None, fd_source=None) -> Report:
    """on_phase(name), when given, is called as each phase starts (a progress display's hook).
    fd_source(fd, screen, own, tol) -> lookup(name, g) -> (FDResult, FDCheck): where each parameter checked on its
    own gets its finite differences (default local_fd: computed here; fd_shards.py: read from shards); one with a
    joint_values(dirs, params) method gives the joint screen's first passes too (joint_check.joint_screen)."""
    phase = on_phase or (lambda name: None)
    options = options or VerifyOptions()
    check_options(options)
    dtype = options.dtype or graph.declared_float_dtype
    t_start = time.perf_counter()
    phase("engine")
    engine = run_engine(graph, options, dtype)

    t0 = time.perf_counter()
    phase("symbolic oracle")
    symbolic = symbolic_gradients(graph, options.symbolic)
    t_sym = time.perf_counter() - t0

    t0 = time.perf_counter()
    phase("finite differences")
    fd = FiniteDifferences(graph, options.fd)
    tol = Tolerance.for_dtype(claims.tolerance_dtype(graph, dtype), options.atol, options.rtol)
    subject = claims.subject_gradients(graph, engine.gradients)  # what is verified: the engine's or the claims
    joint, screen, own = fd_plan(fd, subject, graph, tol, getattr(fd_source, "joint_values", None))
    lookup = (fd_source or local_fd)(fd, screen, own, tol)
    results = []
    for name in graph.parameters:
        g = subject[name]  # what is verified: the engine's gradient or the claim (the screen judged the same)
        if screen is not None and name in screen.narrowed:
            ref, check = _narrowed_fd(screen.narrowed[name], g)
        elif screen is not None and name in joint and name not in screen.flagged:
            results.append(_joint_row(name, g, screen, symbolic, tol))
            continue
        else:
            ref, check = lookup(name, g)
        engine_proj = ref.directions @ g.reshape(-1) if ref.mode == "projection" else None
        cmp = check.comparison
        reference = check.reference.reshape(np.shape(ref.reference))
        sym = sym_cmp = fd_sym = None
        if symbolic.ran:
            sym = symbolic.gradients[name]
            sym_cmp = compare(g, sym, tol)
            sym_of_fd = ref.directions @ sym.reshape(-1) if ref.mode == "projection" else sym
            fd_values = reference
            if screen is not None and name in screen.narrowed:  # differences only at the elements checked
                checked = np.zeros(g.size, bool)
                checked[screen.narrowed[name].index] = True
                fd_values = np.where(checked.reshape(g.shape), reference, sym)
            fd_sym = compare(fd_values, sym_of_fd, FD_VS_SYMBOLIC, check.error.reshape(reference.shape))
        results.append(ParameterResult(
            name=name, shape=tuple(g.shape), mode=ref.mode, gradient=g, reference=reference,
            engine_projection=engine_proj, directions=ref.directions, max_abs_error=cmp.max_abs_error,
            max_rel_error=cmp.max_rel_error,
            worst_index=cmp.worst_index, engine_at_worst=cmp.engine_at_worst,
            reference_at_worst=cmp.reference_at_worst, atol=tol.atol, rtol=tol.rtol,
            passed=sym_cmp.passed if sym_cmp is not None else cmp.passed,
            evaluations=ref.evaluations, fd_passed=cmp.passed, symbolic=sym, symbolic_comparison=sym_cmp,
            fd_vs_symbolic=fd_sym, fd_error=check.error.reshape(reference.shape), fd_refined=check.refined,
            fd_undecidable=check.undecidable, fd_unrefined=len(check.unrefined), fd_unconfirmed=check.unconfirmed,
            absolute=tol.absolute(magnitude(sym if sym is not None else reference)),
            checked_by=_checked_by(name, joint, screen, ref.mode),
            unresolved=screen.narrowed[name].unresolved if screen is not None and name in screen.narrowed else None))
    t_fd = time.perf_counter() - t0
    claim_warnings = claims.annotate(results, graph, engine.gradients, tol)
    for r in results:  # the names the model's maker gave each parameter (the ONNX importer's), for the report
        r.source_names = list(graph.inputs[r.name].source_names)

    t0 = time.perf_counter()
    custom = check_custom_ops(graph, symbolic.mp_values if symbolic.ran else fd.base,
                              timeout_s=options.symbolic.simplify_timeout_s)
    t_custom = time.perf_counter() - t0

    why = (" (under checkpointing only the last segment saves in the forward pass; the others are recomputed)"
           if engine.memory.get("checkpoint", "none") != "none" else "")
    warnings = claim_warnings + [
        f"fault {f.fault} had no effect: no backward step reads '{f.fault.split(':')[0]}'{why}"
        for f in engine.faults if not f.readers]
    warnings += list(graph.notes)  # the converter's (an ONNX export's folded parameters: not checked)
    if not graph.parameters:
        warnings.append("no input has requires_grad: nothing to check")
    if symbolic.status == "skipped":
        warnings.append(f"symbolic oracle skipped: {symbolic.reason}; the verdict uses finite differences")
    t0 = time.perf_counter()
    phase("diagnosis")
    if graph.claims is None:  # the engine is the subject: its runs are diagnosed
        prior = recompute_check.attribute(engine.findings, results)
        findings = prior + diagnose(Context(graph, options, dtype, engine, results, fd, tol), prior)
    else:  # the claims are: localized by their own adjoints, when they carry some
        findings = claims.localize_claims(graph, fd, results, tol) if options.localize else []
    findings += undecidable_findings(results, engine.program, findings)
    findings += unresolved_findings(results, findings)
    if graph.claims is None:
        findings += _wrong_user_derivatives(custom, findings, engine.program)
    findings += unexplained_mismatches(results, findings, options.localize)
    t_diag = time.perf_counter() - t0
    verdict = settle(results, findings)  # each row's status and the verdict, from the same facts
    claims.mark_missing(results)
    timings = {"engine_s": engine.seconds, "finite_differences_s": t_fd, "symbolic_s": t_sym,
               "diagnosis_s": t_diag}
    if custom:
        timings["custom_ops_s"] = t_custom
    timings["total_s"] = time.perf_counter() - t_start
    return Report(
        graph=graph.name, verdict=verdict, loss=engine.loss, dtype=dtype, device=options.device,
        parameters=results, memory=engine.memory, timings=timings,
        faults=engine.faults, warnings=warnings, findings=findings, timelines=engine.timelines,
        symbolic=symbolic, custom_ops=custom, subject="engine" if graph.claims is None else "claimed",
        attributes=attributes_used(graph))


def fd_plan(fd, gradients: dict, graph: Graph, tol: Tolerance, first_pass=None):
    """(the parameters the plan screens jointly, the joint screen or None, the parameters checked on their own:
    every one the screen did not clear), in the graph's order. first_pass: joint_screen's."""
    joint = [p for p in graph.parameters if fd.mode_for(p) == "joint"]
    screen = joint_screen(fd, gradients, joint, tol, first_pass=first_pass) if usable(fd, gradients, joint) else None
    own = [p for p in graph.parameters if screen is None or p not in joint or p in screen.flagged]
    return joint, screen, own


def parameter_fd(fd, name: str, g: np.ndarray, tol: Tolerance):
    """One parameter's finite differences against its engine gradient g: (FDResult, FDCheck), refined
    where the first pass misses."""
    ref = fd.gradient(name)
    engine_proj = ref.directions @ g.reshape(-1) if ref.mode == "projection" else None
    # a NaN/Inf loss leaves differences nothing to refine: the non-finite diagnosis takes it
    refine = None
    if math.isfinite(fd.loss):
        def refine(which, settled):
            return fd.refine(name, ref, which, settled)
    return ref, fd_check(g if engine_proj is None else engine_proj, ref.reference, ref.noise, tol, refine)


def _narrowed_fd(narrowed, g: np.ndarray):
    """A parameter the screen flagged and narrowed to elements, as (FDResult, FDCheck) of its whole shape:
    the elements checked carry their differences, the rest the engine's values (compared with themselves)."""
    chk = narrowed.check
    ref = FDResult("full", chk.reference.reshape(np.shape(g)), chk.error.reshape(np.shape(g)),
                   evaluations=narrowed.evaluations)
    return ref, chk


def _checked_by(name: str, joint, screen, mode: str) -> str:
    if screen is None or name not in joint:
        return mode
    return "joint, then bisection" if name in screen.narrowed else f"joint, then {mode}"


def local_fd(fd, screen, own, tol: Tolerance):
    """verify()'s default fd_source: every parameter's differences computed in this process."""
    return lambda name, g: parameter_fd(fd, name, g, tol)


def _joint_row(name: str, g: np.ndarray, screen, symbolic, tol: Tolerance) -> ParameterResult:
    """A parameter the joint screen cleared: its row shows the whole graph's directional derivatives
    (`reference` FD, `engine_projection` the engine's sum), the same for every such parameter."""
    cmp = screen.comparison  # the whole's; where it failed, the bisection cleared this parameter's half
    sym = sym_cmp = fd_sym = None
    if symbolic.ran:
        sym = symbolic.gradients[name]
        sym_cmp = compare(g, sym, tol)
        if screen.sym_of_fd is None:  # the exact directional derivatives, once
            screen.sym_of_fd = sum(screen.directions.project(p, symbolic.gradients[p]) for p in screen.params)
        fd_sym = compare(screen.reference, screen.sym_of_fd, FD_VS_SYMBOLIC, screen.error)
    return ParameterResult(
        name=name, shape=tuple(g.shape), mode="joint", gradient=g, reference=screen.reference,
        engine_projection=screen.engine, directions=None,
        max_abs_error=cmp.max_abs_error, max_rel_error=cmp.max_rel_error, worst_index=cmp.worst_index,
        engine_at_worst=cmp.engine_at_worst, reference_at_worst=cmp.reference_at_worst, atol=tol.atol,
        rtol=tol.rtol, passed=sym_cmp.passed if sym_cmp is not None else True,
        evaluations=screen.evaluations, fd_passed=True, symbolic=sym, symbolic_comparison=sym_cmp,
        fd_vs_symbolic=fd_sym, fd_error=screen.error, fd_refined=screen.refined, checked_by="joint",
        unresolved=_blind(screen, name))


def _blind(screen, name: str) -> str | None:
    """Why the screen's pass says nothing of some of the parameter's elements (JointScreen.unresolved)."""
    if name not in screen.unresolved:
        return None
    count, ratio = screen.unresolved[name]
    return (f"the joint screen would not see an error of {RESOLVE}x their own bound in {count} of its elements "
            f"(it resolves {ratio * RESOLVE:.3g}x at the worst), even with a larger step")


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


def unexplained_mismatches(results, findings, localized: bool) -> list:
    """An error finding at each parameter whose comparison failed while no finding names it (as an
    error, or as the explanation): the verdict's FAIL then always says where."""
    named = {p for f in findings if f.severity == "error" or (f.cause, f.severity) in EXPLAINING
             for p in f.parameters}
    why = "no single node explains it" if localized else "localization is off"
    out = []
    for r in results:
        if r.passed or r.name in named or r.claim == claims.NOT_PROVIDED:
            continue
        c = r.verdict_comparison
        against = "the symbolic gradient" if r.verdict_reference == "symbolic" else "finite differences"
        where = list(c.worst_index) if r.mode != "projection" and r.mode != "joint" else ["direction", *c.worst_index]
        subject = "claimed" if r.claim else "engine"  # verify/claims.py: the gradient under test
        off = abs(c.engine_at_worst - c.reference_at_worst)
        because = "the claim holds no adjoint that localizes it further" if r.claim and localized else why
        out.append(Finding(
            node=r.name, op="input", cause="gradient_mismatch", severity="error",
            detail=f"its {'claimed ' if r.claim else ''}gradient disagrees with {against} (worst {where}: "
                   f"{subject} {c.engine_at_worst:.8g}, reference {c.reference_at_worst:.8g}, off by {off:.3g}; "
                   f"tolerance atol {r.atol:g}, rtol {r.rtol:g}{_held_to_size(r)}) and {because}",
            parameters=[r.name], worst=WorstElement(tuple(where), float(c.engine_at_worst),
                                                     float(c.reference_at_worst))))
    return out


def _held_to_size(r) -> str:
    """', absolute term A: held to the gradient's size' where a vanishing gradient's absolute term is below
    atol (compare.py), so that a mismatch smaller than atol does not read as a contradiction."""
    if r.absolute is None or not r.absolute < r.atol:
        return ""
    return f", absolute term {r.absolute:.3g}: a float64 gradient under {VANISHING['float64']:g} is held to its own size"


def unresolved_findings(results, findings=()) -> list:
    """An fd_unresolved error at each parameter finite differences could neither confirm nor clear -- the
    joint screen's flag not narrowed to a confirmed or cleared element, or values still off on the first
    pass past the refinement cap -- unless an error finding already fails it: never a silent pass, and
    not a mismatch either (its row is "undecided", the verdict is not a pass)."""
    blamed = {p for f in findings if f.severity == "error" for p in f.parameters}
    out = []
    for r in results:
        why = r.unresolved or (f"{r.fd_unrefined} values still off on the first pass once {len(r.fd_refined)} "
                               "were refined, the most one check refines" if r.fd_unrefined else None)
        if why is None or r.name in blamed or not r.passed or r.symbolic_comparison is not None:
            continue  # decided otherwise: an error, a failed comparison, the exact symbolic gradient
        out.append(Finding(node=r.name, op="input", cause="fd_unresolved", severity="error",
                           detail=f"finite differences could neither confirm nor clear its gradient ({why}): "
                                  "undecided, not verified and not a confirmed mismatch",
                           parameters=[r.name]))
    return out


def undecidable_findings(results, program, findings=()) -> list:
    """One warning per parameter with values finite differences could not decide: no step gave an
    estimate whose error is within the tolerance (or a small fraction of the value), or -- once
    fd_check.REFINE_MAX values were refined -- the rest were never refined (say which, and how many).
    None for a parameter a kink finding (nondifferentiable_point, warning or error) already covers: the
    kink is why no step decides it, and the one-sided differences there have settled it."""
    kinked = {p for f in findings if f.cause == "nondifferentiable_point" and f.severity != "info"
              for p in f.parameters}
    out = []
    for r in results:
        if not len(r.fd_undecidable) or r.name in kinked:
            continue
        flat = r.reference.reshape(-1)
        first = int(r.fd_undecidable[0])
        tried = len(r.fd_undecidable) - r.fd_unrefined
        why = []
        if tried:
            why.append(f"{tried} with no trustworthy estimate at any step tried")
        if r.fd_unrefined:
            why.append(f"{r.fd_unrefined} still off on the first pass (its error estimate covers rounding only) "
                       f"after {len(r.fd_refined)} values were refined, the most one check refines")
        label = ["direction", first] if r.mode == "projection" else \
            [int(i) for i in np.unravel_index(first, r.shape)] if r.shape else []
        engine = (r.engine_projection if r.mode == "projection" else r.gradient).reshape(-1)[first]
        what = "directional derivatives" if r.mode == "projection" else "elements"
        out.append(Finding(
            node=r.name, op="input", cause="fd_undecidable", severity="warning",
            detail=f"finite differences cannot decide {len(r.fd_undecidable)} of its {what} ({'; '.join(why)}), "
                   f"first {label}: the {'first-pass ' if first not in set(r.fd_refined) else ''}estimate "
                   f"{flat[first]:.8g} (error bound {float(r.fd_error.reshape(-1)[first]):.3g}, engine {engine:.8g}); "
                   "not counted as a mismatch",
            parameters=[r.name], worst=WorstElement(tuple(label), float(engine), float(flat[first]))))
    return out
