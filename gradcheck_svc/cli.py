"""gradcheck-svc: the service's command line.

Exit codes (a contract for CI scripts): 0 every gradient verified,
1 a gradient mismatch, 2 invalid input or usage, 3 internal error.
Errors are one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import signal
import sys

from gradcheck_core.onnx_options import add_onnx_flags
from gradcheck_core.options import CommandParser
from gradcheck_core.verify_args import add_verify_arguments

from . import __version__
from .errors import GradcheckError, TimeLimitError
from .in_process import verify_setup
from .limits import add_limit_flags
from .outcome import Internal, OverLimit, exit_code, outcome_of, report_of

EXIT_OK, EXIT_MISMATCH, EXIT_INVALID, EXIT_INTERNAL = 0, 1, 2, 3


VERIFY_EPILOG = """\
examples:
  gradcheck-svc verify examples/graphs/seed.json
  gradcheck-svc verify examples/graphs/seed.json --fault z:overwrite:999 --format json
  gradcheck-svc verify examples/graphs/ --html report.html --junit junit.xml

exit codes: 0 every gradient verified, 1 a gradient mismatch, 2 invalid input or usage,
3 internal error (several graphs: the highest); with --fd-shard-count or --fd-from (default
--max-request-seconds 3600): 0 the shard's file is written (a merge: as verify), 75 retry: over the
time limit, a shard file not written or not read, out of memory"""

SERVE_EPILOG = """\
examples:
  gradcheck-svc serve                      # 127.0.0.1:50051, one worker per CPU
  gradcheck-svc serve --host 0.0.0.0 --port 50051 --token-file token.txt --metrics-port 9090

exit codes: 0 stopped by SIGTERM/SIGINT after draining, 2 invalid usage, 3 internal error"""


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="gradcheck-svc", description="Verify the gradients of a computation graph.",
                      epilog="exit codes: 0 ok, 1 a gradient mismatch, 2 invalid input or usage, 3 internal error "
                             "(batch commands: see their help)")
    p.add_argument("--version", action="version", version=f"gradcheck-svc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    for add in (_add_verify, _add_plan_memory, _add_import_onnx, _add_serve, _add_audit_ops, _add_ops):
        add(sub)
    from .batch.cli import add_parsers  # batch, batch-merge, screen (their exit codes: batch/cli.py)

    add_parsers(sub)
    return p


def _add_verify(sub) -> None:
    """`verify`: the CI command's arguments (verify_args.py), the limits raised here, the fd shard flags."""
    v = sub.add_parser("verify", help="verify graphs (.json, .pb, ONNX .onnx, or directories of them) in this process",
                       description="Verify the gradients of graphs in this process: the engine against "
                                   "finite differences\nand the exact SymPy gradient; prints a report per graph.",
                       epilog=VERIFY_EPILOG, usage="%(prog)s [options] PATH [PATH ...]")
    add_verify_arguments(v, add_limits=lambda parser, hidden: add_limit_flags(
        parser, server=False, what="the same as the server's; raise them here", hidden=hidden))
    add_fd_shard_flags(v)


def _add_plan_memory(sub) -> None:
    """`plan-memory`."""
    m = sub.add_parser("plan-memory", help="plan a training step's memory from one metering forward or from shapes: "
                       "the whole formula, activations by node, checkpoints for a budget")
    m.add_argument("graph", metavar="FILE", help="graph file (.json, .pb) or an ONNX model (.onnx, imported as import-onnx does)")
    m.add_argument("--budget", type=int, default=None, metavar="BYTES",
                   help="plan checkpoints keeping the activations under BYTES (default: no plan)")
    m.add_argument("--shapes-only", action="store_true",
                   help="plan from the values' shapes alone, running nothing (default: only when the metering "
                        "forward's live peak would exceed --max-run-bytes)")
    m.add_argument("--max-run-bytes", type=int, default=None, metavar="BYTES",
                   help="the most memory the metering forward may hold (default: a quarter of physical memory)")
    m.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="engine precision (default: the graph's float dtype)")
    m.add_argument("--optimizer", choices=["none", "sgd", "momentum", "adam", "adamw"], default="none",
                   help="the optimizer whose state joins the training figure (default %(default)s)")
    m.add_argument("--optimizer-dtype", choices=["float16", "bfloat16", "float32", "float64"], default=None,
                   help="dtype of the optimizer's state (default: the engine's)")
    m.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    add_limit_flags(m, server=False, what="the same as the server's; raise them here")
    add_onnx_flags(m)


def _add_import_onnx(sub) -> None:
    """`import-onnx`."""
    i = sub.add_parser("import-onnx", help="convert an ONNX model to a gradcheck graph (.pb or .json)",
                       description="Convert an ONNX model to a gradcheck graph file.",
                       epilog="example:\n  gradcheck-svc import-onnx model.onnx -o model.pb\n\n"
                              "exit codes: 0 written, 2 invalid model or usage, 3 internal error")
    i.add_argument("model", metavar="FILE", help="ONNX model file (.onnx)")
    i.add_argument("-o", "--out", required=True, metavar="FILE", help="graph file to write: .pb or .json")
    add_onnx_flags(i)


