"""Plain-Python reports: what a verification found, without protobuf types.

`Report.data` is the JSON report (the same keys as `gradcheck-svc verify
--format json`); the attributes are conveniences over it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from google.protobuf import json_format

from .errors import GradientsNotVerified
from .outputs.text import graph_label


def message_to_dict(msg) -> dict:
    """Protobuf message -> the JSON report's dict: snake_case names, numbers as numbers.

    json_format converts each element of a repeated double in Python (~1.5 us: 0.45 s of a chain_256
    report's 270,000 listed values, more than its verification): here each such list is set aside (one
    placeholder element keeps the field's place among the keys), json_format maps the rest, and the list
    comes back by C, NaN and infinities spelt as json_format spells them. The message is restored after
    (in place, not a copy: a copy could list a map's entries in another order)."""
    lifted: list = []
    try:
        _lift_doubles(msg, [], lifted)
        out = json_format.MessageToDict(msg, preserving_proto_field_name=True, unquote_int64_if_possible=True,
                                        always_print_fields_with_no_presence=True)
    finally:
        for _, _, field, values in lifted:
            del field[:]
            field.extend(values)
    for where, name, _, values in lifted:
        _at(out, where)[name] = values if np.isfinite(values).all() else [
            "NaN" if v != v else _NONFINITE.get(v, v) for v in values]
    return out


_NONFINITE = {float("inf"): "Infinity", float("-inf"): "-Infinity"}  # json_format's spellings (and "NaN")


def _lift_doubles(msg, where: list, lifted: list) -> None:
    """Take every non-empty repeated double out of msg and its sub-messages (map values excepted: few, and
    json_format's), leaving one 0.0 in its place: (path, field name, the field, its values)."""
    for field, value in msg.ListFields():
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                continue
            if field.is_repeated:
                for i, item in enumerate(value):
                    _lift_doubles(item, [*where, field.name, i], lifted)
            else:
                _lift_doubles(value, [*where, field.name], lifted)
        elif field.is_repeated and field.type == field.TYPE_DOUBLE:
            lifted.append((where, field.name, value, list(value)))
            del value[:]
            value.append(0.0)


def _at(d, where: list):
    for key in where:
        d = d[key]
    return d


def row_status(status: str | None, passed) -> str:
    """A parameter row's status as the verdict set it (gradcheck_svc/verify/verdict.py: "ok", "ok (precision)",
    "ok (kink)", "affected" or "FAIL"), or from `passed` for a row without one. The one function the text, JSON
    and HTML reports (and Parameter.failed) read it through, so they cannot name a row differently."""
    return status or ("ok" if passed else "FAIL")


def row_label(status: str | None, passed, failed_by: str | None) -> str:
    """The row's status with the finding that names it, for the text table: "affected (cache_corruption)",
    "FAIL (gradient_mismatch)"; the status word is row_status's."""
    word = row_status(status, passed)
    return f"{word} ({failed_by})" if failed_by else word


class GradientMismatch(GradientsNotVerified, AssertionError):
    """Raised by Report.raise_for_mismatch() when a gradient is wrong (errors.GradientsNotVerified)."""

    def __init__(self, report: "Report"):
        self.report = report
        super().__init__(report.summary())


@dataclass
class Parameter:
    name: str
    shape: list
    passed: bool
    max_abs_error: float
    max_rel_error: float
    worst_index: list
    engine_at_worst: float
    reference_at_worst: float
    fd_mode: str
    # "ok", "ok (precision)", "ok (kink)", "affected", "undecided" (finite differences could neither confirm nor
    # clear it), "FAIL" or, under claimed gradients, "not provided" (no claim was given for it): the row as the
    # verdict sees it
    status: str = ""
    data: dict = field(repr=False, default_factory=dict)

    @property
    def failed(self) -> bool:
        """Failed as the verdict sees it (a tolerated float32 rounding or a checked kink is no failure; an
        undecided gradient, one finite differences could neither confirm nor clear, is not verified; a missing
        claim fails)."""
        return row_status(self.status, self.passed) in ("FAIL", "undecided", "not provided")

    def _shaped(self, values, what: str) -> np.ndarray:
        if self.data.get("truncated"):
            raise ValueError(f"'{self.name}' has {int(np.prod(self.shape))} elements: the report lists only the "
                             f"first {len(values)} {what} values (data['{what}'])")
        return np.asarray(values, dtype=np.float64).reshape(self.shape)

    @property
    def gradient(self) -> np.ndarray:
        """The gradient verified, an array of the parameter's shape: the engine's, or the claimed one when the
        report's subject is "claimed" (data['claim'] says whether one was given)."""
        return self._shaped(self.data.get("gradient", []), "gradient")

    @property
    def reference(self) -> np.ndarray:
        """The reference gradient, an array of the parameter's shape: finite differences of every element
        (fd_mode full), else the symbolic oracle's exact gradient. In projection mode without the symbolic
        oracle there is no elementwise reference (data['reference'] holds the directional derivatives):
        ValueError."""
        if self.fd_mode == "full":
            return self._shaped(self.data.get("reference", []), "reference")
        sym = self.data.get("symbolic")
        if isinstance(sym, dict):
            return self._shaped(sym.get("gradient", []), "gradient")
        raise ValueError(f"'{self.name}' was checked along random directions (fd_mode projection) without the "
                         "symbolic oracle: no elementwise reference (data['reference'] holds the directional "
                         "derivatives; use fd_mode='full')")

    @property
    def reference_name(self) -> str:
        return {"symbolic": "symbolic", "finite_differences": "finite differences"}.get(
            self.data.get("verdict_reference", ""), "reference")

    def why_failed(self) -> str:
        """Why it fails: the error finding that names it, else its error against the verdict's reference."""
        if self.status == "not provided":
            return "no claimed gradient given"
        if self.data.get("failed_by"):
            return str(self.data["failed_by"])
        if isinstance(self.verdict_error, (int, float)):
            return f"max abs err {self.verdict_error:.3g} vs {self.reference_name}"
        return "mismatch"

    @property
    def verdict_error(self) -> float:
        """Max abs error against the reference the verdict used."""
        sym = self.data.get("symbolic")
        return sym.get("max_abs_error", 0.0) if isinstance(sym, dict) else self.max_abs_error


@dataclass
class Finding:
    node: str
    op: str
    cause: str
    severity: str
    parameters: list
    detail: str
    data: dict = field(repr=False, default_factory=dict)

    def __str__(self) -> str:
        return f"node '{self.node}' ({self.op}): {self.cause} - {self.detail}"


class Parameters(list):
    """The report's parameter rows, in order; also indexed by name: report.parameters["w"]."""

    def __getitem__(self, key):
        if isinstance(key, str):
            for p in self:
                if p.name == key:
                    return p
            raise KeyError(key)
        return super().__getitem__(key)


class Report:
    def __init__(self, data: dict, *, id: str = "", text: str = ""):
        self.id = id
        self.data = data
        self.text = text
        self.graph: str = data.get("graph", "")
        self.verdict: str = data.get("verdict", "")
        self.loss = data.get("loss")
        self.dtype: str = data.get("dtype", "")
        self.device: str = data.get("device", "")
        self.parameters = Parameters(Parameter(
            name=p.get("name", ""), shape=p.get("shape", []), passed=bool(p.get("passed")),
            max_abs_error=p.get("max_abs_error", 0.0), max_rel_error=p.get("max_rel_error", 0.0),
            worst_index=p.get("worst_index", []), engine_at_worst=p.get("engine_at_worst", 0.0),
            reference_at_worst=p.get("reference_at_worst", 0.0), fd_mode=p.get("fd_mode", ""),
            status=p.get("status", ""), data=p)
            for p in data.get("parameters", []))
        self.findings = [Finding(
            node=f.get("node", ""), op=f.get("op", ""), cause=f.get("cause", ""), severity=f.get("severity", ""),
            parameters=f.get("parameters", []), detail=f.get("detail", ""), data=f)
            for f in data.get("findings", [])]
        self.warnings: list = data.get("warnings", [])
        self.memory: dict = data.get("memory", {})
        self.timings: dict = data.get("timings", {})

    @classmethod
    def from_proto(cls, msg, id: str = "") -> "Report":
        data = message_to_dict(msg)
        text = data.pop("text", "")
        return cls(data, id=id, text=text)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def failed_parameters(self) -> list[Parameter]:
        return [p for p in self.parameters if p.failed]

    def raise_for_mismatch(self) -> "Report":
        """Raise GradientMismatch unless every gradient verified; returns self for chaining."""
        if not self.passed:
            raise GradientMismatch(self)
        return self

    def summary(self) -> str:
        """One line: verdict, failing parameters, error findings."""
        line = f"{graph_label(self.graph)}: {self.verdict.upper()}"
        bad = self.failed_parameters
        if bad:
            line += "; wrong gradient for " + ", ".join(f"{p.name} ({p.why_failed()})" for p in bad)
        errors = [f for f in self.findings if f.severity == "error"]
        if errors:
            line += "; " + "; ".join(str(f) for f in errors)
        return line

    def __str__(self) -> str:
        return self.text or self.summary()

    def __repr__(self) -> str:
        return f"<Report {self.graph!r} {self.verdict} id={self.id!r}>"
