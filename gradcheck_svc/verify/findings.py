"""Findings: what the diagnosis says about one node.

A finding names the node and its op, a cause, a severity and the parameters
whose gradients it affects, with a one-line detail and the worst element.
Causes (the contract):

    rule_error              the node's vjp disagrees with the derivative of its own forward
    cache_corruption        a saved tensor changed between forward and backward (fingerprint)
    inplace_overwrite       an in-place write changed a saved tensor (version counter)
    nondifferentiable_point an input lies at a declared kink; the engine's (sub)gradient is
                            checked against the one-sided differences (an info note when an
                            input is exactly on it and nothing disagrees)
    precision               float32 rounding against the float64 reference
    nonfinite               the first node producing NaN/Inf, forward or backward
    recompute_mismatch      a recomputed (checkpointed) tensor differs from the first forward
    fd_undecidable          (a warning, at a parameter) finite differences could not decide some of
                            its values (no step gave a trustworthy error estimate) but the symbolic
                            gradient or the row's own failure did; undecided otherwise (fd_unresolved)
    fd_unresolved           (an error, at a parameter) finite differences could neither confirm nor
                            clear its gradient: the joint screen could not resolve some of its
                            elements, a flag not narrowed to a decided element, values still off
                            past the refinement cap, or values no step could decide (named). Undecided: not verified, not a mismatch (its row
                            is "undecided"); the verdict is never a pass
    gradient_mismatch       (at a parameter) its gradient failed and no node was named for it
                            (localization off, or no single node explains it): a FAIL never comes
                            without an error finding naming where; (at a value) the first adjoint
                            found wrong whose one consumer's local check cannot tell it wrong

Severity: error (the verdict fails), warning (explained, not a failure),
info (a note).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .jsonnum import json_float

CAUSES = ("rule_error", "cache_corruption", "inplace_overwrite", "nondifferentiable_point", "precision",
          "nonfinite", "recompute_mismatch", "fd_undecidable", "fd_unresolved",
          "gradient_mismatch")
SEVERITIES = ("error", "warning", "info")


@dataclass
class WorstElement:
    index: tuple
    engine: float
    reference: float


@dataclass
class Finding:
    node: str
    op: str
    cause: str
    severity: str
    detail: str
    parameters: list[str] = field(default_factory=list)
    worst: WorstElement | None = None

    def __post_init__(self):
        assert self.cause in CAUSES and self.severity in SEVERITIES, (self.cause, self.severity)

    def to_dict(self) -> dict:
        w = self.worst
        return {
            "node": self.node, "op": self.op, "cause": self.cause, "severity": self.severity,
            "parameters": list(self.parameters), "detail": self.detail,
            "worst_element": None if w is None else {
                "index": list(w.index), "engine": json_float(w.engine), "reference": json_float(w.reference)},
        }

    def to_text(self) -> str:
        tags = self.severity + (f"; affects {', '.join(self.parameters)}" if self.parameters else "")
        return f"node '{self.node}' ({self.op}): {self.cause} — {self.detail} [{tags}]"


def parameters_through(program, node: str) -> list[str]:
    """The parameters a finding at `node` affects: those whose gradient flows through it
    (its ancestors among the parameters, `node` itself included), in the program's order."""
    seen, stack = {node}, [node]
    while stack:
        step = program.by_name.get(stack.pop())
        for name in step.inputs if step is not None else ():
            if name not in seen:
                seen.add(name)
                stack.append(name)
    return [p for p in program.params if p in seen and p in program.requires_grad]
