"""Outcomes as data: what one verification request came to, and one table that maps it per channel.

request.run_request returns one of
  Report                   the verification ran; passed or not is the report's verdict
  Refused(field, reason)   invalid input: the request cannot be verified as given (kind "invalid"), or the
                           device it asks for is not here (kind "unavailable")
  OverLimit(which)         a valid request over a limit: a configured one (its LIMITS name, e.g.
                           "max_elements", where known), the time limit ("time") or this process's
                           memory ("memory")
  Internal(type_name)      a fault of the verifier: never shown to users as a traceback
instead of raising. `outcome_of` is the one classification of an exception into these (the server's
status, both CLIs' exit codes and the batch records read it); CHANNELS is the one table from an outcome's
row to each channel's answer. Each outcome keeps the error it came from (`error`, not compared) so a
caller whose flow is exceptions (`report_of`) raises exactly what it raised before.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import BackendUnavailable, GradcheckError, LimitError, TimeLimitError

__all__ = ["CHANNELS", "Internal", "OverLimit", "Refused", "batch_status", "exit_code", "grpc_status",
           "outcome_of", "report_of", "row"]


@dataclass(frozen=True)
class Refused:
    """Invalid input (gradcheck_core.errors.InvalidInput): `field` names the node or field, `reason` says why."""
    field: str | None
    reason: str
    message: str  # the one line shown: "node 'x': reason" or the reason alone
    kind: str = "invalid"  # or "unavailable": the device or backend asked for cannot be used here
    error: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class OverLimit:
    """A valid request over a limit: `which` is the limit's name (limits.py) where the error names it (else
    "limit"; `field` names the option or node), "time" or "memory"."""
    which: str
    message: str
    field: str | None = None
    error: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Internal:
    """A fault of the verifier (a bug): its exception's type name; the traceback goes to a log only."""
    type_name: str
    error: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)


def outcome_of(exc: BaseException) -> Refused | OverLimit | Internal:
    """The one classification of what a verification raised."""
    if isinstance(exc, TimeLimitError):
        return OverLimit("time", exc.message, exc.where, error=exc)
    if isinstance(exc, LimitError):
        return OverLimit(exc.limit or "limit", exc.message, exc.where, error=exc)
    if isinstance(exc, MemoryError):
        return OverLimit("memory", "the request needs more memory than this process has", "request", error=exc)
    if isinstance(exc, BackendUnavailable):
        return Refused(exc.where, exc.reason, exc.message, kind="unavailable", error=exc)
    if isinstance(exc, GradcheckError):
        return Refused(exc.where, exc.reason, exc.message, error=exc)
    return Internal(type(exc).__name__, error=exc)


def report_of(outcome):
    """The Report, or the very error the outcome came from raised again (for callers whose flow is
    exceptions: a forked child's caller, check(), the torch front end)."""
    if isinstance(outcome, (Refused, OverLimit, Internal)):
        raise outcome.error
    return outcome


def row(outcome) -> str:
    """The outcome's row of CHANNELS."""
    if isinstance(outcome, Refused):
        return outcome.kind
    if isinstance(outcome, OverLimit):
        return outcome.which if outcome.which in ("time", "memory") else "limit"
    if isinstance(outcome, Internal):
        return "internal"
    return "passed" if outcome.passed else "failed"


RETRY = "retry"  # a batch record is not written: the unit exits 75 and its Job retries it (another node)

# row -> (gRPC status code name, the gradcheck-error-kind trailer, exit code of `gradcheck-svc verify`,
#         exit code of `gradcheck verify` in process, batch record status). A report's status on the wire
#         is OK whatever its verdict; its record status is the verdict itself. Kept as each channel has
#         always answered (the contracts): the CI command reads its own time limit as a server's
#         DEADLINE_EXCEEDED (exit 3, docs/ci.md), and memory is a limit to a server and a command (the
#         user's to shrink) but a node's to a batch (another node may have more: exit 75, retried).
CHANNELS = {
    "passed": ("OK", None, 0, 0, "pass"),
    "failed": ("OK", None, 1, 1, "fail"),
    "invalid": ("INVALID_ARGUMENT", "invalid", 2, 2, "invalid"),
    "unavailable": ("FAILED_PRECONDITION", "unavailable", 2, 2, RETRY),
    "limit": ("RESOURCE_EXHAUSTED", "limit", 2, 2, "invalid"),
    "memory": ("RESOURCE_EXHAUSTED", "limit", 2, 2, RETRY),
    "time": ("DEADLINE_EXCEEDED", "timeout", 2, 3, "timeout"),
    "internal": ("INTERNAL", "internal", 3, 3, "error"),
}


def grpc_status(outcome) -> tuple[str, str | None]:
    """(status code name, error kind) the server answers."""
    return CHANNELS[row(outcome)][:2]


def exit_code(outcome, command: str = "gradcheck-svc") -> int:
    """The exit code of `gradcheck-svc verify` (command "gradcheck-svc") or `gradcheck verify` ("gradcheck")."""
    return CHANNELS[row(outcome)][2 if command == "gradcheck-svc" else 3]


def batch_status(outcome) -> str:
    """A batch record's status (a report's own verdict where it ran), or RETRY."""
    status = CHANNELS[row(outcome)][4]
    return outcome.verdict if status in ("pass", "fail") else status
