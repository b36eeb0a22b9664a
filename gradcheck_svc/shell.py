"""The one shell around request.run_request: what every in-process front end did for itself before.

  in_process(graph, options)      a graph message verified here: the client's Report, or the outcome's own
                                  error raised (the check() entry points, the torch front end)
  verifier(server)                check()'s one choice: in process unless `server` is given (an address or a
                                  Client; gradcheck_core.check_call.on_server)
  run_bounded(seconds, hint, ...) run_request in a child process killed at `seconds` (bounded.py), as the
                                  server's worker is: the outcome as data, never raised (both `verify`
                                  commands, a batch shard)

What an outcome means to each channel stays in outcome.CHANNELS; this module only runs the request.
"""
from __future__ import annotations

from .outcome import outcome_of, report_of

__all__ = ["in_process", "run_bounded", "verifier"]


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


def run_bounded(seconds: float, hint: str | None, request, limits=None, *, then=None, on_phase=None, **ask):
    """run_request(request, limits, **ask) in a child killed at `seconds` (the TimeLimitError names `hint`, the
    flag that raises the limit): its outcome -- the report, or `then(report)` computed in the child (what a
    batch record keeps) -- or Refused / OverLimit / Internal. A child killed from outside is Internal with
    bounded.WorkerDied as its error (a batch shard retries it on another node)."""
    from .bounded import bounded_call

    try:
        return bounded_call(seconds, hint, _child, request, limits, then, ask, on_phase=on_phase)
    except Exception as exc:  # the child's outcome other than a report, raised back (bounded.py), or its death
        return outcome_of(exc)


def _child(request, limits, then, ask: dict, on_phase=None):
    """run_bounded's work in the child: a report (or then(report)) goes back; any other outcome is raised, so
    that only its error crosses the process boundary (bounded.py pickles it)."""
    from .request import run_request

    report = report_of(run_request(request, limits, on_phase=on_phase, **ask))
    return report if then is None else then(report)