def _add_serve(sub) -> None:
    """`serve`: network and security, workers, the server's limits."""
    s = sub.add_parser("serve", help="run the gRPC server (GradCheckService, health, reflection)",
                       description="Run the gRPC server: GradCheckService (Verify, VerifyStream, ListOps, "
                                   "GetServerInfo),\ngRPC health and reflection, optional Prometheus metrics.",
                       epilog=SERVE_EPILOG)
    net = s.add_argument_group("network and security")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    net.add_argument("--port", type=int, default=50051, metavar="N",
                     help="gRPC port (0: pick a free one; default 50051)")
    net.add_argument("--token-file", default=None, metavar="FILE",
                     help="require this bearer token (default: $GRADCHECK_TOKEN when set, else no auth)")
    net.add_argument("--tls-cert", default=None, metavar="FILE",
                     help="PEM certificate chain (enables TLS, with --tls-key; default: no TLS)")
    net.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key (default: no TLS)")
    net.add_argument("--metrics-port", type=int, default=None, metavar="N",
                     help="serve Prometheus metrics on this HTTP port (default: no metrics endpoint)")
    run = s.add_argument_group("workers")
    run.add_argument("--workers", type=int, default=None, metavar="N",
                     help="worker processes (default: the CPUs this process may use: affinity and cgroup quota)")
    run.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                     help="seconds in-flight requests get on SIGTERM (default %(default)s)")
    # an earlier spelling of --max-message-bytes, in MiB: still accepted, not shown
    s.add_argument("--max-message-mb", type=float, default=None, help=argparse.SUPPRESS)
    add_limit_flags(s, server=True, what="server")


def _add_audit_ops(sub) -> None:
    """`audit-ops`."""
    a = sub.add_parser("audit-ops", help="check every op's VJP against SymPy's derivative",
                       description="Check every op's VJP against SymPy's derivative at random points.",
                       epilog="example:\n  gradcheck-svc audit-ops --op tanh --op softmax\n\n"
                              "exit codes: 0 every rule agrees, 1 a rule disagrees, 2 usage, 3 internal error")
    a.add_argument("--op", action="append", default=[], metavar="NAME",
                   help="audit only this op (repeatable; default every op)")
    a.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed for the random test points (default %(default)s)")
    a.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")


def _add_ops(sub) -> None:
    """`ops`."""
    o = sub.add_parser("ops", help="list the registered ops (one line each), or describe one",
                       description="List the registered ops, one line each (name, NumPy name, inputs, doc); "
                                   "name one for its attributes, formula and kinks.",
                       epilog="examples:\n  gradcheck-svc ops\n  gradcheck-svc ops relu\n"
                              "  gradcheck-svc ops --long\n  gradcheck-svc ops --format json\n\n"
                              "exit codes: 0 ok, 2 unknown op or usage")
    o.add_argument("names", nargs="*", metavar="NAME", help="describe only these ops in full (default: list all)")
    o.add_argument("--op", action="append", default=[], metavar="NAME", dest="op",
                   help="the same as NAME (repeatable; default every op)")
    o.add_argument("--long", action="store_true",
                   help="every op in full: attributes, formula, kinks (default: one line each)")
    o.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")


def add_fd_shard_flags(parser) -> None:
    """One graph's finite differences over several processes (verify/fd_shards.py): CLI-only flags."""
    g = parser.add_argument_group("one graph's finite differences across processes (a Job's indices)")
    g.add_argument("--fd-shard-count", type=int, default=None, metavar="N",
                   help="compute only this shard's share of the per-parameter finite differences, write it to "
                        "--fd-out and print no report (default: all of them, and the report)")
    g.add_argument("--fd-shard-index", type=int, default=None, metavar="I",
                   help="this shard, 0..N-1 (default: $JOB_COMPLETION_INDEX, as an Indexed Job sets it)")
    g.add_argument("--fd-out", default=None, metavar="DIR",
                   help="directory (or s3://, gs://, az:// URL) the shard's file is written to (default none; "
                        "needed with --fd-shard-count)")
    g.add_argument("--fd-from", default=None, metavar="DIR",
                   help="verify with the finite differences of every shard in DIR (all N of them, made from this "
                        "graph with these options and this gradcheck): the report one process would print "
                        "(default: compute them here)")


# One large model's work, split or merged (a shard runs the engine and the joint screen as well as its share):
# minutes, where one `verify` request is bounded like the server's (120 s). --max-request-seconds sets it.
FD_REQUEST_SECONDS = 3600.0


