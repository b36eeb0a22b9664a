"""What every output writer reads: one Outcome per graph (or batch record), and its exit code.

Exit codes (a contract for CI): 0 every gradient verified, 1 a gradient mismatch, 2 invalid
input or usage, 3 server unreachable or transport failure.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..report import Report

EXIT_OK, EXIT_MISMATCH, EXIT_INVALID, EXIT_TRANSPORT = 0, 1, 2, 3


@dataclass
class Outcome:
    path: str
    report: Report | None = None
    error: str = ""
    invalid: bool = False  # the input is at fault (else: transport/server fault)
    seconds: float = 0.0
    # the gradcheck.v1.Graph, for the drawings: None when the file could not be read, and for an
    # ONNX model (the verifier imports it; the client holds only its bytes)
    graph: object = None

    @property
    def status(self) -> str:
        if self.report is not None:
            return self.report.verdict
        return "invalid" if self.invalid else "error"

    @property
    def exit_code(self) -> int:
        if self.report is not None:
            return EXIT_OK if self.report.passed else EXIT_MISMATCH
        return EXIT_INVALID if self.invalid else EXIT_TRANSPORT
