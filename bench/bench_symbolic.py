"""Symbolic oracle time vs graph size, for an MLP-shaped graph and a deep
elementwise chain (10, 100, 1,000, 4,000 scalar elements).

Side by side in one run: our oracle (per-node SymPy derivatives composed by
the chain rule in mpmath), the naive SymPy approach it replaces (the loss as
one SymPy expression of all parameter elements -- built from the same
scalarized nodes -- differentiated by sympy.diff per parameter element and
evaluated with evalf at 40 digits; capped in time and skipped past the cap),
and finite differences (float64) for scale. The three alternate within every one
of --repeat repetitions (order rotating; the naive approach is dropped for good once
it fails or passes the cap); min / median of each are printed, ratios and growth on
the medians. The growth rate is the log-log slope of time vs elements (1.0 = linear),
and for the chain also vs edges (non-zero local partials). The machine line (CPU,
BLAS kernel and threads, load) comes first.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_symbolic.py [--repeat 3] [--naive-cap 20] [--quick]

BENCHMARKS.md's table: `--repeat 5 --naive-cap 20`. --quick: 10 and 100 elements, 2 repetitions,
naive capped at 5 s (a smoke run).
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import sympy as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import load, machine  # noqa: E402

from gradcheck_svc.engine.program import Program
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.finite_diff import FiniteDifferences
from gradcheck_svc.oracles.local_jacobian import _as_expr
from gradcheck_svc.oracles.sympy_arrays import SYMPY_XP
from gradcheck_svc.oracles.symbolic import SymbolicOptions, graph_elements, symbolic_gradients

TARGETS = (10, 100, 1000, 4000)
BUDGET = SymbolicOptions(max_elements=10_000, max_edges=2_000_000, timeout_s=600)


def mlp(n, d, h, c, rng):
    b = GraphBuilder("mlp")
    x = b.input("x", rng.standard_normal((n, d)))
    w1 = b.input("w1", rng.standard_normal((d, h)) / math.sqrt(d), requires_grad=True)
    b1 = b.input("b1", np.zeros(h) + 0.1, requires_grad=True)
    w2 = b.input("w2", rng.standard_normal((h, c)) / math.sqrt(h), requires_grad=True)
    y = b.input("y", rng.integers(0, c, size=n))
    z = b.node("tanh", b.node("add", b.node("matmul", x, w1), b1))
    b.output(b.node("cross_entropy", b.node("matmul", z, w2), y, name="loss"))
    return load_graph(b.build())


def chain(width, depth, rng):
    b = GraphBuilder("chain")
    v = b.input("x", rng.uniform(-1, 1, size=width), requires_grad=True)
    ops = ("tanh", "sin", "sigmoid", "softplus")
    for i in range(depth):
        v = b.node(ops[i % len(ops)], v)
    b.output(b.node("sum", v, name="loss"))
    return load_graph(b.build())


def sized(kind, target, rng):
    """The graph of that shape whose element count is closest to target."""
    best = None
    if kind == "mlp":
        for s in range(1, 40):
            n, d, h, c = max(1, s // 2), s, s, max(2, s // 3)
            g = mlp(n, d, h, c, rng)
            e = graph_elements(Program(g, np.float64))
            if best is None or abs(e - target) < abs(best[0] - target):
                best = (e, g, f"x[{n},{d}] W1[{d},{h}] W2[{h},{c}]")
    else:
        width = 2
        depth = max(1, round((target - 2 * width - 1) / width))
        g = chain(width, depth, rng)
        best = (graph_elements(Program(g, np.float64)), g, f"width {width}, depth {depth}")
    return best


def naive(graph, cap_s):
    """Whole-loss expression, sympy.diff per parameter element, evalf -- in a forked
    process, killed past cap (so an abandoned run cannot slow the next measurement)."""

    def work():
        try:
            build_and_differentiate()
        except RecursionError:  # the nested whole-loss expression is deeper than Python's stack
            sys.exit(3)

    def build_and_differentiate():
        program = Program(graph, np.float64)
        vals, subs = {}, {}
        for name, gi in graph.inputs.items():
            if gi.requires_grad:
                syms = np.array([sp.Symbol(f"{name}_{i}", real=True) for i in range(gi.value.size)], dtype=object)
                subs.update({s: sp.Float(float(v), 40) for s, v in zip(syms, gi.value.reshape(-1))})
                vals[name] = syms.reshape(gi.value.shape)
            else:
                vals[name] = gi.value if gi.value.dtype.kind != "f" else gi.value.astype(object)
        for step in program.steps:
            xs = [vals[n] for n in step.inputs]
            if step.op.sympy is not None:
                f = np.frompyfunc(lambda *a, op=step.op, at=step.attrs: _as_expr(op.sympy(sp, *a, **at)), len(xs), 1)
                vals[step.name] = np.asarray(f(*np.broadcast_arrays(*[np.asarray(x, dtype=object) for x in xs])),
                                             dtype=object)
            else:
                vals[step.name] = np.asarray(step.op.forward(SYMPY_XP, *xs, **step.attrs), dtype=object)
        loss = vals[program.output].reshape(-1)[0]
        for s in subs:
            sp.diff(loss, s).evalf(40, subs=subs)

    t0 = time.perf_counter()
    proc = multiprocessing.get_context("fork").Process(target=work, daemon=True)
    proc.start()
    proc.join(cap_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None, f">{cap_s:g}"
    if proc.exitcode == 3:
        return None, "RecursionError"
    return (time.perf_counter() - t0, "") if proc.exitcode == 0 else (None, f"exit {proc.exitcode}")


def slope(xs, ys):
    lx, ly = np.log(xs), np.log(ys)
    return float(np.polyfit(lx, ly, 1)[0])


def _mm(xs, width, digits=3):
    """min / median seconds, right-aligned in width."""
    return f"{f'{min(xs):.{digits}f} / {statistics.median(xs):.{digits}f}':>{width}}"


def fd_all(graph):
    fd = FiniteDifferences(graph)
    for p in graph.parameters:
        fd.gradient(p)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--naive-cap", type=float, default=20.0, help="seconds before the naive approach is abandoned")
    ap.add_argument("--quick", action="store_true", help="10 and 100 elements, 2 repetitions, naive cap 5 s")
    args = ap.parse_args(argv)
    targets = TARGETS
    if args.quick:
        targets, args.repeat, args.naive_cap = TARGETS[:2], 2, 5.0
    rng = np.random.default_rng(0)
    print(f"machine: {machine()}\n")
    print(f"{args.repeat} interleaved repetitions; seconds as min / median; naive/ours of the medians\n")
    print(f"{'graph':<6} {'elements':>8} {'edges':>8}  {'shape':<28} {'symbolic s':>15} {'naive s':>17} "
          f"{'naive/ours':>10} {'FD s':>17}")
    naive_alive = {"mlp": True, "chain": True}
    for kind in ("mlp", "chain"):
        pts = []
        for target in targets:
            elements, graph, shape = sized(kind, target, rng)
            t_ours, t_naive, t_fd, res = [], [], [], None
            why = "" if naive_alive[kind] else "not run"
            steps = ("ours", "naive", "fd")
            for r in range(args.repeat):
                for step in steps[r % 3:] + steps[:r % 3]:  # rotate, as harness.interleaved does
                    if step == "ours":
                        res = symbolic_gradients(graph, BUDGET)
                        assert res.status == "ok", res.reason
                        t_ours.append(res.seconds)
                    elif step == "naive":
                        if naive_alive[kind]:
                            t, why = naive(graph, args.naive_cap)
                            if t is None:
                                naive_alive[kind] = False  # it only gets slower (or deeper) with size
                            else:
                                t_naive.append(t)
                    else:
                        t0 = time.perf_counter()
                        fd_all(graph)
                        t_fd.append(time.perf_counter() - t0)
            ours = statistics.median(t_ours)
            pts.append((elements, res.edges, ours))
            ok = t_naive and not why
            nv = _mm(t_naive, 17) if ok else f"{why:>17}"
            ratio = f"{statistics.median(t_naive) / ours:10.1f}" if ok else f"{'-':>10}"
            print(f"{kind:<6} {elements:>8} {res.edges:>8}  {shape:<28} {_mm(t_ours, 15)} {nv} {ratio} "
                  f"{_mm(t_fd, 17, 4)}", flush=True)
        big = [p for p in pts if p[0] >= 50]
        top = pts[-2:]
        if len(big) < 2:
            print(f"{kind}: growth needs two sizes of 50+ elements (not in a --quick run)")
            continue
        print(f"{kind}: growth, log-log slope of median time: ~100..4000 elements: elements^"
              f"{slope([p[0] for p in big], [p[2] for p in big]):.2f} (edges^"
              f"{slope([p[1] for p in big], [p[2] for p in big]):.2f}); 1000..4000: elements^"
              f"{slope([p[0] for p in top], [p[2] for p in top]):.2f} (edges^"
              f"{slope([p[1] for p in top], [p[2] for p in top]):.2f})")
    print(f"\nafter the run: {load()}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
