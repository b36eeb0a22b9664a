"""The cost of finite differences that know their own error (issue 17), before vs after.

before  FiniteDifferences.gradient(p) for every parameter, compared with the engine's gradient
        against the first pass's rounding estimate only (verify's path before the error bounds)
after   the same first pass, then fd_check: values failing against it are refined on the
        ladder of steps (Richardson, one-sided) and held to tolerance + their FD error
Both share the first pass (its code is unchanged), so the difference is what the bounds cost.
The two alternate within every repetition (harness.interleaved); min and median reported.

Graphs:
  mlp P       bench_fd.py's problem: cross_entropy(tanh(x @ W1) @ W2), P = 2,000 / 20,000
              elements -- no element fails the first pass, nothing is refined
  poles 1%    L = sum(c * tanh(u) / b), b 2,000 elements of which 1% are ~2e-3 (a step of
              cbrt(eps) is not small next to them): exactly those are refined

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_fd_bounds.py [--quick] [--threads 1,2]

BENCHMARKS.md's issue-17 tables: `--threads 1,2`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fd import problem  # noqa: E402
from harness import fmt_s, interleaved, load, machine, match_threads, median, table  # noqa: E402

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.build import GraphBuilder  # noqa: E402
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences  # noqa: E402
from gradcheck_svc.verify.compare import Tolerance, compare  # noqa: E402
from gradcheck_svc.verify.fd_check import fd_check  # noqa: E402

TOL = Tolerance.for_dtype("float64")


def poles(n: int = 2_000, rng=None):
    rng = rng or np.random.default_rng(0)
    b_values = rng.uniform(0.5, 2.0, n) * rng.choice([-1, 1], n)
    near = rng.choice(n, n // 100, replace=False)
    b_values[near] = 2e-3 * np.sign(b_values[near])
    g = GraphBuilder("poles")
    u = g.node("tanh", g.input("u", rng.standard_normal(n), True))
    q = g.node("div", u, g.input("b", b_values, True))
    g.output(g.node("sum", g.node("mul", q, g.input("c", rng.uniform(0.5, 1.5, n))), name="L"))
    return load_graph(g.build())


def engine_gradients(graph):
    program = Program(graph, np.float64)
    return {p: np.asarray(g) for p, g in backward(forward(program, NUMPY, prepare_feeds(program, NUMPY))).items()}


def before(graph, grads):
    fd = FiniteDifferences(graph, FDOptions(mode="full"))
    out = {}
    for p in graph.parameters:
        ref = fd.gradient(p)
        out[p] = compare(grads[p], ref.reference, TOL, ref.noise)
    return out


def after(graph, grads):
    fd = FiniteDifferences(graph, FDOptions(mode="full"))
    out = {}
    for p in graph.parameters:
        ref = fd.gradient(p)
        out[p] = fd_check(grads[p], ref.reference, ref.noise, TOL,
                          lambda which, settled, p=p, ref=ref: fd.refine(p, ref, which, settled))
    return out


def run(label, graph, reps, budget_s):
    grads = engine_gradients(graph)
    b, a = before(graph, grads), after(graph, grads)
    refined = sum(len(c.refined) for c in a.values())
    verdict_before = all(c.passed for c in b.values())
    verdict_after = all(c.passed for c in a.values())
    times = interleaved({"before": lambda: before(graph, grads), "after": lambda: after(graph, grads)},
                        reps=reps, warmup=1, budget_s=budget_s)
    tb, ta = times["before"], times["after"]
    n = sum(int(np.prod(graph.specs[p].shape)) for p in graph.parameters)
    return [label, f"{n:,}", refined, len(tb), fmt_s(min(tb)), fmt_s(min(ta)), f"{min(ta) / min(tb):.2f}x",
            fmt_s(median(tb)), fmt_s(median(ta)), f"{median(ta) / median(tb):.2f}x",
            "pass" if verdict_before else "FAIL", "pass" if verdict_after else "FAIL"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args(argv)
    rows = []
    for i, t in enumerate(int(x) for x in args.threads.split(",")):
        match_threads(t)
        rows.append([f"{t} thread(s)"] + [""] * 11)
        rows.append(run("mlp", problem(2_000, np.random.default_rng(2_000))[0], 3 if args.quick else 11, 60))
        if i == 0:
            rows.append(run("mlp", problem(20_000, np.random.default_rng(20_000))[0], 1 if args.quick else 3, 120))
        rows.append(run("poles 1%", poles(), 3 if args.quick else 11, 60))
    print("## bench_fd_bounds: FD with error bounds (after) vs the first pass alone (before)\n")
    print(f"machine: {machine()}\n")
    print(table(["graph", "FD elements", "refined", "reps", "before min", "after min", "ratio min",
                 "before median", "after median", "ratio median", "verdict before", "verdict after"], rows))
    print(f"\nafter the runs: {load()}")


if __name__ == "__main__":
    main()
