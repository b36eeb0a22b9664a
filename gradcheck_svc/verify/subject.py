"""Whose gradient a verification puts under test: the Subject, with two implementations -- the engine's
gradient (`EngineGradient`, a graph without claims) and the user's claims (`Claimed`, graph.claims: the
module docstring of claims.py). The stages (run.py, fd_shards.py) and the diagnosis ask the subject rather
than whether the graph carries claims: which gradients the rows hold, the dtype whose tolerance judges
them, what the rows and warnings say of the claims, and which diagnosis speaks of them. The references
never change; only the thing under test does.
"""
from __future__ import annotations

from dataclasses import replace

from ..graph.ir import FOLDED_CONSTANTS
from . import recompute_check
from .compare import Tolerance, compare
from .diagnosis.claimed import diagnose_claims
from .diagnosis.diagnose import diagnose
from .findings import Finding, parameters_through
from .parameter_result import NOT_PROVIDED, PROVIDED


class EngineGradient:
    """The engine's gradient is under test: the engine's runs are diagnosed, user derivatives checked."""

    name = "engine"  # the report's `subject`
    whose = "the engine's"  # before "gradient" in a finding's words
    noun = "the engine"
    adjective = ""  # "its gradient disagrees ..."
    unlocalized = None  # why a mismatch no finding explains stays unlocalized, beyond the diagnosis's own

    def tolerance_dtype(self, dtype: str) -> str:
        return dtype

    def gradients(self, engine_gradients: dict) -> dict:
        return engine_gradients

    def witness(self, engine, name: str):
        """A third gradient beside the subject and the references: none (the engine is the subject)."""
        return None

    def annotate(self, results, engine_gradients: dict, tol: Tolerance) -> list[str]:
        return []

    def findings(self, run) -> list:
        """The diagnosis of the engine's runs (a recompute mismatch first), and a user derivative that
        disagrees with SymPy's."""
        prior = recompute_check.attribute(run.engine.findings, run.results)
        return prior + diagnose(run, prior)

    def after_checks(self, run, findings: list) -> list:
        """After the undecided and unresolved findings: a user derivative that disagrees with SymPy's is a
        rule_error at its node, whether or not the gradient check happened to localize it (e.g. a
        parameter-free branch)."""
        named = {f.node for f in findings if f.cause == "rule_error"}
        return [Finding(node=c.node, op="expr", cause="rule_error", severity="error",
                        detail=f"user derivative disagrees with SymPy's: {c.detail}",
                        parameters=parameters_through(run.engine.program, c.node))
                for c in run.custom if c.user_grad_matches is False and c.node not in named]

    def mark_missing(self, results) -> None:
        pass


class Claimed:
    """The user's claimed gradients are under test (graph.claims); the engine's gradient is a third witness."""

    name = "claimed"
    whose = "the claimed"
    noun = "the claimed gradient"
    adjective = "claimed "
    unlocalized = "the claim holds no adjoint that localizes it further"

    def __init__(self, claims, notes=()):
        self.claims = claims
        if any(n.startswith(FOLDED_CONSTANTS) for n in notes):  # a correct torch gradient fails where the graph
            # lacks a folded expression's path: the failure points at the constants (an instance's, not the class's)
            self.unlocalized = (f"{Claimed.unlocalized}; the model has constants its exporter made that may be "
                                "computed from a parameter (named in the warnings): a parameter folded into one has "
                                "no gradient through it in the graph, so a correct gradient of it fails here")

    def tolerance_dtype(self, dtype: str) -> str:
        """float32 for float32 claims (their backward rounded in float32, whatever the graph's dtype)."""
        return "float32" if self.claims.dtype == "float32" else dtype

    def gradients(self, engine_gradients: dict) -> dict:
        """The claimed gradients; a parameter without a claim keeps the engine's, so its row can still be
        drawn (its status says 'not provided', never 'ok')."""
        return {p: self.claims.gradients.get(p, g) for p, g in engine_gradients.items()}

    def witness(self, engine, name: str):
        return engine.gradients.get(name)

    def annotate(self, results, engine_gradients: dict, tol: Tolerance) -> list[str]:
        """Mark each row's claim and compare it with the engine's gradient; return the warnings."""
        warnings = []
        for r in results:
            if r.name not in self.claims.gradients:
                r.claim = NOT_PROVIDED  # its row fails (ParameterResult.passed)
                warnings.append(f"no claimed gradient for parameter '{r.name}': not verified (a claim gives every "
                                "parameter's gradient)")
                continue
            r.claim = PROVIDED
            r.vs_engine = compare(r.gradient, engine_gradients[r.name], tol)
            if r.passed and not r.vs_engine.passed:
                warnings.append(f"the engine's own gradient of '{r.name}' disagrees with the claimed one, which "
                                "the references confirm: an engine bug (verify without the claims to see it)")
        return warnings

    def findings(self, run) -> list:
        """The same analyses (kinks, float32 rounding), localized by the claims' own adjoints, in the claims'
        dtype (their tolerance's)."""
        return diagnose_claims(replace(run, dtype=self.tolerance_dtype(run.dtype)))

    def after_checks(self, run, findings: list) -> list:
        return []

    def mark_missing(self, results) -> None:
        """After the verdict (verdict.settle): a row without a claim says so instead of FAIL."""
        for r in results:
            if r.claim == NOT_PROVIDED:
                r.status, r.failed_by = NOT_PROVIDED, None


def subject_of(graph) -> EngineGradient | Claimed:
    return EngineGradient() if graph.claims is None else Claimed(graph.claims, graph.notes)
