"""The one shell around request.run_request: what every in-process front end did for itself before.

  in_process(graph, options)      a graph message verified here: the client's Report, or the outcome's own
                                  error raised (the check() entry points, the torch front end)
  verifier(server)                check()'s one choice: in process unless `server` is given (an address or a
                                  Client; gradcheck_core.check_call.on_server)
  run_bounded(seconds, hint, fn..) a request's verification (verify_request, or a front end's function
                                  ending in it) in a child process killed at `seconds` (bounded.py), as the
                                  server's worker runs it: the outcome as data, never raised (both `verify`
                                  commands, a batch shard)

What an outcome means to each channel stays in outcome.CHANNELS; this module only runs the request.
"""
from __future__ import annotations

from .outcome import outcome_of, report_of

__all__ = ["in_process", "run_bounded", "verifier", "verify_request"]


def in_process(graph, options: dict, limits=None):
    """The graph message (gradcheck.v1.Graph) verified in this process with options by name, through the one
    request path: the client's Report (as a server's answer reads), or the outcome's error raised again."""
    from gradcheck_core.request_message import make_request

    from .report_proto import client_report
    from .request import run_request

    return client_report(report_of(run_request(make_request(graph, "", **options), limits)))


def verifier(server=None):
    """verify(graph, options) -> Report: in process, or on `server` when given."""
    if server is None:
        return in_process
    from gradcheck_core.check_call import on_server

    return lambda graph, options: on_server(graph, server, options)


def run_bounded(seconds: float, hint: str | None, fn, *args, on_phase=None, limit_hint: bool = False, **kwargs):
    """fn(*args, **kwargs) in a child process killed at `seconds` (bounded.py; the TimeLimitError names `hint`,
    the flag that raises the limit), as the server's worker runs a request: what fn returns (a report, or
    what a caller keeps of one), or the outcome fn raised as data -- Refused / OverLimit / Internal, never
    raised. A child killed from outside is Internal with bounded.WorkerDied as its error (a batch shard
    retries it on another node). `limit_hint`: a limit's refusal also names the flag that raises it
    (in_process.limit_hints: where the limit is the user's to raise). fn: verify_request, or a front end's
    own module-level function that ends in it."""
    from .bounded import bounded_call
    from .in_process import hinted

    try:
        return bounded_call(seconds, hint, fn, *args, on_phase=on_phase, **kwargs)
    except Exception as exc:  # the child's outcome other than a report, raised back (bounded.py), or its death
        return outcome_of(hinted(exc) if limit_hint else exc)


def verify_request(request, limits=None, *, then=None, on_phase=None, **ask):
    """run_bounded's usual fn, in the child: the request's report (or then(report), what a batch record keeps of
    it); any other outcome is raised, so that only its error crosses the process boundary."""
    from .request import run_request

    report = report_of(run_request(request, limits, on_phase=on_phase, **ask))
    return report if then is None else then(report)
