"""check() and assert_gradients for NumPy functions, with the one signature of every check() entry point
(gradcheck_svc.check and the torch front end's too): in process unless `server=` is given.

    from gradcheck_client import check
    check(lambda x, w: np.tanh(x @ w), np.ones((2, 3)), np.eye(3))                             # in process
    check(lambda x, w: np.tanh(x @ w), np.ones((2, 3)), np.eye(3), server="localhost:50051")   # on a server

The trace and the report are gradcheck_core.check_call's; in process means gradcheck-svc's request path
(gradcheck_svc/shell.py), reached only here, inside the call (the client installs without it).
"""
from __future__ import annotations

from gradcheck_core.check_call import check_with, on_server, passed_or_raise
from gradcheck_core.report import Report

__all__ = ["assert_gradients", "check", "verifier"]


def verifier(server=None):
    """verify(graph, options) -> Report: on `server` when given, else in this process (gradcheck-svc needed)."""
    if server is not None:
        return lambda graph, options: on_server(graph, server, options)
    try:
        from gradcheck_svc.shell import in_process
    except ImportError:
        raise TypeError("no server given and gradcheck-svc is not installed here: pass server=HOST:PORT (a "
                        "gradcheck server), or install gradcheck-svc to verify in process") from None
    return in_process


def check(f, *args, wrt=None, grad=None, server=None, **options) -> Report:
    """Trace f on args and verify its gradients (grad's, when given): in process, or on the server at `server`
    (an address or a Client). Options are those of verify (gradcheck_core.options)."""
    return check_with(verifier(server), f, args, wrt, grad, options)


def assert_gradients(f, *args, wrt=None, grad=None, server=None, **options) -> Report:
    """check(), raising AssertionError with the text report unless every gradient verified (for pytest)."""
    return passed_or_raise(check(f, *args, wrt=wrt, grad=grad, server=server, **options))