def _fd_mode(args, single: bool):
    """None (verify in one process), or ("shard", index, count, out) / ("merge", src): the fd flags checked."""
    from .errors import OptionError

    if args.fd_shard_count is None and args.fd_from is None:
        for flag, value in (("--fd-shard-index", args.fd_shard_index), ("--fd-out", args.fd_out)):
            if value is not None:
                raise OptionError("needs --fd-shard-count", field=flag)
        return None
    from .store.location import location  # (a split's store: not for a plain verify)

    if not single:
        raise OptionError("splits one graph's finite differences: give one graph file", field="PATH")
    if args.fd_from is not None:
        if args.fd_shard_count is not None or args.fd_shard_index is not None or args.fd_out is not None:
            raise OptionError("merges shards: not with --fd-shard-count, --fd-shard-index or --fd-out",
                              field="--fd-from")
        return ("merge", location(args.fd_from, "--fd-from"))
    if args.fd_shard_count < 1:
        raise OptionError("must be at least 1", field="--fd-shard-count")
    if args.fd_out is None:
        raise OptionError("a shard needs --fd-out DIR to write to", field="--fd-shard-count")
    for flag, value in (("--html", args.html), ("--junit", args.junit), ("--summary-md", args.summary_md),
                        ("--memory-plot", args.memory_plot)):
        if value is not None:
            raise OptionError("a shard writes no report (the merge, --fd-from, does)", field=flag)
    from .batch.cli import completion_index

    index = completion_index(args.fd_shard_index, "--fd-shard-index")
    if not 0 <= index < args.fd_shard_count:
        raise OptionError(f"{index} is not in 0..{args.fd_shard_count - 1}", field="--fd-shard-index")
    return ("shard", index, args.fd_shard_count, location(args.fd_out, "--fd-out"))


def _verify(args) -> int:
    from pathlib import Path

    from .errors import OptionError

    single = len(args.paths) == 1 and not Path(args.paths[0]).is_dir()
    if single:  # one file: its report as it always was, an error exits 2
        paths = [args.paths[0]]
    else:
        from gradcheck_core.scan import graph_paths

        try:
            paths = graph_paths(args.paths, args.include, args.exclude, "gradcheck-svc")
        except FileNotFoundError as exc:
            raise OptionError(str(exc), field="PATH") from None
    _refuse_unused_onnx_flags(args, paths)
    from gradcheck_core.verify_args import output_over_input

    if output_over_input(args, paths):
        raise OptionError(output_over_input(args, paths))
    fd_mode = _fd_mode(args, single)
    if fd_mode is not None and args.max_request_seconds is None:
        args.max_request_seconds = FD_REQUEST_SECONDS
    limits, values, options, _ = verify_setup(args)
    claims = _claims(args, paths, limits)
    if fd_mode is None:
        return _verify_paths(args, paths, single, limits, values, options, claims)
    from .batch.cli import EXIT_RETRY  # what an Indexed Job's podFailurePolicy counts and retries
    from .bounded import WorkerDied

    label = f"fd shard {fd_mode[1]}/{fd_mode[2]}" if fd_mode[0] == "shard" else "fd merge"
    try:
        if fd_mode[0] == "shard":
            return _fd_shard(paths[0], args, limits, values, options, fd_mode, claims)
        return _verify_paths(args, paths, True, limits, values, options, claims, fd_mode)
    except (TimeLimitError, OSError, MemoryError, WorkerDied) as exc:
        what, detail = _retry_reason(exc)
        print(f"gradcheck-svc: {label}: {what}, retry (exit {EXIT_RETRY})" + (f": {detail}" if detail else ""),
              file=sys.stderr)
        return EXIT_RETRY


def _refuse_unused_onnx_flags(args, paths) -> None:
    """OptionError for an ONNX import flag given with no ONNX model among the paths (it would be ignored)."""
    from gradcheck_core.onnx_options import OnnxFlagError, refuse_unused_onnx_flags

    from .errors import OptionError

    try:
        refuse_unused_onnx_flags(args, paths)
    except OnnxFlagError as exc:
        raise OptionError(str(exc)) from None


def _retry_reason(exc: BaseException) -> tuple[str, str | None]:
    """Why a finite-difference shard or merge exits 75, and the detail: a time-out (a slow or crowded node;
    the detail names the limit and its flag), a volume or store that failed, out of memory, a child killed
    from outside. A graph, a flag or a shard set no retry can fix stays exit 2."""
    if isinstance(exc, TimeLimitError):
        return "over the time limit", exc.message
    if isinstance(exc, OSError):
        return "infrastructure failure", f"{exc.filename or ''}: {exc.strerror or exc}"
    if isinstance(exc, MemoryError):
        return "out of memory", None
    return "infrastructure failure", str(exc)


