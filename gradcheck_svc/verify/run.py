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

import dataclasses
import math
import time
from typing import NamedTuple

import numpy as np

from ..graph.gates import ORDER as GATE_ORDER, torch_element
from ..graph.ir import Graph
from ..oracles.fd_modes import FDMode
from ..oracles.finite_diff import FDResult, FiniteDifferences
from ..oracles.symbolic import symbolic_gradients
from .compare import VANISHING, Tolerance, compare, magnitude
from .attributes import attributes_used, defaulted_warnings
from .custom_ops import check_custom_ops
from .diagnosis.context import Run
from .diagnosis.diagnose import EXPLAINING
from .engine_run import EngineRun, recorded_run, run_engine
from .fd_check import as_referenced, fd_check
from .joint_check import RESOLVE, joint_screen, spare, usable
from .findings import Finding, WorstElement, parameters_through
from .options import DTYPES, VerifyOptions, check
from .parameter_result import NOT_PROVIDED, FDRow, ParameterResult, Screen, SymbolicRow
from . import stand_in
from .report import Report
from .subject import subject_of
from .verdict import settle

__all__ = ["DTYPES", "EngineRun", "VerifyOptions", "run_engine", "verify", "verify_checked"]

FD_VS_SYMBOLIC = Tolerance.for_dtype("float64")  # FD runs in float64 whatever the engine's dtype


def verify(graph: Graph, options: VerifyOptions | None = None, on_phase=None, fd_source=None) -> Report:
    """The Python API (docs/service.md): `options` checked (options.check), then verified (verify_checked)."""
    options = options or VerifyOptions()
    check(options)
    return verify_checked(graph, options, on_phase, fd_source)


def verify_checked(graph: Graph, options: VerifyOptions, on_phase=None, fd_source=None) -> Report:
    """Verify with options already checked at the edge (request.verify_options, or verify above).
    on_phase(name), when given, is called as each phase starts (a progress display's hook).
    fd_source(fd, screen, own, tol) -> lookup(name, g) -> (FDResult, FDCheck): where each parameter checked on its
    own gets its finite differences (default local_fd: computed here; fd_shards.py: read from shards); one with a
    joint_values(dirs, params) method gives the joint screen's first passes too (joint_check.joint_screen).
    Each stage reads and fills the one Run (diagnosis/context.py)."""
    phase = on_phase or (lambda name: None)
    run = Run(graph, options, options.dtype or graph.declared_float_dtype, subject=subject_of(graph))
    t_start = time.perf_counter()
    phase("engine")
    run.engine = engine_for(graph, options, run.dtype, fd_source)

    t0 = time.perf_counter()
    phase("symbolic oracle")
    run.symbolic = symbolic_gradients(graph, options.symbolic)
    t_sym = time.perf_counter() - t0

    t0 = time.perf_counter()
    phase("finite differences")
    claim_warnings = _compared(run, fd_source)
    t_fd = time.perf_counter() - t0

    t0 = time.perf_counter()
    run.custom = check_custom_ops(graph, run.symbolic.mp_values if run.symbolic.ran else run.fd.base,
                                  timeout_s=options.symbolic.simplify_timeout_s)
    t_custom = time.perf_counter() - t0

    warnings = _warnings(run, claim_warnings)
    t0 = time.perf_counter()
    phase("diagnosis")
    findings = _findings(run)
    t_diag = time.perf_counter() - t0
    verdict = settle(run.results, findings)  # each row's status and the verdict, from the same facts
    run.subject.mark_missing(run.results)
    timings = {"engine_s": run.engine.seconds, "finite_differences_s": t_fd, "symbolic_s": t_sym,
               "diagnosis_s": t_diag}
    if run.custom:
        timings["custom_ops_s"] = t_custom
    timings["total_s"] = time.perf_counter() - t_start
    engine = run.engine
    return Report(
        graph=graph.name, verdict=verdict, loss=engine.loss, dtype=run.dtype, device=options.device,
        parameters=run.results, memory=engine.memory, timings=timings,
        faults=engine.faults, warnings=warnings, findings=findings, timelines=engine.timelines,
        symbolic=run.symbolic, custom_ops=run.custom, subject=run.subject.name,
        attributes=attributes_used(graph), fd_plan=run.fd.plan)


