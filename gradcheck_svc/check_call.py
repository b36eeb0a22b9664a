"""Check a NumPy function's gradients in one call, in process:

    import numpy as np
    import gradcheck_svc
    report = gradcheck_svc.check(lambda x, w: np.tanh(x @ w), np.ones((2, 3)), np.eye(3))
    assert report.passed, report.text
    gradcheck_svc.assert_gradients(np.linalg.norm, np.arange(1.0, 4.0))   # for pytest
    gradcheck_svc.check(np.linalg.norm, np.arange(1.0, 4.0), grad=lambda x: x / np.linalg.norm(x))  # yours
    gradcheck_svc.check(np.linalg.norm, np.arange(1.0, 4.0), server="localhost:50051")  # on a server

The same trace as gradcheck_client.check (every float argument a parameter unless `wrt` names which,
a non-scalar output reduced with a seeded cotangent, stated in the report; refused where the traced
graph and f on NumPy copies differ: gradcheck_core/faithful.py), verified by the request
path every front end runs (request.py: the same options table, limits and validation), and
returned as the client's Report: in process and through a server, one call gives the same Report.
"""
from __future__ import annotations

from gradcheck_core.check_call import check_with, passed_or_raise

from .shell import verifier

__all__ = ["assert_gradients", "check"]


def check(f, *args, wrt=None, grad=None, server=None, **options) -> Report:
    """Trace f on args and verify its gradients here -- or, given grad (the user's backward), grad's
    gradients (gradcheck_core.check_call); options are those of verify (gradcheck_core.options). The one
    check() signature (gradcheck_client.check's too): in process unless `server` (an address or a Client)
    is given."""
    return check_with(verifier(server), f, args, wrt, grad, options)


def assert_gradients(f, *args, wrt=None, grad=None, server=None, **options) -> Report:
    """check(), raising AssertionError with the text report unless every gradient verified (for pytest)."""
    return passed_or_raise(check(f, *args, wrt=wrt, grad=grad, server=server, **options))