def _fd_shard(path: str, args, limits, values, options, fd_mode, claims) -> int:
    """One shard's differences written to --fd-out (the merge prints the report): exit 0."""
    from .text import clip

    _, summary = _verify_one(path, args, limits, values, options, several=False, fd_mode=fd_mode, claims=claims)
    names = ", ".join(summary["parameters"]) or "none"
    rows = "".join(f", {m} of the joint screen's {k} directions" if i == 0 else f" (and {m} of {k} in its second pass)"
                   for i, (m, k) in enumerate(summary["screen_rows"]))
    print(f"fd shard {fd_mode[1]}/{fd_mode[2]}: {len(summary['parameters'])} of the "
          f"{summary['checked_on_own']} parameters checked on their own ({clip(names, 2000)}){rows} -> {summary['file']}")
    return EXIT_OK


def _verify_paths(args, paths: list, single: bool, limits, values, options, claims, fd_mode=None) -> int:
    """Verify each graph, print the report(s), write the outputs: the highest exit code."""
    from contextlib import nullcontext

    from gradcheck_core.terminate import sigterm_interrupts

    runs = []  # (path, message, report, error)
    try:
        with nullcontext() if single else sigterm_interrupts():  # one graph (an fd shard or merge): killed by it
            for path in paths:
                try:
                    message, report = _verify_one(path, args, limits, values, options, several=not single,
                                                  fd_mode=fd_mode, claims=claims)
                    runs.append((path, message, report, ""))
                except GradcheckError as exc:
                    if single:
                        raise
                    runs.append((path, None, None, exc.message))
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the graphs verified so far are printed, not lost
        if single:
            raise
        from gradcheck_core.outputs.outcome import print_interrupted

        return print_interrupted("gradcheck-svc", outcomes_of(runs), len(paths), args.format, exc)
    if single:
        from .text import lines

        path, message, report, _ = runs[0]
        print(report.to_json() if args.format == "json" else lines(report.to_text()))
    else:
        from gradcheck_core.outputs.outcome import print_outcomes

        print_outcomes(outcomes_of(runs), args.format)  # as `gradcheck verify` prints several graphs
    _write_outputs(args, runs, options.integrity)
    codes = [EXIT_INVALID if report is None else EXIT_OK if report.passed else EXIT_MISMATCH
             for _, _, report, _ in runs]
    return max(codes)


def _claims(args, paths: list, limits):
    """--claimed: the claims (gradcheck_core/claims.py, as the CI command reads them, within the request
    limits before anything is inflated), or None."""
    if args.claimed is None:  # (the archive reader, zipfile with it, is imported for the flag only)
        return None
    from gradcheck_core.claims import ClaimsFileError, claimed_flag

    from .errors import OptionError

    try:
        return claimed_flag(args.claimed, paths, limits)
    except ClaimsFileError as exc:
        raise OptionError(str(exc), field="--claimed") from None


def _verify_one(path: str, args, limits, values, options, several: bool, fd_mode=None, claims=None):
    """Decode, validate and verify one graph file (carrying `claims`, graph.proto's Claims, when given:
    then they are what is verified); write its memory plot. Returns (message, report); a
    finite-difference shard (fd_mode, _fd_mode's) returns (message, its summary) instead."""
    from gradcheck_core.onnx_options import is_onnx
    from gradcheck_core.options import plot_path

    from .errors import OptionError
    from .shell import run_bounded

    # the server's limits, the same way: the request's size (a file the server's transport would not even
    # take is refused unread), then the whole request within max_request_seconds, in a child process
    # that is killed at the limit (bounded.py), as the server's worker is
    check_file_size(path, limits.max_message_bytes)
    from .request import preload

    preload(options.symbolic.enabled, 2 if several else 1)  # the children start warm (request.preload)
    from gradcheck_core.outputs.guard import wanted

    keep = several or wanted(args.junit, args.summary_md, args.html)  # the outputs read the graph message
    printed = args.format if not keep and fd_mode is None and args.memory_plot is None else None
    result = run_bounded(limits.max_request_seconds, "max_request_seconds", _in_child, keep, printed, path, args,
                         limits, values, options, fd_mode, claims, limit_hint=is_onnx(path))
    message, report = report_of(result)  # this command's flow: an error ends one graph (main: outcome.CHANNELS)
    if fd_mode is not None and fd_mode[0] == "shard":
        return message, report
    if args.memory_plot is not None:
        from .verify.memory_profile import write_memory_plot  # (its SVG writer: only for a plot)

        plot = plot_path(args.memory_plot, path, several)
        try:
            write_memory_plot(plot, report.to_dict())
        except OSError as exc:
            raise OptionError(f"'{plot}': cannot write: {exc.strerror or exc}", field="memory-plot") from None
    return message, report


def _in_child(keep_message: bool, printed: str | None, *args):
    """_decode_and_verify in the bounded child: the graph message goes back only when `keep_message` (an
    output draws it, or several graphs are listed), not pickled across for nothing (2 MB for chain_256);
    where the parent only prints the report in format `printed`, its text goes back instead (_Printed)."""
    message, result = _decode_and_verify(*args)
    return message if keep_message else None, result if printed is None else _Printed(result, printed)


