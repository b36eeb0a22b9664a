"""The `expr` derivative check: sympy.simplify in-process under an interval timer (now) vs in a
child process (before), in one interleaved run, on a whole in-process verification of the bundled
swish_custom example (its user derivative is proven equal by simplification) and of a graph whose
derivative takes simplify ~2 s (tests/grpc_helpers.hard_simplify_graph).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_expr_simplify.py [--quick]

BENCHMARKS.md's issue-9 `expr` table: no options.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python"), str(ROOT / "tests")]

from harness import fmt_s, interleaved, load, machine, median, table  # noqa: E402

from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.verify import custom_ops, verify  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from grpc_helpers import hard_simplify_graph

    graphs = {"swish_custom": load_graph(ROOT / "examples" / "graphs" / "swish_custom.json"),
              "hard_simplify": load_graph(hard_simplify_graph())}
    real = custom_ops.timer_free

    def run(graph, in_process: bool):
        def call():
            custom_ops.timer_free = real if in_process else (lambda: False)
            try:
                verify(graph)
            finally:
                custom_ops.timer_free = real
        return call

    print(machine())
    rows = []
    for name, graph in graphs.items():
        reps = 3 if args.quick else (10 if name == "swish_custom" else 5)
        times = interleaved({"in-process": run(graph, True), "child process": run(graph, False)}, reps)
        a, b = times["in-process"], times["child process"]
        rows.append([name, len(a), fmt_s(min(a)), fmt_s(median(a)), fmt_s(min(b)), fmt_s(median(b)),
                     f"{median(b) / median(a):.2f}x"])
    print(table(["graph", "reps", "in-process min", "in-process median", "child min", "child median",
                 "child / in-process (median)"], rows))
    print(load())


if __name__ == "__main__":
    main()
