"""What every output writer reads: one Outcome per graph (or batch record), and its exit code.

Exit codes (a contract for CI): 0 every gradient verified, 1 a gradient mismatch, 2 invalid
input or usage, 3 server unreachable or transport failure.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..report import Report

EXIT_OK, EXIT_MISMATCH, EXIT_INVALID, EXIT_TRANSPORT = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it


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


def print_outcomes(outcomes: list, format: str) -> None:
    """Several graphs' outcomes on stdout, as both `verify` commands print them: JSON, a list of
    {path, status, report, error}; text, per graph `== PATH` then its report or `STATUS: error`
    (paths, reports and errors echo user strings: escaped for the terminal)."""
    from .. import json_text
    from .text import clip, lines

    if format == "json":
        print(json_text.dumps([{"path": o.path, "status": o.status, "report": o.report.data if o.report else None,
                                "error": o.error or None} for o in outcomes]))
        return
    for o in outcomes:
        print(f"== {clip(o.path, 1000)}")
        print(lines(o.report) if o.report else f"{o.status.upper()}: {clip(o.error, 2000)}")
        print()


def print_interrupted(command: str, finished: list, total: int, format: str,
                      cause: BaseException | None = None) -> int:
    """Ctrl-C (or SIGTERM: cause a terminate.Terminated) during a run of several graphs: the outcomes that
    finished on stdout as print_outcomes prints them (their work is not lost), one line on stderr saying the
    rest was not verified and that no output file was written (a partial JUnit file could read as a complete
    pass); EXIT_INTERRUPTED, or 143 for SIGTERM."""
    import sys

    from ..terminate import EXIT_TERMINATED, Terminated

    if finished:
        print_outcomes(finished, format)
    how = "terminated (SIGTERM)" if isinstance(cause, Terminated) else "interrupted"
    print(f"{command}: {how}: {len(finished)} of {total} graphs verified{' (above)' if finished else ''}; "
          "the others were not, and no --junit, --html or --summary-md file was written", file=sys.stderr)
    return EXIT_TERMINATED if isinstance(cause, Terminated) else EXIT_INTERRUPTED