class _Printed:
    """What the parent keeps of a report it only prints (one graph, no other output): the verdict and the
    report's text in the asked format, written in the child. A string crosses the pipe as one copy; the
    Report itself was pickled and unpickled object by object (~25 ms for chain_256's)."""

    def __init__(self, report, fmt: str):
        self.passed = report.passed
        self.text = report.to_json() if fmt == "json" else report.to_text()

    def to_json(self) -> str:
        return self.text

    def to_text(self) -> str:
        return self.text


def _decode_and_verify(path: str, args, limits, values, options, fd_mode, claims=None):
    """_verify_one's work under the time limit: (message, report), or (message, shard summary), through the
    one request pipeline (request.py), given the request the CI command would send; `claims`
    (graph.proto's Claims) travel in the message, as they do to a server."""
    from gradcheck_core.onnx_options import is_onnx
    from gradcheck_core.request_message import make_request

    from .errors import LimitError
    from .graph.decode import parse_graph
    from .limits import check_request_size
    from .request import prepare
    from .shell import verify_request

    imported, seen = None, []  # seen: the decoded message's bytes, where the split's kept graph had them
    if is_onnx(path):  # the request is the model's bytes, measured before it is imported
        from .onnx_import.folding import FoldBudget

        model = _onnx_model(path, args, limits)
        if claims is not None:  # keyed by initializer or torch names: request.py maps them once imported
            from gradcheck_core.claims import with_claims

            model = with_claims(model, claims)
        request = make_request(model, "", **values)
        try:
            check_request_size(request.ByteSize(), limits.max_message_bytes, hint=True)
        except LimitError as exc:  # one round, not two: the element limit it would meet next, if over too
            raise LimitError(exc.reason + _weights_over(model.data, limits.max_elements), field=exc.field,
                             limit=exc.limit) from None
        # imported here from the bytes a client sends (external data embedded), decoded once: the HTML
        # report draws the same message that was verified; a split's processes import it once (fd_graph.py)
        budget = FoldBudget.from_limits(limits)
        key = None if fd_mode is None else _onnx_key(path, args, model, budget)
        imported = message = _split_decoded(fd_mode, key, lambda: _onnx_graph(path, args, budget, model.data), seen)
    else:
        key = None if fd_mode is None else _file_key(path)
        message = _split_decoded(fd_mode, key, lambda: parse_graph(path), seen)
        if claims is not None:
            from gradcheck_core.claims import with_claims

            message, seen = with_claims(message, claims), []
        request = make_request(message, "", **values)
    # a model's request was measured above, before its import: once per request
    ask = dict(options=options, message=imported, hint=True, size_checked=imported is not None)
    if fd_mode is None:
        return message, verify_request(request, limits, **ask)
    from .store.records import bytes_sha256
    from .verify import fd_shards

    content = bytes_sha256(seen[0] if seen else message.SerializeToString(deterministic=True))
    if fd_mode[0] == "shard":
        graph, options = prepare(request, limits, **ask)
        return message, fd_shards.run_shard(graph, options, content, *fd_mode[1:])

    # read once the graph validated: a bad graph is named before its shards are
    return message, verify_request(request, limits, **ask,
                                   fd_source=fd_shards.ShardSource(fd_mode[1], content, options))


def _file_key(path: str) -> str | None:
    """A graph file's decode key (verify/fd_graph.py); None where it cannot be read (the decoder says why)."""
    from pathlib import Path

    from .verify.fd_graph import graph_key

    try:
        return graph_key(Path(path).read_bytes(), b"graph file")
    except OSError:
        return None


def _onnx_key(path: str, args, model, budget) -> str | None:
    """An ONNX import's key (verify/fd_graph.py): the model's bytes (external data embedded), the import flags,
    the folding budget, the name and --allow-nonfinite. None (imported every time) for a model not read here
    (the importer says why) or with --input / --cotangent files, whose external data is read beside them."""
    from pathlib import Path

    from .verify.fd_graph import graph_key

    if not model.data or model.options is None or args.onnx_inputs or args.onnx_cotangent:
        return None
    return graph_key(model.data, model.options.SerializeToString(deterministic=True),
                     repr((budget, Path(path).stem, bool(getattr(args, "allow_nonfinite", False)))).encode())


def _split_decoded(fd_mode, key, decode, seen: list | None = None):
    """decode()'s graph message; in an FD split, decoded once and kept beside the shards (verify/fd_graph.py;
    seen: its bytes, where that had them)."""
    if fd_mode is None:
        return decode()
    from gradcheck.v1 import graph_pb2

    from .verify.fd_graph import decoded

    # one shard writes it, the last (shard 0 makes the memory profile's runs, the slowest share: it pays no
    # serialization on top); the others read it where they find it written, as a retry does
    return decoded(fd_mode[3] if fd_mode[0] == "shard" else fd_mode[1], key, graph_pb2.Graph, decode,
                   write=fd_mode[0] == "shard" and fd_mode[1] == fd_mode[2] - 1, seen=seen)


