"""`gradcheck verify PATHS...`: the CI command.

Exit codes (a contract for CI): 0 every gradient verified, 1 a gradient
mismatch, 2 invalid input or usage (bad graph, bad option, over a limit, bad
token), 3 server unreachable or transport failure. When several apply, the
highest wins (a run that could not reach the server is never reported as a
plain mismatch).

With --server (or $GRADCHECK_SERVER) graphs stream to the server; without,
they are verified in-process when the gradcheck-svc package is installed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import __version__
from gradcheck_core.claims import ClaimsFileError, claimed_flag, with_claims
from gradcheck_core.token import token_problem
from gradcheck_core.graphio import GraphFileError, load_graph
from gradcheck_core.onnx_files import OnnxFileError
from gradcheck_core.onnx_options import (OnnxFlagError, OnnxModel, is_onnx, onnx_import_message,
                                         refuse_unused_onnx_flags)
from gradcheck_core.options import BY_NAME, IN_PROCESS_OPTIONS, MAX_SECONDS, CommandParser, plot_path, values_from_args
from gradcheck_core.outputs.guard import write_reports
from gradcheck_core.outputs.outcome import (EXIT_INVALID, EXIT_MISMATCH, EXIT_OK, EXIT_TRANSPORT, Outcome,
                                            print_interrupted, print_outcomes)
from gradcheck_core.outputs.text import escape_controls
from gradcheck_core.report import Report
from gradcheck_core.verify_args import add_verify_arguments, output_over_input
from gradcheck_core.scan import graph_paths
from gradcheck_core.terminate import sigterm_interrupts

__all__ = ["EXIT_INVALID", "EXIT_MISMATCH", "EXIT_OK", "EXIT_TRANSPORT", "Outcome", "junit_xml", "main",
           "summary_markdown"]


def __getattr__(name: str):
    """junit_xml and summary_markdown, re-exported here, are imported when asked for: a run that writes no
    JUnit or Markdown file does not pay for their modules at start-up."""
    if name == "junit_xml":
        from gradcheck_core.outputs.junit import junit_xml
        return junit_xml
    if name == "summary_markdown":
        from gradcheck_core.outputs.markdown import summary_markdown
        return summary_markdown
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


VERIFY_EPILOG = """\
examples:
  gradcheck verify examples/graphs/                       # in-process (gradcheck-svc installed)
  gradcheck verify --server localhost:50051 graphs/ --junit junit.xml --html report.html
  gradcheck verify model.onnx --format json

exit codes: 0 every gradient verified, 1 a gradient mismatch, 2 invalid input or usage (bad graph,
bad option, over a limit, bad token), 3 server unreachable or transport failure (the highest wins)"""


def _add_limits():
    """The --max-... limits, where the verifier can run in this process (gradcheck-svc installed); None
    without it (a server applies its own)."""
    try:
        from gradcheck_svc.limits import add_limit_flags
    except ImportError:
        return None
    return lambda parser, hidden: add_limit_flags(
        parser, server=False, what="in-process only; with --server, the server's own apply", hidden=hidden)


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="gradcheck", description="Verify the gradients of computation graphs (CI command).")
    p.add_argument("--version", action="version", version=f"gradcheck {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    v = sub.add_parser("verify", help="verify graph files (.json/.pb), ONNX models (.onnx) or directories of them",
                       description="Verify graphs on a gradcheck server (--server) or in this process; "
                                   "write JUnit, Markdown and HTML reports for CI.",
                       epilog=VERIFY_EPILOG, usage="%(prog)s [options] PATH [PATH ...]")
    add_verify_arguments(v, add_limits=_add_limits())
    conn = v.add_argument_group("server connection (none: verify in this process)")
    conn.add_argument("--server", default=os.environ.get("GRADCHECK_SERVER"), metavar="HOST:PORT",
                      help="gradcheck server (default $GRADCHECK_SERVER; none: verify in-process)")
    conn.add_argument("--token-file", default=None, metavar="FILE",
                      help="bearer token file (default: $GRADCHECK_TOKEN when set, else no token)")
    conn.add_argument("--tls", action="store_true", help="connect with TLS (system roots, or --ca-file; default off)")
    conn.add_argument("--ca-file", default=None, metavar="FILE",
                      help="PEM root certificate(s) for TLS (default: the system's)")
    conn.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS", help="seconds per graph (default 300)")
    return p


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal (quiet in CI logs):
    per graph, and within a graph verified in-process, per phase (engine, finite differences, ...)."""

    def __init__(self, total: int, stream=None):
        # sys.stderr as it is now (not as it was at import: a caller may have replaced it since)
        self.total, self.done, self.stream = total, 0, sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty()

    def _show(self, text: str) -> None:
        if self.enabled:
            n = 30 * self.done // max(1, self.total)
            text = escape_controls(text)  # a path may hold terminal controls
            self.stream.write(f"\r[{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total} {text[-60:]:<60}")
            self.stream.flush()

    def phase(self, label: str, phase: str) -> None:
        """A graph in progress: its name and the phase it is in."""
        self._show(f"{label[-40:]}: {phase}")

    def step(self, label: str) -> None:
        self.done += 1
        self._show(label)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


