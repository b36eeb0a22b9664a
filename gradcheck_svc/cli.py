"""gradcheck-svc: the service's command line.

Exit codes (a contract for CI scripts): 0 every gradient verified,
1 a gradient mismatch, 2 invalid input or usage, 3 internal error.
Errors are one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
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
                        "(KIND: overwrite, scale, zero, nan, bitflip); repeatable")
    v.add_argument("--atol", type=float, default=None, help="absolute tolerance (default per dtype)")
    v.add_argument("--rtol", type=float, default=None, help="relative tolerance (default per dtype)")
    v.add_argument("--directions", type=int, default=16, help="random directions in projection mode")
    v.add_argument("--seed", type=int, default=0, help="seed for projection directions")
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

    a = sub.add_parser("audit-ops", help="check every op's VJP against SymPy's derivative")
    a.add_argument("--op", action="append", default=[], metavar="NAME", help="audit only this op (repeatable)")
    a.add_argument("--seed", type=int, default=0, help="seed for the random test points")
    a.add_argument("--format", choices=["text", "json"], default="text")

    o = sub.add_parser("ops", help="list the registered ops")
    o.add_argument("--format", choices=["text", "json"], default="text")
    return p


def _verify(args) -> int:
    from .engine import parse_fault
    from .graph import load_graph
    from .errors import OptionError
    from .oracles.finite_diff import FDOptions
    from .oracles.symbolic import SymbolicOptions
    from .verify import VerifyOptions, verify

    for flag in ("symbolic_max_elements", "symbolic_max_partials", "symbolic_timeout", "simplify_timeout"):
        if getattr(args, flag) <= 0:
            raise OptionError("must be positive", field="--" + flag.replace("_", "-"))
    symbolic = SymbolicOptions(enabled=args.symbolic == "on", max_elements=args.symbolic_max_elements,
                               max_edges=args.symbolic_max_partials, timeout_s=args.symbolic_timeout,
                               simplify_timeout_s=args.simplify_timeout)
    options = VerifyOptions(
        dtype=args.dtype, device=args.device,
        fd=FDOptions(mode=args.fd, directions=args.directions, seed=args.seed),
        faults=tuple(parse_fault(f) for f in args.fault), atol=args.atol, rtol=args.rtol, symbolic=symbolic)
    graph = load_graph(args.graph)
    report = verify(graph, options)
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
    args = build_parser().parse_args(argv)
    try:
        return {"verify": _verify, "ops": _ops, "audit-ops": _audit_ops}[args.command](args)
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