def engine_for(graph: Graph, options: VerifyOptions, dtype: str, fd_source=None) -> EngineRun:
    """The engine's run. In a merge of finite-difference shards (fd_source with an engine_record method,
    fd_shards.ShardSource) it is shard 0's, made by the same code on the same graph and options: its memory
    profile and findings, and its loss and gradients where it recorded them (no fault, no event), so that the
    merge makes no engine run at all -- else only the reported gradient run, not the profile's extra run (the
    checkpointed what-if). A timeline, which no shard keeps, is made here."""
    made = getattr(fd_source, "engine_record", None)
    made = made(graph) if made is not None and not options.memory_timeline else None
    if made is None:
        return run_engine(graph, options, dtype)
    if made["gradients"] is not None:
        return recorded_run(graph, options, dtype, made["loss"], made["gradients"], made["memory"],
                            made["findings"], made["seconds"])
    engine = run_engine(graph, options, dtype, profile=False)
    engine.memory, engine.findings = made["memory"], made["findings"]
    return engine


def _compared(run: Run, fd_source) -> list[str]:
    """The finite-difference oracle, the tolerance and each parameter's row (the gradient under test against
    both references) into the run; returns the claims' warnings."""
    graph = run.graph
    recorded = getattr(fd_source, "base_record", None)  # a merge's: the shards' base forward (fd_shards.py)
    run.fd = fd = FiniteDifferences(graph, run.options.fd, recorded() if recorded is not None else None)
    run.kink_notes = fd_source.kink_notes() if hasattr(fd_source, "kink_notes") else None
    run.tol = tol = Tolerance.for_dtype(run.subject.tolerance_dtype(run.dtype), run.options.atol, run.options.rtol)
    subject = run.subject.gradients(run.engine.gradients)  # what is verified: the engine's or the claims
    plan = fd_plan(fd, subject, graph, tol, getattr(fd_source, "joint_values", None), _explained(run),
                   screened=screen_setup(run, fd, subject, tol))
    lookup = (fd_source or local_fd)(fd, plan.screen, plan.own, tol)
    run.results = [parameter_row(run, plan, lookup, name, subject[name]) for name in graph.parameters]
    if plan.screen is not None and plan.screen.spared and not _known_to_fail(run):
        # nothing establishes the gradients wrong yet (a clean float32 graph's rounding flags parameters its
        # follow-up clears): every flagged parameter gets its follow-up, none is left undecided for the budget
        spared, plan.screen.spared = set(plan.screen.spared), []
        run.results = [parameter_row(run, plan, lookup, r.name, subject[r.name]) if r.name in spared else r
                       for r in run.results]
    claim_warnings = run.subject.annotate(run.results, run.engine.gradients, tol)
    for r in run.results:  # the names the model's maker gave each parameter (the ONNX importer's), for the report
        r.source_names = list(graph.inputs[r.name].source_names)
    return claim_warnings


def _explained(run: Run) -> frozenset:
    """The parameters whose engine gradient reads a saved value the engine recorded as corrupted (the
    integrity diagnosis's cache_corruption names them): wrong whatever finite differences show. None for
    claimed gradients, which the engine's record says nothing of."""
    if run.subject.name != "engine":
        return frozenset()
    return frozenset(p for ev in run.engine.events if ev.kind == "corruption"
                     for p in parameters_through(run.engine.program, ev.node))


def _known_to_fail(run: Run) -> bool:
    """Whether the verification fails whatever the parameters the screen spared (joint_check.spare) would
    show: a row failed (a follow-up, or a spared one's own directional values), or the engine recorded a
    saved value that changed with no in-place write (the integrity diagnosis's cache_corruption)."""
    return any(not r.passed for r in run.results) or any(ev.kind == "corruption" for ev in run.engine.events)