def _options(args) -> dict:
    values = values_from_args(args)
    if getattr(args, "html", None) or getattr(args, "memory_plot", None):  # they draw the memory timeline:
        values.setdefault("memory_timeline", True)  # have the verifier record it
    return values


def _in_process_only(args) -> list[str]:
    """The flags given that only a verification in this process can honour (no request carries them)."""
    given = [o.cli_flag for o in IN_PROCESS_OPTIONS if getattr(args, o.name, None) is not None]
    return given + ["--" + k.replace("_", "-") for k, v in sorted(vars(args).items())
                    if k.startswith("max_") and v is not None]


def _local_setup(args):
    """The in-process limits and symbolic budgets (gradcheck-svc verify's own mapping of the flags)."""
    from gradcheck_svc.in_process import verify_setup
    from gradcheck_svc.errors import GradcheckError

    try:
        limits, _, _, symbolic = verify_setup(args)
    except GradcheckError as exc:
        raise UsageError(exc.message) from None
    return limits, symbolic


def _embed_limits(limits) -> dict:
    """What bounds a model's external data before it is read: in process, the limits this run applies; with
    a server, none here (the server measures the request it receives)."""
    return {} if limits is None else {"max_elements": limits.max_elements, "max_bytes": limits.max_message_bytes}


def _limit_hint(exc, limits) -> str:
    """In process, where a limit is the user's to raise: the flag that raises the one `exc` is over."""
    if limits is None or not getattr(exc, "limit", None):
        return ""
    from gradcheck_svc.limits import _raise_hint

    return _raise_hint(exc.limit)


def _write_plots(args, ordered: list) -> None:
    """--memory-plot: one file per graph with a report (gradcheck-svc's plot of its memory timelines)."""
    try:
        from gradcheck_svc.verify.memory_profile import write_memory_plot
    except ImportError:
        raise UsageError("--memory-plot: needs gradcheck-svc installed here (it draws the plot)") from None
    from gradcheck_svc.errors import GradcheckError

    for o in ordered:
        if o.report is None:
            continue
        plot = plot_path(args.memory_plot, o.path, len(ordered) > 1)
        try:
            write_memory_plot(plot, o.report.data)
        except GradcheckError as exc:
            raise UsageError(exc.message) from None
        except OSError as exc:
            raise UsageError(f"cannot write --memory-plot {plot}: {exc.strerror or exc}") from None


def _run_remote(args, graphs: dict, token: str | None, ca: bytes | None, progress: Progress,
                out: dict[str, Outcome]) -> None:
    """Each graph's Outcome into `out` as its answer arrives (what finished stays there on Ctrl-C)."""
    from gradcheck_core.client import Client, VerifyError

    client = Client(args.server, token=token, tls=args.tls, root_certificates=ca, timeout=args.timeout)
    try:
        # --timeout is per graph: the stream may take that per graph in all, and never waits longer
        # than that for its next answer (a dead or stopped server ends the run in --timeout)
        results = client.verify_many(graphs, raise_errors=False, timeout=args.timeout * max(1, len(graphs)),
                                     idle_timeout=args.timeout, **_options(args))
        for item in results:
            if isinstance(item, Report):  # the server's own time for this graph
                out[item.id] = Outcome(item.id, report=item, seconds=float(item.timings.get("total_s", 0.0)))
            else:
                out[item.id] = Outcome(item.id, error=item.message, invalid=item.invalid_input)
            progress.step(item.id)
    except VerifyError as exc:  # the stream itself failed: every graph without a result shares the error
        error = f"{exc.code.name}: {exc.message}"
        if exc.kind == "transport":  # said once here; each graph's outcome points to it
            print(f"gradcheck: error: {unreachable_message(args.server, error, bool(out))}", file=sys.stderr)
            error = f"not verified: no answer from the server at {args.server} ({exc.code.name})"
        for path in graphs:
            out.setdefault(path, Outcome(path, error=error, invalid=exc.invalid_input))
    finally:
        client.close()


def unreachable_message(server: str, error: str, answered: bool = False) -> str:
    """One line for a server that did not answer: the address tried, where it came from, how to set another."""
    source = " (from $GRADCHECK_SERVER)" if server == os.environ.get("GRADCHECK_SERVER") else ""
    what = "stopped answering" if answered else "did not answer"
    return (f"the gradcheck server at {server}{source} {what} ({error}); check that it is running there, or "
            "point --server HOST:PORT (or $GRADCHECK_SERVER) at another")


