"""One verdict, stated once: every parameter row's status and the report's verdict from the
same comparison and the same findings, so that no row can contradict the verdict.

A row is
    FAIL            an error finding names the parameter and its comparison failed, or its
                    comparison failed and no finding explains it;
    affected        a finding of corrupted saved values (cache_corruption, inplace_overwrite,
                    recompute_mismatch) names the parameter but its own comparison passed: an
                    effect of that fault, not a second cause (the verdict fails on the finding);
    ok (precision)  the comparison failed but a precision finding explains it (float32
                    rounding tolerated);
    ok (kink)       the comparison failed at a declared kink whose convention was checked;
    undecided       finite differences could neither confirm nor clear it (an fd_unresolved
                    finding: the joint screen's flag not narrowed to a decided element, values
                    past the refinement cap); the verdict fails -- never a silent pass;
    ok              the comparison passed.
The verdict fails when a row is FAIL or any finding is an error (one in a parameter-free part
of the graph too).
"""
from __future__ import annotations

from .diagnosis.diagnose import EXPLAINING, overall_verdict

OK, FAIL, AFFECTED, UNDECIDED = "ok", "FAIL", "affected", "undecided"
CORRUPTION = ("cache_corruption", "inplace_overwrite", "recompute_mismatch")  # a fault upstream, not the row's
EXPLAINED_AS = {"precision": "ok (precision)", "nondifferentiable_point": "ok (kink)"}
# EXPLAINING: the (cause, severity) pairs of findings that excuse a parameter's mismatch
assert {cause for cause, _ in EXPLAINING} == set(EXPLAINED_AS), "a cause that excuses a mismatch needs its row label"


def settle(results, findings) -> str:
    """Set each ParameterResult's `status` (and `explained_by`); return the verdict."""
    blamed = {}
    for f in findings:
        if f.severity == "error":
            for p in f.parameters:
                blamed.setdefault(p, f.cause)
    explained = {}
    for f in findings:
        if (f.cause, f.severity) in EXPLAINING:
            for p in f.parameters:
                explained.setdefault(p, f.cause)
    for r in results:
        r.explained_by = r.failed_by = None
        if r.name in blamed:
            r.status = AFFECTED if r.passed and blamed[r.name] in CORRUPTION else \
                UNDECIDED if blamed[r.name] == "fd_unresolved" else FAIL
            r.failed_by = blamed[r.name]
        elif r.passed:
            r.status = OK
        elif r.name in explained:
            r.status, r.explained_by = EXPLAINED_AS[explained[r.name]], explained[r.name]
        else:
            r.status = FAIL
    verdict = overall_verdict(results, findings)
    # the rows and the verdict come from the same facts; a disagreement is a bug here
    assert verdict == "pass" or any(f.severity == "error" for f in findings) or \
        any(r.status == FAIL for r in results), "a failing verdict without a failing row or error"
    assert not (verdict == "pass" and any(r.status == FAIL for r in results)), "FAIL row under PASS"
    return verdict
