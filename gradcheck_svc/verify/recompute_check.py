"""Recompute mismatches (engine/checkpoint.py) as report findings.

A mismatch under the checkpoint policy in force is an error (the reported
gradients were computed from values that differ from the forward pass's);
under the sqrt what-if profile it is a warning (the gradients are right, but
checkpointing this graph would not be).
"""
from __future__ import annotations

from ..engine.program import Program
from .findings import Finding, parameters_through

CAUSE = "recompute_mismatch"


def findings(program: Program, run, policy: str, in_force: bool) -> list[Finding]:
    """run: the CheckpointRun of a gradient run (or None)."""
    out = []
    for m in run.mismatches if run is not None else ():
        more = f"; {len(m.downstream)} value(s) downstream of it differ as a consequence" if m.downstream else ""
        why = ("the reported gradients used the recomputed values" if in_force
               else f"gradients are unaffected, but '{policy}' checkpointing would compute them from values "
                    "that differ from the forward pass")
        # worst element: none, only fingerprints of the first forward are kept, not its values
        out.append(Finding(
            node=m.node, op=m.op, cause=CAUSE, severity="error" if in_force else "warning",
            parameters=parameters_through(program, m.node),
            detail=(f"recomputing checkpoint segment {m.segment} under '{policy}' gave a value whose "
                    f"fingerprint differs from the first forward's, from identical inputs: a "
                    f"nondeterministic op or randomness that is not replayed{more}; {why}")))
    return out


def attribute(found: list[Finding], results) -> list[Finding]:
    """One finding per cause: a recomputed value that differs from the first forward's (in force)
    changes every value after it in that pass and so, through the backward, the gradient of every
    parameter reaching the loss -- the failing parameters are its, not a cache_corruption or a
    gradient_mismatch of their own at the readers (found: the engine's findings, extended in place)."""
    failing = [r.name for r in results if not r.passed]
    for f in found:
        if f.cause == CAUSE and f.severity == "error":
            f.parameters += [p for p in failing if p not in f.parameters]
    return found