def _not_verified(path: str, outcome) -> Outcome:
    """A Refused, OverLimit or Internal outcome (gradcheck_svc/outcome.py) as this command's Outcome: invalid
    where its exit code (outcome.CHANNELS) is 2; a time-out reads as a server's deadline, exit 3."""
    from gradcheck_svc.outcome import Internal, OverLimit, exit_code

    if isinstance(outcome, Internal):  # an internal fault of the verifier: one line, no traceback
        return Outcome(path, error=f"internal error: {outcome.type_name}: {outcome.error}")
    invalid = exit_code(outcome, "gradcheck") == EXIT_INVALID
    if isinstance(outcome, OverLimit) and outcome.which == "time":
        return Outcome(path, error=f"DEADLINE_EXCEEDED: {outcome.message}", invalid=invalid)
    return Outcome(path, error=outcome.message, invalid=invalid)


def _run_local(args, graphs: dict, progress: Progress, out: dict[str, Outcome], limits=None, symbolic=None) -> None:
    """Each graph's Outcome into `out` as it is verified in this process (what finished stays there on Ctrl-C)."""
    from gradcheck_svc.outcome import Internal, OverLimit, Refused, outcome_of
    from gradcheck_svc.report_proto import client_report
    from gradcheck_svc.request import preload
    from gradcheck_svc.shell import run_bounded, verify_request

    from gradcheck_core.request_message import make_request

    preload(_options(args).get("symbolic", True) is not False, len(graphs))  # warm children (request.preload)
    for path, graph in graphs.items():
        start = time.perf_counter()
        try:
            request = make_request(graph, path, **_options(args))
            # --timeout per graph, as with a server: in a child process killed at the limit, as a server's
            # worker; a limit's refusal names its flag for a model, as gradcheck-svc verify says it
            outcome = run_bounded(args.timeout, "timeout", verify_request, request, limits, symbolic=symbolic,
                                  limit_hint=isinstance(graph, OnnxModel),
                                  on_phase=lambda phase, path=path: progress.phase(path, phase))
            out[path] = _not_verified(path, outcome) if isinstance(outcome, (Refused, OverLimit, Internal)) \
                else Outcome(path, report=client_report(outcome, id=path))  # as a server's answer reads
        except Exception as exc:  # anything else about this graph: outcome.py classifies it all the same
            out[path] = _not_verified(path, outcome_of(exc))
        out[path].seconds = time.perf_counter() - start
        progress.step(path)


def _in_process_available() -> bool:
    try:
        import gradcheck_svc.request  # noqa: F401
    except ImportError:
        return False
    return True


NO_ONNX_DRAWING = "an ONNX model: the verifier imported it, so its graph is not drawn here (the findings " \
    "name its values; `gradcheck-svc verify MODEL.onnx --html FILE` draws the imported graph)"


class UsageError(Exception):
    """A bad argument or an unusable file: one line on stderr, exit 2."""


def _read_file(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror or exc}") from None