def outcomes_of(runs) -> list:
    """The client's Outcomes of (path, message, report, error) runs: what the output writers shared with
    `gradcheck verify` read (the report's JSON dict itself, no proto round trip)."""
    from gradcheck_core.outputs.outcome import Outcome
    from gradcheck_core.report import Report

    return [Outcome(path, report=Report(report.to_dict(), id=path, text=report.to_text()), graph=message)
            if report is not None else Outcome(path, error=error, invalid=True)
            for path, message, report, error in runs]


def _write_outputs(args, runs, integrity: str) -> None:
    """--html, --junit, --summary-md (and $GITHUB_STEP_SUMMARY): the CI command's writers, for the same files."""
    from gradcheck_core.outputs.guard import wanted, write_reports

    from .errors import OptionError

    if not wanted(args.junit, args.summary_md, args.html):  # no report built again for nothing
        return
    from gradcheck_core.outputs.html_report import RunItem

    def save(path: str, text: str, flag: str) -> None:
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise OptionError(f"'{path}': cannot write: {exc.strerror or exc}",
                              field="html" if flag == "--html" else flag) from None

    # the page reads the JSON report's figures, and draws the graph message that was verified
    items = lambda: [RunItem(graph_path, message, report.to_dict()) if report is not None  # noqa: E731
                     else RunItem(graph_path, error=error) for graph_path, message, report, error in runs]
    title = f"gradcheck: {runs[0][2].graph or runs[0][0]}" if len(runs) == 1 and runs[0][2] else "gradcheck report"
    write_reports(outcomes_of(runs), save, junit=args.junit, summary_md=args.summary_md, html=args.html,
                  html_items=items, integrity=integrity, title=title)


def _weights_over(data: bytes, max_elements: int) -> str:
    """'; its initializers alone hold N elements, over ... too (raise it with --max-elements)' for a model
    whose weights alone are over the element limit (so a request over the byte limit says both), else ''."""
    from math import prod

    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # DecodeError: the importer would say what is wrong; the size is the news here
        return ""
    n = sum(prod(t.dims) for t in model.graph.initializer)
    if n <= max_elements:
        return ""
    return f"; its initializers alone hold {n} elements, over the limit of {max_elements} too (raise it with --max-elements)"


def _onnx_model(path: str, args, limits):
    """The model as the CI command sends it (bytes, external data embedded, and import options), to
    measure the request; its data files are refused, unread, over `limits`."""
    from gradcheck_core.onnx_files import OnnxFileError
    from gradcheck_core.onnx_options import OnnxFlagError, OnnxModel, onnx_import_message

    from .errors import OptionError
    from .onnx_import.tensors import file_error

    try:
        return OnnxModel.from_file(path, onnx_import_message(args), max_elements=limits.max_elements,
                                   max_bytes=limits.max_message_bytes)
    except OnnxFlagError as exc:
        raise OptionError(str(exc)) from None
    except OnnxFileError as exc:
        raise file_error(exc, path) from None
    except OSError:
        return OnnxModel(b"", None)  # the importer says what is wrong with the path


def _onnx_graph(path: str, args, budget, data: bytes = b""):
    """An ONNX model imported with the flags' options, through the same mapping the server uses: from
    `data`, the model's bytes with its external data embedded, if given, else from `path`. External
    data is read only from beside the files the user named (the model, --input and --cotangent
    files); `budget` bounds import-time folding (onnx_import/folding.py)."""
    from pathlib import Path

    from gradcheck_core.onnx_options import OnnxFlagError, onnx_import_message

    from .errors import OptionError
    from .onnx_import import embed_beside, import_onnx, options_from_proto

    try:
        message = onnx_import_message(args)
    except OnnxFlagError as exc:
        raise OptionError(str(exc)) from None
    for item in args.onnx_inputs or ():
        name, _, file = item.partition("=")
        message.inputs[name] = embed_beside(message.inputs[name], Path(file).parent, f"--input {name}",
                                            budget.max_elements)
    if args.onnx_cotangent:
        message.cotangent = embed_beside(message.cotangent, Path(args.onnx_cotangent).parent, "--cotangent",
                                         budget.max_elements)
    return import_onnx(data or path, options_from_proto(message, bool(getattr(args, "allow_nonfinite", False))),
                       name=Path(path).stem, budget=budget, where=path)


