"""gradcheck-svc: the service's command line.

Exit codes (a contract for CI scripts): 0 every gradient verified,
1 a gradient mismatch, 2 invalid input or usage, 3 internal error.
Errors are one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import signal
import sys

from . import __version__
from .errors import GradcheckError
from gradcheck_client.onnx_options import add_onnx_flags
from gradcheck_client.options import add_option_flags

from .limits import add_limit_flags

EXIT_OK, EXIT_MISMATCH, EXIT_INVALID, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors: one line, exit 2
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message}\n")


def _symbolic():
    """The symbolic oracle's default budgets (shown in the flags' help)."""
    from .verify.options import VerifyOptions

    return VerifyOptions().symbolic


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gradcheck-svc", description="Verify the gradients of a computation graph.")
    p.add_argument("--version", action="version", version=f"gradcheck-svc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    v = sub.add_parser("verify", help="verify one graph (.json, .pb, or an ONNX model .onnx) and print a report")
    v.add_argument("graph", help="graph file: .json (protobuf JSON) or .pb (binary protobuf), or an ONNX "
                                 "model (.onnx, imported as import-onnx does)")
    v.add_argument("--format", choices=["text", "json"], default="text", help="report format (default text)")
    add_option_flags(v)
    v.add_argument("--memory-plot", default=None, metavar="FILE",
                   help="write live bytes per forward/backward step, with and without checkpointing "
                        "(.svg, or .png with matplotlib; default none)")
    v.add_argument("--html", default=None, metavar="FILE",
                   help="write a self-contained HTML report: the graph with its findings, error heatmaps, "
                        "the memory timeline (default none)")

    v.add_argument("--symbolic-max-partials", type=int, default=None, metavar="N",
                   help=f"symbolic oracle budget: non-zero local partial derivatives (default {_symbolic().max_edges})")
    v.add_argument("--symbolic-timeout", type=float, default=_symbolic().timeout_s, metavar="SECONDS",
                   help="symbolic oracle wall-clock budget (default %(default)s)")
    v.add_argument("--simplify-timeout", type=float, default=_symbolic().simplify_timeout_s, metavar="SECONDS",
                   help="time to prove a user derivative (expr op) equal to SymPy's (default %(default)s)")
    add_limit_flags(v, server=False, what="the same as the server's; raise them here")
    add_onnx_flags(v)

    m = sub.add_parser("plan-memory", help="plan a training step's memory from one metering forward (no backward): "
                       "the whole formula, activations by node, checkpoints for a budget")
    m.add_argument("graph", help="graph file (.json, .pb) or an ONNX model (.onnx, imported as import-onnx does)")
    m.add_argument("--budget", type=int, default=None, metavar="BYTES",
                   help="plan checkpoints keeping the activations under BYTES (chains; default: no plan)")
    m.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="engine precision (default: the graph's float dtype)")
    m.add_argument("--optimizer", choices=["none", "sgd", "momentum", "adam", "adamw"], default="none",
                   help="the optimizer whose state joins the training figure (default %(default)s)")
    m.add_argument("--optimizer-dtype", choices=["float16", "bfloat16", "float32", "float64"], default=None,
                   help="dtype of the optimizer's state (default: the engine's)")
    m.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    add_limit_flags(m, server=False, what="the same as the server's; raise them here")
    add_onnx_flags(m)

    i = sub.add_parser("import-onnx", help="convert an ONNX model to a gradcheck graph (.pb or .json)")
    i.add_argument("model", help="ONNX model file (.onnx)")
    i.add_argument("-o", "--out", required=True, metavar="GRAPH", help="graph file to write: .pb or .json")
    add_onnx_flags(i)

    s = sub.add_parser("serve", help="run the gRPC server (GradCheckService, health, reflection)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=50051, help="gRPC port (0: pick a free one; default 50051)")
    s.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: the CPUs this process may use: affinity and cgroup quota)")
    s.add_argument("--max-message-mb", type=float, default=None,
                   help="the same as --max-message-bytes, in MiB (default: that flag's default)")
    s.add_argument("--token-file", default=None, help="require this bearer token (default: $GRADCHECK_TOKEN "
                   "when set, else no auth)")
    s.add_argument("--tls-cert", default=None, help="PEM certificate chain (enables TLS, with --tls-key; "
                   "default: no TLS)")
    s.add_argument("--tls-key", default=None, help="PEM private key (default: no TLS)")
    s.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this HTTP port "
                   "(default: no metrics endpoint)")
    s.add_argument("--grace", type=float, default=30.0,
                   help="seconds in-flight requests get on SIGTERM (default %(default)s)")
    add_limit_flags(s, server=True, what="server")

    a = sub.add_parser("audit-ops", help="check every op's VJP against SymPy's derivative")
    a.add_argument("--op", action="append", default=[], metavar="NAME",
                   help="audit only this op (repeatable; default every op)")
    a.add_argument("--seed", type=int, default=0, help="seed for the random test points (default %(default)s)")
    a.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")

    o = sub.add_parser("ops", help="list the registered ops: attributes with defaults, formula, kinks, doc")
    o.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")

    from .batch.cli import add_parsers  # batch, batch-merge, screen (their exit codes: batch/cli.py)

    add_parsers(sub)
    return p


def _verify(args) -> int:
    import dataclasses

    from gradcheck_client.client import make_request
    from gradcheck_client.onnx_options import is_onnx
    from gradcheck_client.options import flag_of, values_from_args

    from .errors import LimitError, OptionError
    from .graph import load_graph
    from .graph.decode import parse_graph
    from .limits import ServerLimits, check_request_size, limit_flag_values, request_time_limit
    from .onnx_import.folding import FoldBudget
    from .server.execute import verify_options
    from .verify import verify
    from .verify.memory_profile import write_memory_plot

    limits = ServerLimits.from_flags(limit_flag_values(args))
    values = values_from_args(args)
    options = verify_options(values, limits, field=flag_of, hint=True)  # the server's own mapping
    # what only the in-process command has: the symbolic oracle's other budgets, the memory plot
    for flag in ("symbolic_max_partials", "symbolic_timeout", "simplify_timeout"):
        if getattr(args, flag) is not None and not getattr(args, flag) > 0:  # NaN too
            raise OptionError("must be positive", field="--" + flag.replace("_", "-"))
    options.symbolic = dataclasses.replace(
        options.symbolic, timeout_s=args.symbolic_timeout, simplify_timeout_s=args.simplify_timeout,
        **({"max_edges": args.symbolic_max_partials} if args.symbolic_max_partials is not None else {}))
    options.memory_timeline = options.memory_timeline or args.memory_plot is not None or args.html is not None
    if args.memory_plot is not None and not args.memory_plot.lower().endswith((".svg", ".png")):
        raise OptionError(f"'{args.memory_plot}': the plot file must end in .svg or .png", field="memory-plot")
    if options.symbolic.max_edges > limits.max_symbolic_partials:
        raise LimitError(f"{options.symbolic.max_edges} is over the limit of {limits.max_symbolic_partials} "
                         "(raise it with --max-symbolic-partials)", field="--symbolic-max-partials")
    # the server's limits, the same way: the request's size (a file the server's transport would not even
    # take is refused unread), then the whole request within max_request_seconds
    check_file_size(args.graph, limits.max_message_bytes)
    with request_time_limit(limits.max_request_seconds):
        if is_onnx(args.graph):  # the request is the model's bytes, checked before it is imported
            check_request_size(make_request(_onnx_model(args), "", **values).ByteSize(), limits.max_message_bytes,
                               hint=True)
            # decoded once: the HTML report draws what was verified
            message = _onnx_graph(args.graph, args, FoldBudget.from_limits(limits))
        else:
            message = parse_graph(args.graph)
            check_request_size(make_request(message, "", **values).ByteSize(), limits.max_message_bytes, hint=True)
        graph = load_graph(message, limits=limits.graph, allow_nonfinite=bool(values.get("allow_nonfinite")))
        report = verify(graph, options)
    if args.memory_plot is not None:
        try:
            write_memory_plot(args.memory_plot, report.timelines, report.memory, graph.name)
        except OSError as exc:
            raise OptionError(f"'{args.memory_plot}': cannot write: {exc.strerror or exc}",
                              field="memory-plot") from None
    if args.html is not None:
        write_html_report(args.html, args.graph, message, report, options.integrity)
    print(report.to_json() if args.format == "json" else report.to_text())
    return EXIT_OK if report.passed else EXIT_MISMATCH


def write_html_report(path: str, graph_path: str, message, report, integrity: str) -> None:
    """The HTML page of one verification of the Graph `message` (gradcheck_client/outputs/html_report.py
    draws it, as for the CI command)."""
    from gradcheck_client.outputs.html_report import RunItem, build_html

    from .errors import OptionError

    item = RunItem(graph_path, message, report.to_dict())  # the page reads the JSON report's figures
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(build_html([item], title=f"gradcheck: {report.graph or graph_path}", integrity=integrity))
    except OSError as exc:
        raise OptionError(f"'{path}': cannot write: {exc.strerror or exc}", field="html") from None


def _onnx_model(args):
    """The model as the CI command sends it (bytes and import options), to measure the request."""
    from pathlib import Path

    from gradcheck_client.onnx_options import OnnxFlagError, OnnxModel, onnx_import_message

    from .errors import OptionError

    try:
        return OnnxModel(Path(args.graph).read_bytes(), onnx_import_message(args))
    except OnnxFlagError as exc:
        raise OptionError(str(exc)) from None
    except OSError:
        return OnnxModel(b"", None)  # the importer says what is wrong with the path


def _onnx_graph(path: str, args, budget):
    """An ONNX model imported with the flags' options, through the same mapping the server uses.
    External data is read only from beside the files the user named (the model, --input and
    --cotangent files); `budget` bounds import-time folding (onnx_import/folding.py)."""
    from pathlib import Path

    from gradcheck_client.onnx_options import OnnxFlagError, onnx_import_message

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
    return import_onnx(path, options_from_proto(message), budget=budget)


def _plan_memory(args) -> int:
    import json

    from gradcheck_client.onnx_options import is_onnx

    from .graph import load_graph
    from .graph.decode import parse_graph
    from .limits import ServerLimits, limit_flag_values
    from .verify.memory_plan import plan_memory, plan_text

    limits = ServerLimits.from_flags(limit_flag_values(args))
    if args.budget is not None and args.budget < 1:
        from .errors import OptionError

        raise OptionError(f"{args.budget}: the budget must be a positive number of bytes", field="--budget")
    check_file_size(args.graph, limits.max_message_bytes)
    message = _onnx_graph(args.graph, args) if is_onnx(args.graph) else parse_graph(args.graph)
    graph = load_graph(message, limits=limits.graph)
    plan = plan_memory(graph, dtype=args.dtype, optimizer=args.optimizer, optimizer_dtype=args.optimizer_dtype,
                       budget=args.budget)
    print(json.dumps(plan, indent=2) if args.format == "json" else plan_text(plan))
    return EXIT_OK


def _import_onnx(args) -> int:
    from pathlib import Path

    from gradcheck_client.graphio import save_graph

    from .errors import OptionError
    from .graph import load_graph
    from .graph.validate import Limits

    out = Path(args.out)
    if out.suffix not in (".pb", ".json"):
        raise OptionError(f"'{args.out}': the graph file must end in .pb or .json", field="-o")
    from .onnx_import.folding import FoldBudget

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


def check_file_size(path: str, limit: int) -> None:
    """A file so far over max_message_bytes that the server's transport would refuse it (it admits twice
    the limit, so that the servicer answers the rest exactly): refused before it is read."""
    import os

    from .errors import LimitError

    try:
        size = os.path.getsize(path)
    except OSError:
        return  # the loader says what is wrong with the path
    if size > 2 * limit + 2**20:
        raise LimitError(f"graph file is {size} bytes, far over the limit of {limit} (raise it with "
                         "--max-message-bytes)", field="graph")


def _ops(args) -> int:
    import json

    from .ops import all_ops
    from .ops.describe import describe, describe_text

    rows = [describe(op) for op in all_ops()]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        print("\n".join(line for r in rows for line in describe_text(r)))
    return EXIT_OK


def _serve(args) -> int:
    import dataclasses
    from pathlib import Path

    from .errors import OptionError
    from .limits import ServerLimits, limit_flag_values
    from .server.config import ServerConfig, read_token

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


def main(argv=None) -> int:
    if hasattr(signal, "SIGPIPE"):  # `gradcheck-svc verify g.json | head` ends quietly, like other tools
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = build_parser().parse_args(argv)
    try:
        from .batch.cli import COMMANDS as BATCH_COMMANDS

        commands = {"verify": _verify, "ops": _ops, "serve": _serve, "audit-ops": _audit_ops,
                    "import-onnx": _import_onnx, "plan-memory": _plan_memory, **BATCH_COMMANDS}
        return commands[args.command](args)
    except GradcheckError as exc:
        print(f"gradcheck-svc: error: {exc.message}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except MemoryError:  # an input too big for this machine's memory: the user's to shrink, not a fault
        print("gradcheck-svc: error: out of memory: the input needs more memory than this machine has",
              file=sys.stderr)
        return EXIT_INVALID
    except Exception as exc:  # an internal fault: one line, no traceback
        print(f"gradcheck-svc: internal error: {type(exc).__name__}: {exc} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