def _warnings(run: Run, claim_warnings: list) -> list[str]:
    """The report's warnings: the claims', faults that had no effect, the converter's notes, and what was
    not checked or skipped."""
    graph, engine = run.graph, run.engine
    why = (" (under checkpointing only the last segment saves in the forward pass; the others are recomputed)"
           if engine.memory.get("checkpoint", "none") != "none" else "")
    warnings = claim_warnings + [
        f"fault {f.fault} had no effect: no backward step reads '{f.fault.split(':')[0]}'{why}"
        for f in engine.faults if not f.readers]
    warnings += list(graph.notes)  # the converter's (an ONNX export's folded parameters: not checked)
    warnings += defaulted_warnings(graph)  # attributes most likely lost on the wire
    if not graph.parameters:
        warnings.append("no input has requires_grad: nothing to check")
    if run.symbolic.status == "skipped":
        warnings.append(f"symbolic oracle skipped: {run.symbolic.reason}; the verdict uses finite differences")
    return warnings


def _findings(run: Run) -> list:
    """The diagnosis's findings: of the subject (the engine's runs, or the claims), then what finite
    differences left undecided or unresolved, then any failed row no finding explains."""
    results = run.results
    findings = run.subject.findings(run)
    findings += undecidable_findings(results, run.engine.program, findings)
    findings += unresolved_findings(results, findings)
    findings += run.subject.after_checks(run, findings)
    findings += unexplained_mismatches(results, findings, run.options.localize, run.subject)
    return findings


class FDPlan(NamedTuple):
    """How finite differences check the parameters: those screened jointly, the joint screen (None: none), and
    those checked on their own (every one the screen did not clear), each in the graph's order."""
    joint: list
    screen: object
    own: list


def screen_setup(run: Run, fd, subject: dict, tol: Tolerance) -> tuple[list, dict]:
    """The parameters the joint screen takes (none where it is not usable: each is then checked on its own) and
    what it judges of each: the subject's gradient, or its stand-in (stand_in.py, named in the plan). verify()'s
    and every finite-difference shard's (fd_shards.py) alike."""
    joint = [p for p in run.graph.parameters if fd.mode_for(p) == FDMode.JOINT]
    if not usable(fd, subject, joint):
        return [], subject
    judged, why = stand_in.screened(run, subject, joint, tol, run.subject.tolerance_dtype(run.dtype))
    if why:
        fd.plan = dataclasses.replace(fd.plan, stand_in=why)
    return joint, judged


def fd_plan(fd, gradients: dict, graph: Graph, tol: Tolerance, first_pass=None, explained=frozenset(),
            screened=None) -> FDPlan:
    """The FDPlan of the gradients under test. first_pass, explained: joint_screen's. screened: screen_setup's
    (the parameters the screen takes, what it judges of them); default the joint ones, judged as they are."""
    joint = [p for p in graph.parameters if fd.mode_for(p) == FDMode.JOINT]
    taken, judged = screened if screened is not None else (joint if usable(fd, gradients, joint) else [], gradients)
    screen = joint_screen(fd, judged, taken, tol, first_pass=first_pass, explained=explained) if taken else None
    if screen is not None:
        screen.spared = spare(fd, screen)  # decided by their own directional values: the follow-up's budget
    own = [p for p in graph.parameters
           if screen is None or p not in joint or (p in screen.flagged and p not in screen.spared)]
    return FDPlan(joint, screen, own)


def parameter_fd(fd, name: str, g: np.ndarray, tol: Tolerance):
    """One parameter's finite differences against its engine gradient g: (FDResult, FDCheck), refined
    where the first pass misses."""
    ref = fd.gradient(name)
    # a NaN/Inf loss leaves differences nothing to refine: the non-finite diagnosis takes it
    refine = None
    if math.isfinite(fd.loss):
        def refine(which, settled):
            return fd.refine(name, ref, which, settled)
    return ref, fd_check(as_referenced(ref, g), ref.reference, ref.noise, tol, refine, loss=fd.loss)


def _narrowed_fd(narrowed, g: np.ndarray):
    """A parameter the screen flagged and narrowed to elements, as (FDResult, FDCheck) of its whole shape:
    the elements checked carry their differences, the rest the engine's values (compared with themselves)."""
    chk = narrowed.check
    ref = FDResult(FDMode.FULL, chk.reference.reshape(np.shape(g)), chk.error.reshape(np.shape(g)),
                   evaluations=narrowed.evaluations)
    return ref, chk