def _plan_memory(args) -> int:
    import json

    from .bounded import bounded_call
    from .limits import ServerLimits, limit_flag_values
    from .verify.memory_plan import plan_text

    limits = ServerLimits.from_flags(limit_flag_values(args))
    if args.budget is not None and args.budget < 1:
        from .errors import OptionError

        raise OptionError(f"{args.budget}: the budget must be a positive number of bytes", field="--budget")
    if args.max_run_bytes is not None and args.max_run_bytes < 0:
        from .errors import OptionError

        raise OptionError(f"{args.max_run_bytes}: must be a number of bytes", field="--max-run-bytes")
    _refuse_unused_onnx_flags(args, [args.graph])
    check_file_size(args.graph, limits.max_message_bytes)
    # within --max-request-seconds like a verification: a child killed at the limit (bounded.py)
    plan = bounded_call(limits.max_request_seconds, "max_request_seconds", _plan_graph, args, limits)
    from .text import lines

    print(json.dumps(plan, indent=2) if args.format == "json" else lines(plan_text(plan)))
    return EXIT_OK


def _plan_graph(args, limits) -> dict:
    """plan-memory's work under the time limit: the graph file decoded, validated and planned."""
    from gradcheck_core.onnx_options import is_onnx

    from .graph import load_graph
    from .graph.decode import parse_graph
    from .onnx_import.folding import FoldBudget
    from .verify.memory_plan import plan_memory

    message = (_onnx_graph(args.graph, args, FoldBudget.from_limits(limits)) if is_onnx(args.graph)
               else parse_graph(args.graph))
    graph = load_graph(message, limits=limits.graph)
    return plan_memory(graph, dtype=args.dtype, optimizer=args.optimizer, optimizer_dtype=args.optimizer_dtype,
                       budget=args.budget, shapes_only=args.shapes_only, max_run_bytes=args.max_run_bytes)


def _import_onnx(args) -> int:
    from pathlib import Path

    from gradcheck_core.graphio import save_graph

    from .errors import OptionError
    from .graph import load_graph
    from .graph.validate import Limits

    out = Path(args.out)
    if out.suffix not in (".pb", ".json"):
        raise OptionError(f"'{args.out}': the graph file must end in .pb or .json", field="-o")
    from .onnx_import.folding import FoldBudget

    check_regular_file(args.model)
    message = _onnx_graph(args.model, args, FoldBudget(max_elements=Limits().max_elements))
    # the importer's output must validate (a conversion: a model without trainable weights is still one)
    graph = load_graph(message, limits=Limits(), require_parameters=False)
    try:
        save_graph(message, out)
    except OSError as exc:
        raise OptionError(f"'{args.out}': cannot write: {exc.strerror or exc}", field="-o") from None
    params = sum(graph.inputs[p].value.size for p in graph.parameters)
    print(f"gradcheck-svc: {args.model}: {len(graph.nodes)} nodes, {len(graph.parameters)} parameters "
          f"({params} elements) -> {out}", file=sys.stderr)
    return EXIT_OK


def check_regular_file(path: str):
    """The file's os.stat, None where it cannot be stat'ed (the loader says why), OptionError where it is not a
    regular file: a FIFO would block its reader for ever, a device never end."""
    import os
    import stat

    from .errors import OptionError

    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise OptionError(f"'{path}' is not a regular file: give a graph file (.json, .pb or .onnx)", field="PATH")
    return st


def check_file_size(path: str, limit: int) -> None:
    """A file so far over max_message_bytes that the server's transport would refuse it (it admits twice
    the limit, so that the servicer answers the rest exactly): refused before it is read."""
    from .errors import LimitError

    st = check_regular_file(path)
    if st is None:
        return  # the loader says what is wrong with the path
    size = st.st_size
    if size > 2 * limit + 2**20:
        raise LimitError(f"graph file is {size} bytes, far over the limit of {limit} (raise it with "
                         "--max-message-bytes)", field="graph")


