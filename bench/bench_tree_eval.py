"""SymPy-tree evaluation: our hand-written walkers against SymPy's lambdify.

Issue 14 asks for SymPy's own printers and lambdify wherever the input is a
SymPy tree, unless a walker is measurably faster. Two places evaluate trees:

- mpmath, 40 digits (oracles/mp_eval.py, the symbolic oracle and the op audit).
  `elementwise`: one node's formula and its derivative at many points (gelu,
  one compiled function per node for lambdify); `scalarized`: a softmax row,
  each output element its own expression (lambdify must compile each one).
- NumPy, float64 (ops/formula_compile.py, the engine's `expr` op): a
  two-input formula and its derivative, compiled once and called per pass.
  The walker there is the one this change replaced, read from git
  (--walker-commit), so the two run side by side in one process.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_tree_eval.py [--reps 30] [--walker-commit a79cd9e]

BENCHMARKS.md's issue-14 table: `--reps 30 --walker-commit a79cd9e`.
"""
from __future__ import annotations

import argparse
import subprocess
import types
from pathlib import Path

import mpmath
import numpy as np
import sympy as sp

from harness import fmt_s, interleaved, machine, median, table

from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.ops.formula import parse_formula, symbols_for
from gradcheck_svc.ops.formula_compile import array_function
from gradcheck_svc.oracles.mp_eval import MpEvaluator, make_context
from gradcheck_svc.oracles.sympy_arrays import SYMPY_XP

ROOT = Path(__file__).resolve().parent.parent
DIGITS = 40


def old_walker(commit: str):
    src = subprocess.run(["git", "show", f"{commit}:gradcheck_svc/ops/formula_compile.py"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    mod = types.ModuleType("old_formula_compile")
    mod.__dict__["__package__"] = "gradcheck_svc.ops"
    exec(compile(src, "old_formula_compile.py", "exec"), mod.__dict__)  # noqa: S102 - our own history
    return mod


def mp_cases(n_points: int):
    x = sp.Symbol("x", real=True)
    f = REGISTRY["gelu"].sympy(sp, x)
    trees = [f, sp.diff(f, x)]
    points = [mpmath.mpf(v) for v in np.random.default_rng(0).uniform(-2, 2, n_points)]
    ev = MpEvaluator(make_context(DIGITS))

    def walker():
        for p in points:
            memo = {}
            env = {x: ev.ctx.mpf(p)}
            [ev.value(t, env, memo) for t in trees]

    def lambdified():
        with mpmath.workdps(DIGITS):  # lambdify's mpmath code runs in the global context
            fn = sp.lambdify([x], trees, "mpmath", cse=True)
            for p in points:
                fn(p)

    row = [sp.Symbol(f"z{i}", real=True) for i in range(32)]
    soft = REGISTRY["softmax"].forward(SYMPY_XP, np.array(row, dtype=object), axis=-1)
    outs = list(soft)
    env = {s: ev.ctx.mpf(v) for s, v in zip(row, np.random.default_rng(1).uniform(-2, 2, len(row)))}

    def walker_rows():
        memo = {}
        [ev.value(o, env, memo) for o in outs]

    def lambdified_rows():
        with mpmath.workdps(DIGITS):
            args = [env[s] for s in row]
            [sp.lambdify(row, o, "mpmath")(*args) for o in outs]

    return {f"elementwise: gelu + derivative at {n_points} points": (walker, lambdified),
            "scalarized: softmax row of 32, each element once": (walker_rows, lambdified_rows)}


def numpy_cases(walker_module, n: int):
    names = ["a", "b"]
    table_ = symbols_for(names)
    syms = tuple(table_[k] for k in names)
    tree = parse_formula("a*exp(-b**2) + log(1 + a**2)/b - tanh(a*b)**3 + relu(a - b)", table_, "bench")
    trees = [tree, sp.diff(tree, syms[0])]
    rng = np.random.default_rng(2)
    a, b = rng.uniform(0.3, 2, n), rng.uniform(0.3, 2, n)
    compiled = [array_function(t, syms, np) for t in trees]

    def walker():
        [walker_module.evaluate(t, {syms[0]: a, syms[1]: b}, np) for t in trees]

    def lambdified():
        [f(a, b) for f in compiled]

    return (walker, lambdified), lambda: [array_function(t, syms, np) for t in trees]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--walker-commit", default="a79cd9e", help="a commit whose formula_compile.py has the walker")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    reps = 5 if args.quick else args.reps
    print(machine())
    rows = []

    def add(kind, label, walker, lambdified):
        t = interleaved({"walker": walker, "lambdify": lambdified}, reps)
        w, lam = t["walker"], t["lambdify"]
        rows.append([kind, label, fmt_s(min(w)), fmt_s(median(w)), fmt_s(min(lam)), fmt_s(median(lam)),
                     f"{median(lam) / median(w):.2f}x"])

    for label, (w, lam) in mp_cases(200 if args.quick else 1000).items():
        add("mpmath 40 digits", label, w, lam)
    try:
        walker_module = old_walker(args.walker_commit)
    except (subprocess.CalledProcessError, OSError) as exc:  # no git, or a clone without that commit
        walker_module = None
        print(f"NumPy walker baseline unavailable ({exc}); timing lambdify alone")
    for n in (16, 100_000):
        (w, lam), compile_ = numpy_cases(walker_module, n)
        if walker_module is not None:
            add("NumPy float64", f"2-input formula + derivative, {n} elements, per call", w, lam)
    array_function.cache_clear()  # time the compile itself, not the per-process cache
    t = interleaved({"compile": lambda: (array_function.cache_clear(), compile_())}, reps)["compile"]
    rows.append(["NumPy float64", "lambdify compile of both trees (once per tree, cached)", "", "",
                 fmt_s(min(t)), fmt_s(median(t)), ""])
    print(table(["evaluator", "workload", "walker min", "walker median", "lambdify min", "lambdify median",
                 "lambdify/walker"], rows))


if __name__ == "__main__":
    main()
