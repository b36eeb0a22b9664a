"""The verification report: plain data, rendered as JSON or text.

The JSON keys are a contract (CI scripts read them): verdict, loss,
parameters[name, shape, gradient, reference, max_abs_error, max_rel_error,
worst_index, tolerance, passed], memory, timings. New keys may be added
around them; none may be renamed.

`reference` and the error keys beside it are engine vs finite differences.
With the symbolic oracle, each parameter also has `symbolic` (the symbolic
gradient and engine vs symbolic errors, or null when it did not run) and
`fd_vs_symbolic` (how far FD is from the exact gradient: how much to trust FD
on this graph); `fd_error` the estimated error of each FD reference value
(`fd_error_at_worst` beside `reference_at_worst`), `fd_refined` how many were
refined on the ladder of steps, `fd_undecidable` the flat indices FD could not decide,
`fd_unconfirmed` those off on the first pass and never refined once a mismatch was confirmed;
`fd_checked_by` how FD checked the parameter: "full", "projection", "joint" (cleared by the
joint screen of all parameters at once: `reference` and `engine_projection` are then the whole
graph's directional derivatives), "joint, then full|projection" (flagged by the screen and
checked on its own) or "joint, then bisection" (flagged, too large to check in full: narrowed to
elements checked by ordinary differences; `reference` holds differences there, the engine's
values elsewhere) or "joint, by the screen" (flagged, not followed up for the follow-up's budget:
`reference` and `engine_projection` its own directional derivatives on the screen's directions);
`passed` is then engine vs symbolic, `fd_passed` engine vs FD, and `verdict_reference` says which one
decided. `source_names`: the names the parameter has in the framework that made the model, when the
ONNX importer can tell and they say more than its own name (each: `name`, e.g. fc1.weight; `relation`
"same", "transposed", "reshaped", "derived" or an
RNN's "lstm_gates", "gru_gates", "rnn_stacked"; `onnx_name`, the name the model reads it by;
`read_by`, those nodes; docs/onnx.md), else []. Top level: `symbolic` (status, reason when skipped,
sizes, seconds), `custom_ops` (one entry per `expr` node, with `user_grad_matches` true/false/null)
and `attributes` (verify/attributes.py: the structural attributes nodes were verified with, `used`,
those not given, `defaulted`, and the `nodes` that share them), `fd_plan` (oracles/fd_plan.py: the
option's `mode`, how many `parameters` each mode checks, `directions`, and the first pass's cost:
`forwards` perturbed forwards evaluating `values` values, `whole_graph_evaluations` forwards of the whole
graph's worth, `forward_values` one forward's values; null when no finite differences ran).

`subject` (top level) says what was verified: "engine" (its gradients of the graph) or "claimed"
(the gradients the graph's `claimed` carried, computed by other code: verify/claims.py). Under
claims, `gradient` and `engine_at_worst` are the claimed values, each row has `claim` ("provided" or
"not provided": its status is then "not provided" and the verdict fails) and `vs_engine` (the claim
against the engine's own gradient: max_abs_error, worst_index, claimed_at_worst, engine_at_worst,
agree).

`status` is the row as the verdict sees it (verdict.py): "ok", "ok (precision)" or
"ok (kink)" (a mismatch a finding explains: `explained_by` names its cause), "affected" (an error
finding names it, `failed_by`, but its own comparison passed), "undecided" (finite differences
could neither confirm nor clear it: `failed_by` fd_unresolved; the verdict fails) or "FAIL" (the
comparison failed unexplained, or an error finding names the parameter: `failed_by`). The
verdict is "pass" exactly when no row is FAIL and no finding is an error. Every `*_s` timing
is in seconds, in the text as well.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gradcheck_core import json_text

from ..text import escape_controls, graph_label
from .jsonnum import json_float
from .memory_profile import summary as memory_summary
from .parameter_result import ParameterResult
from .report_text import parameter_table, plan_line, screen_lines, source_name_lines, timings_line

__all__ = ["FaultRecord", "ParameterResult", "Report"]

TEXT_ROWS = 20  # parameter rows in the text report: the worst ones, then a count (JSON has all)


@dataclass
class FaultRecord:
    fault: str
    readers: list[str]
    before: float | None
    after: float | None
    index: int | None = None  # the flat index of the element `before` and `after` show (one the fault changed;
    # in the text only: the JSON keys mirror the proto's FaultRecord)

    def to_dict(self) -> dict:
        return {"fault": self.fault, "read_by": self.readers,
                "before": json_float(self.before), "after": json_float(self.after)}


@dataclass
class Report:
    graph: str
    verdict: str  # "pass" | "fail"
    loss: float
    dtype: str
    device: str
    parameters: list[ParameterResult]
    memory: dict
    timings: dict
    faults: list[FaultRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    findings: list = field(default_factory=list)  # verify/findings.py Finding, most important first
    timelines: dict = field(default_factory=dict)  # run -> engine.memory.Timeline (memory_timelines)
    symbolic: object = None  # oracles.symbolic.SymbolicResult
    custom_ops: list = field(default_factory=list)  # verify.custom_ops.CustomOpCheck
    subject: str = "engine"  # what was verified: "engine" | "claimed" (gradients other code computed)
    attributes: list = field(default_factory=list)  # verify/attributes.py: what each node was verified with
    fd_plan: object = None  # oracles.fd_plan.FDPlan: each parameter's mode and the first pass's cost

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self, arrays: bool = False) -> dict:
        """The JSON report's data (arrays: the parameters' listed values as NumPy arrays, for to_json)."""
        return {
            "graph": self.graph,
            "verdict": self.verdict,
            "subject": self.subject,
            "loss": json_float(self.loss),
            "dtype": self.dtype,
            "device": self.device,
            "parameters": [p.to_dict(arrays) for p in self.parameters],
            "faults": [f.to_dict() for f in self.faults],
            "warnings": list(self.warnings),
            "findings": [f.to_dict() for f in self.findings],
            "symbolic": self.symbolic.to_dict() if self.symbolic is not None else {"status": "off"},
            "custom_ops": [c.to_dict() for c in self.custom_ops],
            "attributes": [dict(a) for a in self.attributes],
            "fd_plan": self.fd_plan.to_dict() if self.fd_plan is not None else None,
            "memory": dict(self.memory),
            "memory_timelines": [{"run": run, "steps": [m.label for m in marks],
                                  "live_bytes": marks.columns[0].tolist(),
                                  "peak_bytes": marks.columns[1].tolist()} for run, marks in self.timelines.items()],
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json_text.dumps(self.to_dict(arrays=True), indent=indent, allow_nan=False)

    def to_text(self) -> str:
        # "graph NAME: ...": a line of ours never begins with a graph author's text (a CI runner would read
        # a graph named `::error ...::` at a line's start as a workflow command)
        lines = [f"{graph_label(self.graph)}: {self.verdict.upper()}  (loss {self.loss:.10g}, {self.dtype}, "
                 f"{self.device})"]
        if self.subject == "claimed":
            lines.append("  subject: the claimed gradients (computed by other code), against the references; "
                         "the engine's gradients are a third witness")
        lines += [f"  {f.to_text()}" for f in self.findings]
        for f in self.faults:
            at = f"element {f.index}: " if f.index else ""
            change = f" ({at}{f.before:g} -> {f.after:g})" if f.before is not None else ""
            who = ", ".join(f.readers) if f.readers else "nothing saved this value: no effect"
            lines.append(f"  fault {f.fault}{change}, read in the backward of: {who}")
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        s = self.symbolic
        if s is not None and s.status == "ok":
            lines.append(f"  symbolic oracle: ok ({s.elements} elements, {s.edges} partials, {s.digits} digits, "
                         f"{s.seconds:.3g} s); verdict against the symbolic gradient")
        for c in self.custom_ops:
            mark = {True: "ok  ", False: "FAIL", None: "??  "}[c.user_grad_matches]
            lines.append(f"  {mark} custom op node '{c.node}' ({c.formula}): {c.detail}")
        lines += [f"  {line}" for line in screen_lines(self.parameters)]
        if self.parameters:
            lines += ["  " + line for line in parameter_table(self.parameters, TEXT_ROWS)]
            lines += ["  " + line for line in source_name_lines(self.parameters, TEXT_ROWS)]
        else:
            lines.append("  no parameters (no input has requires_grad)")
        lines.extend("  " + line for line in memory_summary(self.memory))
        if self.fd_plan is not None and self.parameters:
            lines.append("  " + plan_line(self.fd_plan.to_dict()))
        lines.append("  " + timings_line(self.timings))
        # each line is one line: a control character in it came from a name in the request
        return "\n".join(escape_controls(line) for line in lines)