def _ops(args) -> int:
    """One line per op (fast: no SymPy); named ops, --long or JSON in full (with formulas)."""
    import json

    from .errors import OptionError
    from .ops import all_ops
    from .ops.describe import describe, describe_lines, describe_text, structural_footer

    ops = all_ops()
    wanted = [*args.names, *args.op]
    if wanted:
        by_name = {op.name: op for op in ops}
        for name in wanted:
            if name not in by_name:
                import difflib

                close = difflib.get_close_matches(name, by_name, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else " (gradcheck-svc ops lists them)"
                raise OptionError(f"unknown op '{name}'{hint}", field="NAME")
        ops = [by_name[name] for name in dict.fromkeys(wanted)]
    full = bool(wanted) or args.long or args.format == "json"
    rows = [describe(op, formula=full) for op in ops]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif not full:
        print("\n".join(describe_lines(rows)))
    elif wanted:
        print("\n".join(line for r in rows for line in describe_text(r)))
    else:  # every op in full: the structural ones named once at the end
        print("\n".join([*(line for r in rows for line in describe_text(r, structural_note=False)),
                         *structural_footer(rows)]))
    return EXIT_OK


def _serve(args) -> int:
    import dataclasses
    from pathlib import Path

    from gradcheck_core.options import MAX_SECONDS

    from .errors import OptionError
    from .limits import ServerLimits, limit_flag_values
    from .config import ServerConfig, read_token

    flags = limit_flag_values(args)
    if args.max_message_mb is not None:
        if not args.max_message_mb > 0:  # NaN too
            raise OptionError("must be positive", field="--max-message-mb")
        flags["max_message_bytes"] = flags["max_message_bytes"] or int(args.max_message_mb * 2**20)
    limits = ServerLimits.from_flags(flags)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise OptionError("give both --tls-cert and --tls-key", field="--tls-cert")
    for path in (args.tls_cert, args.tls_key):
        if path is not None and not Path(path).is_file():
            raise OptionError(f"no such file: {path}", field="--tls-cert")
    if args.workers is not None and args.workers < 1:
        raise OptionError("needs at least 1 worker", field="--workers")
    if not 0 <= args.grace <= MAX_SECONDS:  # NaN too: the shutdown's wait would fail or not wait at all
        raise OptionError(f"{args.grace} is not a number of seconds from 0 to {MAX_SECONDS}", field="--grace")
    for flag in ("port", "metrics_port"):
        port = getattr(args, flag)
        if port is not None and not 0 <= port <= 65535:
            raise OptionError(f"{port} is not a port number (0-65535)", field="--" + flag.replace("_", "-"))
    config = ServerConfig(
        host=args.host, port=args.port, limits=limits, token=read_token(args.token_file),
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        metrics_port=args.metrics_port, grace_seconds=args.grace,
        **({"workers": args.workers} if args.workers else {}))
    from .server.main import run

    return run(config)


def _audit_ops(args) -> int:
    import json

    from .verify.audit import audit_ops, format_table

    rows = audit_ops(args.op or None, seed=args.seed)
    if args.format == "json":
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        print(format_table(rows))
    return EXIT_OK if all(r.passed for r in rows) else EXIT_MISMATCH


# commands that print their result and end: `gradcheck-svc verify g.json | head` ends quietly, like other
# tools. Every other command (serve, batch, batch-merge, screen) runs long, holds sockets, pipes and
# workers, and writes files: a write to a closed socket or pipe is an error there (answered, logged),
# never the process's death -- a metrics scraper that hangs up, or a worker replaced after the
# multiprocessing resource tracker died, must not kill the server
PIPE_ENDS_QUIETLY = frozenset({"ops", "audit-ops", "plan-memory", "import-onnx"})
# `gradcheck-svc verify G G G | head` (as `gradcheck verify`): quietly too, but with the verdict's exit code and
# its report files written -- SIGPIPE's default would end it as killed (gradcheck_core/quiet_pipe.py)
PIPE_KEEPS_VERDICT = frozenset({"verify"})


def _sigpipe(command: str | None) -> None:
    if command in PIPE_KEEPS_VERDICT:
        from gradcheck_core.quiet_pipe import quiet_stdout

        quiet_stdout()
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL if command is None or command in PIPE_ENDS_QUIETLY
                      else signal.SIG_IGN)


def main(argv=None) -> int:
    _sigpipe(None)  # `--help | head` too
    args = build_parser().parse_args(argv)
    _sigpipe(args.command)
    try:
        from .batch.cli import COMMANDS as BATCH_COMMANDS

        commands = {"verify": _verify, "ops": _ops, "serve": _serve, "audit-ops": _audit_ops,
                    "import-onnx": _import_onnx, "plan-memory": _plan_memory, **BATCH_COMMANDS}
        return commands[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the exit code by outcome.CHANNELS; one line on stderr, never a traceback
        return _failed(outcome_of(exc))


def _failed(outcome) -> int:
    """A Refused, OverLimit or Internal outcome: its line on stderr, its exit code (outcome.CHANNELS)."""
    if isinstance(outcome, Internal):  # an internal fault: one line, no traceback
        print(f"gradcheck-svc: internal error: {outcome.type_name}: {outcome.error} (please report this)",
              file=sys.stderr)
    elif isinstance(outcome, OverLimit) and outcome.which == "memory":  # the user's to shrink, not a fault
        print("gradcheck-svc: error: out of memory: the input needs more memory than this machine has",
              file=sys.stderr)
    else:
        print(f"gradcheck-svc: error: {outcome.message}", file=sys.stderr)
    return exit_code(outcome)


def run() -> None:
    """The process's entry (`python -m gradcheck_svc.cli`, the console script): main()'s exit code, the process
    ended without the interpreter's teardown (gradcheck_core/process_exit.py). main() itself returns, for
    callers in a process that goes on."""
    code = main()
    from gradcheck_core.process_exit import exit_now

    exit_now(code)


if __name__ == "__main__":
    run()
