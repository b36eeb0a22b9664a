"""The diagnosis in order:
1. the saved-tensor store's events (integrity.py);
2. non-finite values (nonfinite.py), unless a corrupted saved tensor explains them;
3. for each parameter that still fails, localization (localize.py) finds the faulty node and
   classify.py says why -- up to MAX_ROUNDS independent faults.
"""
from __future__ import annotations

from ..findings import Finding
from .classify import classify
from .context import Context
from .integrity import integrity_findings
from .localize import localize
from .nonfinite import nonfinite_findings

EXPLAINING = ("nondifferentiable_point", "precision")  # causes that can excuse a parameter's mismatch
MAX_ROUNDS = 3  # localizations per verification (one per independent fault)


def diagnose(ctx: Context) -> list[Finding]:
    findings = integrity_findings(ctx)
    named = {f.node for f in findings if f.severity == "error"}
    # NaN/Inf that a corrupted or overwritten saved tensor explains is not a second finding
    nonfinite = [f for f in nonfinite_findings(ctx) if f.node not in named]
    findings += nonfinite
    if ctx.options.localize and not nonfinite:
        findings += localization_findings(ctx, findings)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])


def overall_verdict(results, findings) -> str:
    """fail on any error finding, or on a mismatch no warning/note explains."""
    if any(f.severity == "error" for f in findings):
        return "fail"
    explained = {p for f in findings if f.cause in EXPLAINING for p in f.parameters}
    return "pass" if all(r.passed or r.name in explained for r in results) else "fail"


def localization_findings(ctx: Context, known: list[Finding]) -> list[Finding]:
    covered = {p for f in known if f.severity == "error" for p in f.parameters}
    failing = [r.name for r in ctx.results if not r.passed and r.name not in covered]
    # Parameters whose engine gradient matches the exact symbolic one while finite differences
    # disagree: the engine is right, so only explanations (a kink, rounding) are worth reporting.
    fd_only = [r.name for r in ctx.results if r.passed and not getattr(r, "fd_passed", True)
               and r.name not in covered]
    failing += fd_only
    out = []
    for _ in range(MAX_ROUNDS):
        if not failing:
            break
        traced = ctx.traced()
        loc = localize(traced.program, ctx.fd, traced.adjoints, traced.contributions, ctx.tol, failing)
        if loc is None:
            break
        node = loc.culprit.step.name if loc.culprit is not None else loc.value
        affected = [p for p in failing if p in ctx.params_through(node) or p == node] or list(failing)
        if not any(f.node == node for f in known):  # already named by the store's checks
            finding = classify(ctx, loc, affected)
            if finding.severity == "error" and all(p in fd_only for p in affected):
                failing = [p for p in failing if p not in affected]
                continue
            same = next((f for f in out if (f.node, f.cause, f.severity) ==
                         (finding.node, finding.cause, finding.severity)), None)
            if same is not None:  # one node, one cause: one finding for all the parameters it affects
                same.parameters += [p for p in finding.parameters if p not in same.parameters]
            else:
                out.append(finding)
        failing = [p for p in failing if p not in affected]
    return out
