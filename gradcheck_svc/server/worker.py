"""The code a worker process runs: request bytes in, a plain result tuple out.

Results are plain tuples (picklable, no exception objects):
  ("ok", response_bytes, verdict, [finding causes])
  ("error", error class name, reason, node, field)   a GradcheckError
  ("internal", exception type name)                   logged here, never sent to clients
"""
from __future__ import annotations

import logging
import signal

from gradcheck.v1 import service_pb2

from ..config import ServerLimits
from ..errors import GradcheckError
from ..outcome import Internal, OverLimit, Refused, outcome_of
from ..report_proto import report_to_proto
from ..request import run_request
from .metrics import configure_logging

log = logging.getLogger("gradcheck.worker")


def verify_request(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None,
                   size_checked: bool = False):
    """The pipeline's outcome (request.run_request): a report, tagged with the request's id, as the response
    message; any other outcome as it is. `size_checked`: the servicer measured the bytes it received."""
    outcome = run_request(request, limits, size_checked=size_checked)
    if isinstance(outcome, (Refused, OverLimit, Internal)):
        return outcome
    return service_pb2.VerifyResponse(id=request.id, report=report_to_proto(outcome))


def run_payload(payload: bytes, limits: ServerLimits) -> tuple:
    try:
        request = service_pb2.VerifyRequest.FromString(payload)  # parsed once already by the server
        # the servicer checked the payload's size against the same limit: not measured again
        response = verify_request(request, limits, size_checked=True)
        if not isinstance(response, (Refused, OverLimit, Internal)):
            report = response.report
            return ("ok", response.SerializeToString(), report.verdict, [f.cause for f in report.findings])
    except Exception as exc:  # the response message itself failed: outcome.py classifies it all the same
        response = outcome_of(exc)
    return _result(response)


def _result(outcome) -> tuple:
    """A Refused, OverLimit or Internal outcome as the plain tuple the pool carries back (module docstring)."""
    if isinstance(outcome, Internal):  # an internal fault: the traceback goes to the server's log only
        log.error("internal error while verifying a graph", exc_info=outcome.error)
        return ("internal", outcome.type_name)
    if isinstance(outcome.error, GradcheckError):
        exc = outcome.error
        return ("error", type(exc).__name__, exc.reason, exc.node, exc.field)
    # a request bigger than this process's memory is over a limit, not a fault
    return ("error", "LimitError", outcome.message, None, outcome.field)


def worker_main(conn, limits: ServerLimits) -> None:
    """Serve requests from the pool, one at a time, until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's business; it stops us
    configure_logging()
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        conn.send(run_payload(payload, limits))