def _write_file(path: str, text: str, what: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def _verify(args) -> int:
    """The CI command: the graphs found, checked flags, each graph loaded, verified (on a server or in this
    process) and reported; the highest exit code."""
    paths = _scan(args)
    if output_over_input(args, paths):
        raise UsageError(output_over_input(args, paths))
    limits, symbolic = _check_flags(args)
    token, ca = _credentials(args)
    graphs, outcomes = _load_graphs(args, paths, limits)
    progress, interrupted = Progress(len(paths)), None
    try:
        with sigterm_interrupts():
            if args.server and graphs:
                _run_remote(args, graphs, token, ca, progress, outcomes)
            elif graphs:
                _run_local(args, graphs, progress, outcomes, limits, symbolic)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the graphs verified so far are printed, not lost
        interrupted = exc
    finally:
        progress.close()
    if interrupted is not None:
        finished = [outcomes[str(p)] for p in paths if str(p) in outcomes]
        return print_interrupted("gradcheck", finished, len(paths), args.format, interrupted)
    # every path gets an outcome, even one the server never answered for
    ordered = [outcomes.get(str(p)) or Outcome(str(p), error="no result was received for this graph")
               for p in paths]
    for o in ordered:  # the drawings need the graph: an ONNX model is imported by the verifier, not here
        graph = graphs.get(o.path)
        o.graph = None if isinstance(graph, OnnxModel) else graph
    return _report(args, ordered, graphs)


def _scan(args) -> list:
    """The graph files named or found in the directories named (a skipped file is a note, not a failure)."""
    try:
        return graph_paths(args.paths, args.include, args.exclude, "gradcheck")
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None


def _check_flags(args):
    """The flags checked before any graph is read: (limits, symbolic budgets) in process, (None, None) with
    a server."""
    if not args.server and not _in_process_available():
        raise UsageError("no server given and gradcheck-svc is not installed here; pass --server "
                         "HOST:PORT (or set GRADCHECK_SERVER) to use a gradcheck server")
    if not args.timeout > 0:  # NaN too
        raise UsageError(f"--timeout: must be positive, got {args.timeout}")
    if args.timeout > MAX_SECONDS:  # a wait's own bound (gradcheck_core/options.py)
        raise UsageError(f"--timeout: must be at most {MAX_SECONDS}, got {args.timeout}")
    if args.server and _in_process_only(args):  # silently ignored would be worse
        raise UsageError(f"{_in_process_only(args)[0]}: applies in-process only: with --server, the server's "
                         "own limits and budgets apply")
    limits, symbolic = (None, None) if args.server else _local_setup(args)
    if args.memory_plot and not args.memory_plot.lower().endswith((".svg", ".png")):
        raise UsageError(f"--memory-plot: '{args.memory_plot}': the plot file must end in .svg or .png")
    return limits, symbolic


def _credentials(args):
    """(token, CA certificates) for a server: --token-file, else $GRADCHECK_TOKEN; --ca-file."""
    token = _read_file(args.token_file, "token file").decode(errors="replace").strip() if args.token_file else None
    where = "--token-file" if token else "$GRADCHECK_TOKEN"
    token = token or os.environ.get("GRADCHECK_TOKEN") or None
    if token and token_problem(token):
        raise UsageError(f"{where}: {token_problem(token)}")
    ca = _read_file(args.ca_file, "--ca-file") if args.ca_file else None
    return token, ca


def _load_graphs(args, paths: list, limits):
    """({path: graph message or OnnxModel}, {path: Outcome} for the files that could not be read)."""
    try:
        refuse_unused_onnx_flags(args, paths)
        onnx_options = onnx_import_message(args)
    except OnnxFlagError as exc:
        raise UsageError(str(exc)) from None
    try:
        claims = claimed_flag(args.claimed, paths, limits)
    except ClaimsFileError as exc:
        raise UsageError(f"--claimed: {exc}") from None
    graphs, outcomes = {}, {}
    for p in paths:
        try:
            # an ONNX model goes as its bytes, external data embedded: the server (or the in-process service)
            # imports it
            graphs[str(p)] = OnnxModel.from_file(p, onnx_options, **_embed_limits(limits)) if is_onnx(p) \
                else load_graph(p)
            if claims is not None:  # the gradients under test travel in the graph (graph.proto's Claims)
                graphs[str(p)] = with_claims(graphs[str(p)], claims)
        except OSError as exc:
            outcomes[str(p)] = Outcome(str(p), error=f"{p}: cannot read: {exc.strerror or exc}", invalid=True)
        except (GraphFileError, OnnxFileError) as exc:
            error = str(exc) if isinstance(exc, GraphFileError) else f"{p}: {exc}{_limit_hint(exc, limits)}"
            outcomes[str(p)] = Outcome(str(p), error=error, invalid=True)
    return graphs, outcomes


def _report(args, ordered: list, graphs: dict) -> int:
    """Print the outcomes, write the plots and the report files, say the counts: the highest exit code."""
    print_outcomes(ordered, args.format)
    if args.memory_plot:
        _write_plots(args, ordered)

    def html_items():  # the page's modules only when a page is asked for
        from gradcheck_core.outputs.html_report import RunItem

        return [RunItem(o.path, o.graph, o.report.data if o.report else None, o.error,
                        no_graph=NO_ONNX_DRAWING if isinstance(graphs.get(o.path), OnnxModel) else "")
                for o in ordered]
    write_reports(ordered, _write_file, junit=args.junit,
                  summary_md=args.summary_md, html=args.html, integrity=args.integrity or BY_NAME["integrity"].default,
                  html_items=html_items)
    code = max(o.exit_code for o in ordered)
    counts = {s: sum(o.status == s for o in ordered) for s in ("pass", "fail", "invalid", "error")}
    print("gradcheck: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n), file=sys.stderr)
    return code


def main(argv=None) -> int:
    from gradcheck_core.quiet_pipe import quiet_stdout

    quiet_stdout()  # `gradcheck verify G G G | head`: the verdict's exit code, no traceback (quiet_pipe.py)
    args = build_parser().parse_args(argv)
    try:
        return _verify(args)
    except UsageError as exc:
        print(f"gradcheck: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """The process's entry (`python -m gradcheck_client.cli`, the console script): main()'s exit code, the
    process ended without the interpreter's teardown (gradcheck_core/process_exit.py)."""
    code = main()
    from gradcheck_core.process_exit import exit_now

    exit_now(code)


if __name__ == "__main__":
    run()