def local_fd(fd, screen, own, tol: Tolerance):
    """verify()'s default fd_source: every parameter's differences computed in this process."""
    return lambda name, g: parameter_fd(fd, name, g, tol)


def parameter_row(run: Run, plan: FDPlan, lookup, name: str, g: np.ndarray) -> ParameterResult:
    """One parameter's row, however finite differences checked it: the one place rows are built. g: the
    gradient under test (the engine's or the claim; the screen judged the same)."""
    joint, screen, tol = plan.joint, plan.screen, run.tol
    narrowed = screen.narrowed.get(name) if screen is not None else None
    if narrowed is None and screen is not None and name in joint and name not in screen.flagged:
        fd_row, unresolved = _cleared_fd(screen), _blind(screen, name)
    elif screen is not None and name in screen.spared:
        fd_row, unresolved = _spared_fd(screen.evidence.get(name))
    else:
        ref, check = _narrowed_fd(narrowed, g) if narrowed is not None else lookup(name, g)
        how = Screen.NARROWED if narrowed is not None else \
            Screen.FLAGGED if screen is not None and name in joint else Screen.NONE
        fd_row, unresolved = fd_row_of(ref, check, g, how), narrowed.unresolved if narrowed is not None else None
    sym = _symbolic_row(run, name, g, fd_row, screen, narrowed)
    # a row the screen cleared shows the whole graph's directional derivatives: no tolerance of its own
    absolute = None if fd_row.screen in (Screen.CLEARED, Screen.BY_SCREEN) else \
        tol.absolute(magnitude(sym.gradient if sym is not None else fd_row.reference))
    return ParameterResult(name=name, shape=tuple(g.shape), gradient=g, fd=fd_row, symbolic=sym, tolerance=tol,
                           absolute=absolute, unresolved=unresolved)


def fd_row_of(ref: FDResult, check, g: np.ndarray, screen: Screen = Screen.NONE) -> FDRow:
    """A parameter checked on its own: the oracle's differences (FDResult) and their check (FDCheck)."""
    reference = check.reference.reshape(np.shape(ref.reference))
    return FDRow(mode=FDMode(ref.mode), comparison=check.comparison, reference=reference,
                 error=check.error.reshape(reference.shape), evaluations=ref.evaluations, screen=screen,
                 passed=check.comparison.passed,
                 engine_projection=as_referenced(ref, g) if ref.mode == FDMode.PROJECTION else None,
                 directions=ref.directions, refined=check.refined, undecidable=check.undecidable,
                 unrefined=len(check.unrefined), unconfirmed=check.unconfirmed)


def _cleared_fd(screen) -> FDRow:
    """A parameter the joint screen cleared: the whole graph's directional derivatives (`reference` FD,
    `engine_projection` the engine's sum), the same for every such parameter; passed, where the whole
    failed, because the bisection cleared this parameter's half."""
    return FDRow(mode=FDMode.JOINT, comparison=screen.comparison, reference=screen.reference, error=screen.error,
                 evaluations=screen.evaluations, screen=Screen.CLEARED, passed=True,
                 engine_projection=screen.engine, refined=screen.refined)


def _spared_fd(evidence) -> tuple:
    """A flagged parameter not followed up on its own (joint_check.spare), decided by its own directional
    values (joint_check.Evidence), each allowed the most a gradient within tolerance could be off plus its
    FD error: (FDRow, why undecided). FAIL where they are off by more; else undecided, never a pass. None: a
    member of a group the bisection's budget left flagged whole (no values of its own): undecided."""
    if evidence is None:
        none = np.zeros(0)
        return FDRow(mode=FDMode.JOINT, comparison=compare(none, none, Tolerance(0.0, 0.0)), reference=none,
                     error=none, screen=Screen.BY_SCREEN, engine_projection=none), (
            "the joint screen flagged it in a group of parameters the bisection's budget did not split further, "
            "and its elements were not checked one by one (the follow-up's budget)")
    comparison = compare(evidence.engine, evidence.reference, Tolerance(0.0, 0.0), evidence.bound + evidence.error)
    why = None if evidence.confirmed else (
        "the joint screen flagged it, but its directional values are within the most a gradient within "
        "tolerance could be off, and its elements were not checked one by one (the follow-up's budget: "
        "the cheapest flagged parameters are checked in full)")
    return FDRow(mode=FDMode.JOINT, comparison=comparison, reference=evidence.reference, error=evidence.error,
                 evaluations=0, screen=Screen.BY_SCREEN, passed=comparison.passed,
                 engine_projection=evidence.engine), why


