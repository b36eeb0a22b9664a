"""One verification, message in, message out: VerifyRequest -> VerifyResponse (the server's worker).

The pipeline itself is gradcheck_svc/request.py (every front end calls it); this module answers it as
the response message. The other names are re-exported for callers that import them from here.
"""
from __future__ import annotations

from gradcheck.v1 import service_pb2

from ..report_proto import report_to_proto
from ..request import check_option_limits, options_from_proto, proto_values, run_request, verify_options
from .config import ServerLimits

__all__ = ["check_option_limits", "options_from_proto", "proto_values", "report_to_proto", "verify_options",
           "verify_report", "verify_request"]

def verify_report(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None, on_phase=None,
                  symbolic: dict | None = None):
    """The pipeline (request.run_request) under its earlier name and signature."""
    return run_request(request, limits, on_phase=on_phase, symbolic=symbolic)


def verify_request(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None,
                   on_phase=None, symbolic: dict | None = None) -> service_pb2.VerifyResponse:
    """The pipeline's report, tagged with the request's id, as the response message."""
    return service_pb2.VerifyResponse(id=request.id, report=report_to_proto(
        run_request(request, limits, on_phase=on_phase, symbolic=symbolic)))
