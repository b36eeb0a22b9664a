"""The diagnosis in order:
1. the saved-tensor store's events (integrity.py);
2. non-finite values (nonfinite.py), unless a corrupted saved tensor explains them;
3. for each parameter that still fails, every node on its path is checked on its own
   (local_sweep.py): every culprit is named, each with the parameters it affects; what no single
   node explains goes to the bisection (localize.py) and classify.py (a kink, float32 accumulation);
4. notes at exact kinks (kinks.py): an input exactly on a declared kink, even when all agree.
"""
from __future__ import annotations

from ..findings import Finding, WorstElement
from .classify import classify
from .context import Context
from .integrity import integrity_findings
from .kinks import exact_kink_notes
from .local_sweep import sweep
from .localize import localize
from .nonfinite import nonfinite_findings

# findings that can excuse a parameter's mismatch: a kink straddled by the differences (warning) and
# rounding shown against the float64 reference (info); an exact-kink note (info) excuses nothing
EXPLAINING = {("nondifferentiable_point", "warning"), ("precision", "info")}
MAX_ROUNDS = 3  # bisections per verification, for what the local sweep leaves unexplained


def diagnose(ctx: Context, prior: list[Finding] = ()) -> list[Finding]:
    """prior: findings made before the diagnosis (the engine's recompute mismatches): the parameters
    they name are explained, their nodes named -- not reported again under another cause."""
    findings = integrity_findings(ctx)
    named = {f.node for f in findings if f.severity == "error"}
    # NaN/Inf that a corrupted or overwritten saved tensor explains is not a second finding
    nonfinite = [f for f in nonfinite_findings(ctx) if f.node not in named]
    findings += nonfinite
    if ctx.options.localize and not nonfinite:
        findings += localization_findings(ctx, list(prior) + findings)
    findings += exact_kink_notes(ctx, findings)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])


def overall_verdict(results, findings) -> str:
    """fail on any error finding, or on a mismatch no warning/note explains."""
    if any(f.severity == "error" for f in findings):
        return "fail"
    explained = {p for f in findings if (f.cause, f.severity) in EXPLAINING for p in f.parameters}
    return "pass" if all(r.passed or r.name in explained for r in results) else "fail"


def localization_findings(ctx: Context, known: list[Finding]) -> list[Finding]:
    covered = {p for f in known if f.severity == "error" for p in f.parameters}
    failing = [r.name for r in ctx.results if not r.passed and r.name not in covered]
    # Parameters whose engine gradient matches the exact symbolic one while finite differences
    # disagree: the engine is right, so only explanations (a kink, rounding) are worth reporting.
    # So are parameters that pass with values finite differences could not decide (a kink nearer than
    # every step): the walk finds the kink, whose one-sided differences say whether the engine is right.
    fd_only = [r.name for r in ctx.results if r.passed and r.name not in covered and
               (not r.fd.passed or len(r.fd.undecidable) > r.fd.unrefined)]
    failing += fd_only
    if not failing:
        return []
    named = {f.node for f in known}
    out: list[Finding] = []
    # 1. every node on a failing path, checked on its own: every culprit, each with its parameters
    verdicts = sweep(ctx, failing)
    for v in verdicts:
        if v.cause is None or v.deferred or v.step.name in named:
            continue
        through = ctx.params_through(v.step.inputs[v.k])
        affected = [p for p in failing if p in through] or through
        if all(p in fd_only for p in affected):
            continue  # the engine matches the exact gradient there: not a culprit
        _merge(out, Finding(v.step.name, v.step.op.name, v.cause, "error", v.detail, list(affected), v.worst))
    explained = {p for f in out for p in f.parameters}
    rest = [p for p in failing if p not in explained]
    # 2. what no single node explains: a kink under the parameter-level differences, or rounding in
    # the sum of contributions -- the bisection finds where the adjoint first goes wrong
    if rest:
        cleared = {v.step.name for v in verdicts if v.cause is None and not v.deferred} - \
            {v.step.name for v in verdicts if v.cause is not None or v.deferred}
        out += _bisection_findings(ctx, known + out, rest, fd_only, cleared)
    # 3. float32: a parameter still unexplained whose every node was shown within its rounding band
    if ctx.dtype == "float32":
        out += _rounding_notes(ctx, out, rest, verdicts)
    return out


def _merge(out: list[Finding], finding: Finding) -> None:
    """One node, one cause: one finding for all the parameters it affects."""
    same = next((f for f in out if (f.node, f.cause, f.severity) ==
                 (finding.node, finding.cause, finding.severity)), None)
    if same is None:
        out.append(finding)
    else:
        same.parameters += [p for p in finding.parameters if p not in same.parameters]


def _bisection_findings(ctx: Context, known: list[Finding], failing: list[str], fd_only: list[str],
                        cleared: set[str]):
    """cleared: nodes the sweep showed right on their own -- never blamed here (their check is the
    stricter one); what remains is a kink or the accumulation of contributions."""
    out: list[Finding] = []
    for _ in range(MAX_ROUNDS):
        if not failing:
            break
        traced = ctx.traced()
        loc = localize(traced.program, ctx.fd, traced.adjoints, traced.contributions, ctx.tol, failing,
                       ctx.evidence)
        if loc is None:
            break
        node = loc.culprit.step.name if loc.culprit is not None else loc.value
        affected = [p for p in failing if p in ctx.params_through(node) or p == node] or list(failing)
        if not any(f.node == node for f in known):  # already named by the store's checks or the sweep
            finding = classify(ctx, loc, affected)
            # a node the sweep cleared is within its rounding band: a rounding note, never a culprit
            blameless = loc.culprit is not None and node in cleared
            if finding.severity == "error" and (blameless or all(p in fd_only for p in affected)):
                failing = [p for p in failing if p not in affected]
                continue
            _merge(out, finding)
        failing = [p for p in failing if p not in affected]
    return out


def _rounding_notes(ctx: Context, found: list[Finding], rest: list[str], verdicts) -> list[Finding]:
    """A float32 parameter over its tolerance that nothing else explains passes only when every node
    on its path was individually shown within its rounding band against the float64 reference."""
    explained = {p for f in found for p in f.parameters}
    out = []
    for p in rest:
        if p in explained:
            continue
        path = [v for v in verdicts if p in ctx.params_through(v.step.inputs[v.k])]
        if not path or any(v.cause is not None or v.deferred for v in path):
            continue
        r = next(r for r in ctx.results if r.name == p)
        c, tol = r.fd.comparison, r.tolerance  # against finite differences, the float64 reference
        nodes = list(dict.fromkeys(v.step.name for v in path))
        out.append(Finding(p, "input", "precision", "info",
                           f"float32 rounding: its gradient is off the float64 reference by {c.max_abs_error:.3g} "
                           f"(tolerance atol {tol.atol:g}, rtol {tol.rtol:g}), yet each of the {len(nodes)} nodes on its "
                           "path is within its float32 rounding band of the float64 reference, checked one by one; "
                           "pass", [p], WorstElement(tuple(c.worst_index), c.engine_at_worst, c.reference_at_worst)))
    return out
