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

EXIT_OK, EXIT_MISMATCH, EXIT_INVALID, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors: one line, exit 2
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gradcheck-svc", description="Verify the gradients of a computation graph.")
    p.add_argument("--version", action="version", version=f"gradcheck-svc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    v = sub.add_parser("verify", help="verify one graph (.json or .pb) and print a report")
    v.add_argument("graph", help="graph file: .json (protobuf JSON) or .pb (binary protobuf)")
    v.add_argument("--format", choices=["text", "json"], default="text")
    v.add_argument("--fd", choices=["full", "projection", "auto"], default="auto",
                   help="finite differences: every element, random projections, or by size (default)")
    v.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="engine precision (default: the graph's float dtype)")
    v.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    v.add_argument("--fault", action="append", default=[], metavar="NODE:KIND[:VALUE]",
                   help="corrupt NODE's cached value between forward and backward "
                        "(KIND: overwrite, scale, zero, nan, bitflip, stale); repeatable")
    v.add_argument("--integrity", choices=["off", "check"], default="check",
                   help="fingerprint tensors saved for backward and check them when read (default: check)")
    v.add_argument("--allow-inplace-hazards", action="store_true",
                   help="when an in-place node overwrote a value the backward needs, compute the (wrong) "
                        "gradient and diagnose it instead of stopping with an error")
    v.add_argument("--no-localize", action="store_true",
                   help="skip finding the faulty node and its cause when a gradient fails (verdict only)")
    v.add_argument("--atol", type=float, default=None, help="absolute tolerance (default per dtype)")
    v.add_argument("--rtol", type=float, default=None, help="relative tolerance (default per dtype)")
    v.add_argument("--directions", type=int, default=16, help="random directions in projection mode")
    v.add_argument("--seed", type=int, default=0, help="seed for projection directions")
    v.add_argument("--checkpoint", default="none", metavar="POLICY",
                   help="gradient checkpointing for the verified gradients: none (default), sqrt, every:K, "
                        "or a comma-separated list of node names to keep")
    v.add_argument("--memory-plot", default=None, metavar="FILE",
                   help="write live bytes per forward/backward step, with and without checkpointing "
                        "(.svg, or .png with matplotlib)")

    v.add_argument("--symbolic", choices=["on", "off"], default="on",
                   help="exact SymPy reference gradient for graphs within its budget (default on)")
    v.add_argument("--symbolic-max-elements", type=int, default=5000, metavar="N",
                   help="symbolic oracle budget: scalar elements (inputs plus node outputs)")
    v.add_argument("--symbolic-max-partials", type=int, default=250_000, metavar="N",
                   help="symbolic oracle budget: non-zero local partial derivatives")
    v.add_argument("--symbolic-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="symbolic oracle wall-clock budget")
    v.add_argument("--simplify-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="time to prove a user derivative (expr op) equal to SymPy's")

    s = sub.add_parser("serve", help="run the gRPC server (GradCheckService, health, reflection)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=50051, help="gRPC port (0: pick a free one; default 50051)")
    s.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    s.add_argument("--max-queue", type=int, default=None, help="requests waiting beyond busy workers before "
                   "RESOURCE_EXHAUSTED (default 64)")
    s.add_argument("--max-message-mb", type=float, default=None, help="largest request/response (default 16)")
    s.add_argument("--max-nodes", type=int, default=None, help="nodes per graph (default 100000)")
    s.add_argument("--max-elements", type=int, default=None, help="tensor elements per graph (default 10^7)")
    s.add_argument("--max-symbolic-budget", type=int, default=None, help="symbolic oracle budget cap (default 5000)")
    s.add_argument("--max-request-seconds", type=float, default=None, help="per-verification time (default 120)")
    s.add_argument("--token-file", default=None, help="require this bearer token (default: $GRADCHECK_TOKEN "
                   "when set, else no auth)")
    s.add_argument("--tls-cert", default=None, help="PEM certificate chain (enables TLS, with --tls-key)")
    s.add_argument("--tls-key", default=None, help="PEM private key")
    s.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this HTTP port")
    s.add_argument("--grace", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM")

    a = sub.add_parser("audit-ops", help="check every op's VJP against SymPy's derivative")
    a.add_argument("--op", action="append", default=[], metavar="NAME", help="audit only this op (repeatable)")
    a.add_argument("--seed", type=int, default=0, help="seed for the random test points")
    a.add_argument("--format", choices=["text", "json"], default="text")

    o = sub.add_parser("ops", help="list the registered ops")
    o.add_argument("--format", choices=["text", "json"], default="text")

    from .batch.cli import add_parsers  # batch, batch-merge, screen (their exit codes: batch/cli.py)

    add_parsers(sub)
    return p


def _verify(args) -> int:
    from .engine import parse_fault, parse_policy
    from .errors import OptionError
    from .graph import load_graph
    from .oracles.finite_diff import FDOptions
    from .oracles.symbolic import SymbolicOptions
    from .verify import VerifyOptions, verify
    from .verify.memory_profile import write_timeline_plot

    for flag in ("symbolic_max_elements", "symbolic_max_partials", "symbolic_timeout", "simplify_timeout"):
        if not getattr(args, flag) > 0:  # NaN too
            raise OptionError("must be positive", field="--" + flag.replace("_", "-"))
    symbolic = SymbolicOptions(enabled=args.symbolic == "on", max_elements=args.symbolic_max_elements,
                               max_edges=args.symbolic_max_partials, timeout_s=args.symbolic_timeout,
                               simplify_timeout_s=args.simplify_timeout)
    options = VerifyOptions(
        dtype=args.dtype, device=args.device,
        fd=FDOptions(mode=args.fd, directions=args.directions, seed=args.seed),
        faults=tuple(parse_fault(f) for f in args.fault), atol=args.atol, rtol=args.rtol,
        symbolic=symbolic,
        checkpoint=parse_policy(args.checkpoint), memory_timeline=args.memory_plot is not None,
        integrity=args.integrity, allow_inplace_hazards=args.allow_inplace_hazards, localize=not args.no_localize)
    if args.memory_plot is not None and not args.memory_plot.lower().endswith((".svg", ".png")):
        raise OptionError(f"'{args.memory_plot}': the plot file must end in .svg or .png", field="memory-plot")
    graph = load_graph(args.graph)
    report = verify(graph, options)
    if args.memory_plot is not None:
        try:
            write_timeline_plot(args.memory_plot, report.timelines, graph.name)
        except OSError as exc:
            raise OptionError(f"'{args.memory_plot}': cannot write: {exc.strerror or exc}",
                              field="memory-plot") from None
    print(report.to_json() if args.format == "json" else report.to_text())
    return EXIT_OK if report.passed else EXIT_MISMATCH


def _ops(args) -> int:
    import json

    from .ops import all_ops
    from .ops.describe import describe

    rows = [describe(op) for op in all_ops()]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            attrs = ", ".join(r["attributes"]) or "-"
            print(f"{r['name']:<16} arity {r['arity']:<3} attrs: {attrs}")
    return EXIT_OK


def _serve(args) -> int:
    import dataclasses
    from pathlib import Path

    from .errors import OptionError
    from .server.config import ServerConfig, ServerLimits, read_token

    limits = ServerLimits()
    graph_limits = limits.graph
    if args.max_nodes is not None:
        graph_limits = dataclasses.replace(graph_limits, max_nodes=args.max_nodes)
    if args.max_elements is not None:
        graph_limits = dataclasses.replace(graph_limits, max_elements=args.max_elements)
    given = {"max_queue": args.max_queue, "max_symbolic_budget": args.max_symbolic_budget,
             "max_request_seconds": args.max_request_seconds,
             "max_message_bytes": None if args.max_message_mb is None else int(args.max_message_mb * 2**20)}
    limits = dataclasses.replace(limits, graph=graph_limits, **{k: v for k, v in given.items() if v is not None})
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
    if args.max_queue is not None and args.max_queue < 0:
        raise OptionError("must be 0 or more", field="--max-queue")
    for flag in ("max_nodes", "max_elements", "max_symbolic_budget"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise OptionError("must be positive", field="--" + flag.replace("_", "-"))
    for flag in ("max_message_mb", "max_request_seconds"):
        if getattr(args, flag) is not None and not getattr(args, flag) > 0:  # NaN too
            raise OptionError("must be positive", field="--" + flag.replace("_", "-"))
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

        commands = {"verify": _verify, "ops": _ops, "serve": _serve, "audit-ops": _audit_ops, **BATCH_COMMANDS}
        return commands[args.command](args)
    except GradcheckError as exc:
        print(f"gradcheck-svc: error: {exc.message}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # an internal fault: one line, no traceback
        print(f"gradcheck-svc: internal error: {type(exc).__name__}: {exc} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