def _symbolic_row(run: Run, name: str, g: np.ndarray, fd_row: FDRow, screen, narrowed):
    """g against the exact gradient, and the differences against what they would be exactly: the exact
    gradient's projection on the same directions (for a cleared row, the whole graph's, computed once)."""
    symbolic = run.symbolic
    if not symbolic.ran:
        return None
    sym = symbolic.gradients[name]
    if fd_row.screen is Screen.CLEARED:
        if screen.sym_of_fd is None:
            screen.sym_of_fd = sum(screen.directions.project(p, symbolic.gradients[p]) for p in screen.params)
        exact = screen.sym_of_fd
    elif fd_row.screen is Screen.BY_SCREEN:  # the screen's directions on this block alone
        rows = screen.evidence[name].rows if name in screen.evidence else np.zeros(0, np.intp)
        exact = screen.directions.project(name, sym)[rows]
    else:
        exact = fd_row.directions @ sym.reshape(-1) if fd_row.mode is FDMode.PROJECTION else sym
    fd_values = fd_row.reference
    if narrowed is not None:  # differences only at the elements checked
        checked = np.zeros(g.size, bool)
        checked[narrowed.index] = True
        fd_values = np.where(checked.reshape(g.shape), fd_row.reference, sym)
    return SymbolicRow(sym, compare(g, sym, run.tol), compare(fd_values, exact, FD_VS_SYMBOLIC, fd_row.error))


def _blind(screen, name: str) -> str | None:
    """Why the screen's pass says nothing of some of the parameter's elements (JointScreen.unresolved)."""
    if name not in screen.unresolved:
        return None
    count, ratio = screen.unresolved[name]
    return (f"the joint screen would not see an error of {RESOLVE}x their own bound in {count} of its elements "
            f"(it resolves {ratio * RESOLVE:.3g}x at the worst), even with a larger step")


def unexplained_mismatches(results, findings, localized: bool, subject) -> list:
    """An error finding at each parameter whose comparison failed while no finding names it (as an
    error, or as the explanation): the verdict's FAIL then always says where. subject: whose gradient the
    rows hold (subject.py)."""
    named = {p for f in findings if f.severity == "error" or (f.cause, f.severity) in EXPLAINING
             for p in f.parameters}
    why = "no single node explains it" if localized else "localization is off"
    out = []
    for r in results:
        if r.passed or r.name in named or r.claim == NOT_PROVIDED:
            continue
        c = r.verdict_comparison
        against = "the symbolic gradient" if r.verdict_reference == "symbolic" else "finite differences"
        # (the symbolic gradient is compared element by element, whatever the differences' mode)
        where = ["direction", *c.worst_index] if r.fd.directional and r.verdict_reference != "symbolic" else \
            list(c.worst_index)
        off = abs(c.engine_at_worst - c.reference_at_worst)
        because = (subject.unlocalized or why) if localized else why
        out.append(Finding(
            node=r.name, op="input", cause="gradient_mismatch", severity="error",
            detail=f"its {subject.adjective}gradient disagrees with {against} (worst {where}"
                   f"{_in_source_terms(r, where)}: "
                   f"{subject.name} {c.engine_at_worst:.8g}, reference {c.reference_at_worst:.8g}, off by {off:.3g}; "
                   f"tolerance atol {r.tolerance.atol:g}, rtol {r.tolerance.rtol:g}{_held_to_size(r)}) and {because}",
            parameters=[r.name], worst=WorstElement(tuple(where), float(c.engine_at_worst),
                                                     float(c.reference_at_worst))))
    return out


