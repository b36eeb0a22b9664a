"""The arguments of a `verify` command, built once for both (`gradcheck-svc verify` and the CI command
`gradcheck verify`): paths, outputs, every verification option (options.py), the in-process budgets,
the limits and the ONNX import options (onnx_options.py). A module of its own: it is the one place
that reads both option tables, so neither imports the other."""
from __future__ import annotations

import argparse

from .onnx_options import add_onnx_flags
from .options import IN_PROCESS_OPTIONS, OUTPUT_FORMATS, VERIFY_HIDDEN_LIMITS, add_flag, add_option_flags
from .scan import DEFAULT_INCLUDE


def add_verify_arguments(parser: argparse.ArgumentParser, *, add_limits=None) -> None:
    """Everything a `verify` command takes: paths, outputs, every verification option, the in-process
    budgets, the limits (`add_limits(parser, hidden=...)`, when the verifier can run in this process) and
    the ONNX import options."""
    given = parser.add_argument_group("graphs")
    given.add_argument("paths", nargs="+", metavar="PATH",
                       help="graph files (.json, .pb), ONNX models (.onnx), or directories searched for them")
    given.add_argument("--include", action="append", default=[], metavar="GLOB",
                       help="in directories, take files matching GLOB (path below the directory or file name; "
                            f"repeatable; default {' '.join(DEFAULT_INCLUDE)})")
    given.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                       help="in directories, leave out files matching GLOB (repeatable; default none)")
    given.add_argument("--claimed", default=None, metavar="GRADS.npz",
                       help="verify these gradients, computed by other code, instead of the engine's: an .npz "
                            "of parameter name -> array, and adjoint:NODE -> dL/dNODE to localize a wrong one "
                            "(one graph file; default none)")
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=OUTPUT_FORMATS, default="text",
                     help="the reports on stdout: text, or JSON (one graph: its report; several: a list of "
                          "{path, status, report, error}) (default text)")
    out.add_argument("--json", dest="format", action="store_const", const="json",
                     help="the same as --format json")
    out.add_argument("--html", default=None, metavar="FILE",
                     help="write one self-contained HTML page: each graph drawn with its findings, error "
                          "heatmaps, memory (default none)")
    out.add_argument("--junit", default=None, metavar="FILE",
                     help="write a JUnit XML report, one testcase per graph (default none)")
    out.add_argument("--summary-md", default=None, metavar="FILE",
                     help="write a Markdown summary table (also appended to $GITHUB_STEP_SUMMARY when set; "
                          "default none)")
    out.add_argument("--memory-plot", default=None, metavar="FILE",
                     help="plot live bytes per forward/backward step, with and without checkpointing (.svg, or "
                          ".png with matplotlib); several graphs: one file each, FILE.GRAPH.svg (default none)")
    add_option_flags(parser)
    group = parser.add_argument_group("symbolic oracle budgets (where the verification runs in this process)")
    for o in IN_PROCESS_OPTIONS:
        add_flag(group, o, o.name)
    if add_limits is not None:
        add_limits(parser, hidden=tuple(VERIFY_HIDDEN_LIMITS.values()))
    add_onnx_flags(parser)


OUTPUT_FLAGS = ("--html", "--junit", "--summary-md", "--memory-plot")  # the files a `verify` command writes


def output_over_input(args, paths) -> str | None:
    """The one line for an output file that is one of the files read (a graph being verified, the --claimed
    archive): writing the report there would destroy the user's input; else None."""
    import os

    inputs = [p for p in (*paths, getattr(args, "claimed", None)) if p and os.path.isfile(p)]
    for flag in OUTPUT_FLAGS:
        out = getattr(args, flag[2:].replace("-", "_"), None)
        if out and os.path.isfile(out) and any(os.path.samefile(out, p) for p in inputs):
            return f"{flag}: '{out}' is a file this run reads: writing it would destroy it (write elsewhere)"
    return None
