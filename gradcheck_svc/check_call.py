"""Check a NumPy function's gradients in one call, in process:

    import numpy as np
    import gradcheck_svc
    report = gradcheck_svc.check(lambda x, w: np.tanh(x @ w), np.ones((2, 3)), np.eye(3))
    assert report.passed, report.text
    gradcheck_svc.assert_gradients(np.linalg.norm, np.arange(1.0, 4.0))   # for pytest
    gradcheck_svc.check(np.linalg.norm, np.arange(1.0, 4.0), grad=lambda x: x / np.linalg.norm(x))  # yours

The same trace as gradcheck_client.check (every float argument a parameter unless `wrt` names which,
a non-scalar output reduced with a seeded cotangent, stated in the report; refused where the traced
graph and f on NumPy copies differ: gradcheck_core/faithful.py), verified by the request
path every front end runs (request.py: the same options table, limits and validation), and
returned as the client's Report: in process and through a server, one call gives the same Report.
"""
from __future__ import annotations

from gradcheck.v1 import service_pb2
from gradcheck_core.check_call import check_options, stated, traced_for_check

from .outcome import report_of
from .report_proto import client_report
from .request import run_request

__all__ = ["assert_gradients", "check"]


def check(f, *args, wrt=None, grad=None, **options) -> Report:
    """Trace f on args and verify its gradients here -- or, given grad (the user's backward), grad's
    gradients (gradcheck_core.check_call); options are those of verify (gradcheck_core.options)."""
    options = check_options(options)
    traced = traced_for_check(f, args, wrt, grad, options)
    if "faults" in options:
        options["faults"] = list(options["faults"])
    request = service_pb2.VerifyRequest(graph=traced.graph, options=service_pb2.VerifyOptions(**options))
    return stated(client_report(report_of(run_request(request))), traced)


def assert_gradients(f, *args, wrt=None, grad=None, **options) -> Report:
    """check(), raising AssertionError with the text report unless every gradient verified (for pytest)."""
    report = check(f, *args, wrt=wrt, grad=grad, **options)
    if not report.passed:
        raise AssertionError(str(report))
    return report