def _in_source_terms(r, where: list) -> str:
    """' = fc1.weight[3, 1] (transposed)': the worst element in the names of the framework that made the
    model (the ONNX importer's source_names), where one torch parameter is the initializer one to one."""
    named = [s for s in r.source_names if s.name and s.relation != "tied"]  # a tied copy is the parameter itself
    if r.fd.mode is not FDMode.FULL or not named:
        return ""
    if named[0].relation in GATE_ORDER:  # an RNN's stacked W, R or B: the element is one torch tensor's
        return torch_element([s.name for s in named], named[0].relation, r.shape, where)
    if len(named) > 1:
        return f" of the sum of {', '.join(s.name for s in named)} (merged by the exporter)"
    s = named[0]
    if s.relation == "same":
        return f" = {s.name}{list(where)}" if s.name != r.name else ""
    if s.relation == "transposed":
        return f" = {s.name}{list(reversed(where))} (transposed)"
    return f" of {s.name} ({s.relation})"


def _held_to_size(r) -> str:
    """', absolute term A: held to the gradient's size' where a vanishing gradient's absolute term is below
    atol (compare.py), so that a mismatch smaller than atol does not read as a contradiction."""
    if r.absolute is None or not r.absolute < r.tolerance.atol:
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
        fd = r.fd
        why = r.unresolved or (f"{fd.unrefined} values still off on the first pass once {len(fd.refined)} "
                               "were refined, the most one check refines" if fd.unrefined else None)
        if why is None or r.name in blamed or not r.passed or r.symbolic is not None:
            continue  # decided otherwise: an error, a failed comparison, the exact symbolic gradient
        out.append(Finding(node=r.name, op="input", cause="fd_unresolved", severity="error",
                           detail=f"finite differences could neither confirm nor clear its gradient ({why}): "
                                  "undecided, not verified and not a confirmed mismatch",
                           parameters=[r.name]))
    return out


def undecidable_findings(results, program, findings=()) -> list:
    """One finding per parameter with values finite differences could not decide: no step gave an
    estimate whose error is within the tolerance (or a small fraction of the value) and the engine is
    within that error of it, or -- once fd_check.REFINE_MAX values were refined -- the rest were never
    refined (say which, and how many). A warning (fd_undecidable) where the symbolic oracle decided the
    parameter; otherwise nothing decides those values and the parameter is undecided: an fd_unresolved
    error naming the first of them (never a silent pass).
    None for a parameter a kink finding (nondifferentiable_point, warning or error) already covers: the
    kink is why no step decides it, and the one-sided differences there have settled it."""
    kinked = {p for f in findings if f.cause == "nondifferentiable_point" and f.severity != "info"
              for p in f.parameters}
    out = []
    for r in results:
        fd = r.fd
        if not len(fd.undecidable) or r.name in kinked:
            continue
        flat = fd.reference.reshape(-1)
        first = int(fd.undecidable[0])
        tried = len(fd.undecidable) - fd.unrefined
        why = []
        if tried:
            why.append(f"{tried} with no trustworthy estimate at any step tried")
        if fd.unrefined:
            why.append(f"{fd.unrefined} still off on the first pass (its error estimate covers rounding only) "
                       f"after {len(fd.refined)} values were refined, the most one check refines")
        projected = fd.mode is FDMode.PROJECTION
        label = ["direction", first] if projected else \
            [int(i) for i in np.unravel_index(first, r.shape)] if r.shape else []
        engine = (fd.engine_projection if projected else r.gradient).reshape(-1)[first]
        what = "directional derivatives" if projected else "elements"
        # decided elsewhere only by the exact symbolic gradient; else no reference decides them: undecided
        decided = r.symbolic is not None or not r.passed  # a failed row: its mismatch speaks (an error)
        out.append(Finding(
            node=r.name, op="input", cause="fd_undecidable" if decided else "fd_unresolved",
            severity="warning" if decided else "error",
            detail=f"finite differences cannot decide {len(fd.undecidable)} of its {what} ({'; '.join(why)}), "
                   f"first {label}: the {'first-pass ' if first not in set(fd.refined) else ''}estimate "
                   f"{flat[first]:.8g} (error bound {float(fd.error.reshape(-1)[first]):.3g}, engine {engine:.8g}); "
                   + ("not counted as a mismatch (the symbolic gradient decides it)" if decided else
                      "undecided: not verified and not a confirmed mismatch (no reference decides it)"),
            parameters=[r.name], worst=WorstElement(tuple(label), float(engine), float(flat[first]))))
    return out
