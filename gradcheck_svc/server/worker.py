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

from ..errors import GradcheckError
from ..report_proto import report_to_proto
from ..request import run_request
from ..config import ServerLimits
from .metrics import configure_logging

log = logging.getLogger("gradcheck.worker")


def verify_request(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None
                   ) -> service_pb2.VerifyResponse:
    """The pipeline's report (request.run_request), tagged with the request's id, as the response message."""
    return service_pb2.VerifyResponse(id=request.id, report=report_to_proto(run_request(request, limits)))


def run_payload(payload: bytes, limits: ServerLimits) -> tuple:
    try:
        request = service_pb2.VerifyRequest.FromString(payload)  # parsed once already by the server
        response = verify_request(request, limits)
        report = response.report
        return ("ok", response.SerializeToString(), report.verdict, [f.cause for f in report.findings])
    except GradcheckError as exc:
        return ("error", type(exc).__name__, exc.reason, exc.node, exc.field)
    except MemoryError:  # a request bigger than this process's memory is over a limit, not a fault
        return ("error", "LimitError", "the request needs more memory than this process has", None, "request")
    except Exception as exc:  # an internal fault: the traceback goes to the server's log only
        log.exception("internal error while verifying a graph")
        return ("internal", type(exc).__name__)


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
