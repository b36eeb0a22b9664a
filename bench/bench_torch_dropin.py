"""gradcheck_client.torch.gradcheck (the drop-in) against torch.autograd.gradcheck, fast_mode False and True, on
a corpus of small custom autograd.Functions with planted-bug twins and small modules (issue 42, item 7).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=.:clients/python \
        .venv/bin/python bench/bench_torch_dropin.py [--reps 5] [--only functions|modules]

The corpus is bench/torch_dropin_corpus.py: 45 Functions (a wrong coefficient or sign, a missing grad_output
factor, a transposed operand, swapped gradients, a dropped term, one element, negative inputs only, 1 % off,
repeated indices overwritten, a non-differentiable mask, index or exponent argument), each correct one beside
its twin, float64; and 7 small
modules (MLPs, a conv net, a LayerNorm residual block, a GRU, an LSTM, a transformer encoder layer with
SDPA), float64, eval mode, called as gradcheck(module, (x,)) by both tools (torch's checks the input; ours the
input and the module's parameters). Ours is the drop-in with torch's fast_mode False and True: it runs torch's
own checks with that mode and its own check of the gradients beside them, so each of its rows is torch's
time plus its own. Each call is timed in process, 1 thread for numpy's BLAS and torch alike,
the three tools interleaved within every repetition (their order rotating, so background load hits all
alike); min / median per case, then the median over the cases of each tool's median (and of its min, the
least disturbed by load) and the ratios to torch's, for the Functions all together, the correct ones and the twins.
Detection: on the correct Functions, a raise is a false alarm; on the twins, a miss.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from harness import fmt_s, interleaved, load, machine, match_threads, min_med, table  # noqa: E402
from torch_dropin_corpus import functions, modules  # noqa: E402

from gradcheck_client.torch import gradcheck  # noqa: E402

GradcheckError = importlib.import_module("torch.autograd.gradcheck").GradcheckError

TOOLS = {"torch fast_mode=False": lambda f, x: torch.autograd.gradcheck(f, x, fast_mode=False),
         "torch fast_mode=True": lambda f, x: torch.autograd.gradcheck(f, x, fast_mode=True),
         "ours fast_mode=False": lambda f, x: gradcheck(f, x, fast_mode=False),
         "ours fast_mode=True": lambda f, x: gradcheck(f, x, fast_mode=True)}


def says(tool, f, x) -> str:
    """'pass', or 'FAIL' (the tool raised a GradcheckError or returned False)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "pass" if TOOLS[tool](f, x) else "FAIL"
    except GradcheckError:
        return "FAIL"


def timed(cases: dict, reps: int) -> dict:
    """{(case, tool): seconds per call}, every (case, tool) interleaved within each repetition."""
    def quiet(tool, f, x):
        return lambda: says(tool, f, x)
    calls = {(name, tool): quiet(tool, f, x) for name, (f, x) in cases.items() for tool in TOOLS}
    return interleaved(calls, reps=reps, warmup=0)


def summary(times: dict, names: list) -> list:
    """Per tool: the median over the cases of its median time, and that over torch's (fast_mode=False and True);
    then the same of each case's minimum (the least disturbed by background load)."""
    rows = []
    for stat in (statistics.median, min):
        med = {tool: statistics.median(stat(times[n, tool]) for n in names) for tool in TOOLS}
        rows += [[tool, stat.__name__, fmt_s(m), f"{m / med['torch fast_mode=False']:.2f}x",
                  f"{m / med['torch fast_mode=True']:.2f}x"] for tool, m in med.items()]
    return rows


def run_functions(reps: int) -> None:
    corpus = functions()
    cases = {name: (cls.apply, x) for name, cls, x, _ in corpus}
    verdicts = {(name, tool): says(tool, *cases[name]) for name in cases for tool in TOOLS}
    times = timed(cases, reps)
    rows = [[name, "bug" if bug else "right"] + [f"{verdicts[name, t]} {min_med(times[name, t])}" for t in TOOLS]
            for name, _, _, bug in corpus]
    print(f"### {len(corpus)} custom autograd.Functions ({sum(b for *_, b in corpus)} planted bugs)\n")
    print(table(["Function", "kind"] + [f"{t}: verdict min / median" for t in TOOLS], rows))
    print("\nDetection (bugs caught of %d; false alarms of %d):\n" % (sum(b for *_, b in corpus),
                                                                        sum(not b for *_, b in corpus)))
    print(table(["tool", "bugs caught", "false alarms"],
                [[t, sum(verdicts[n, t] == "FAIL" for n, _, _, b in corpus if b),
                  sum(verdicts[n, t] == "FAIL" for n, _, _, b in corpus if not b)] for t in TOOLS]))
    print("\nMedian over the Functions (all; the correct ones; the twins) of each tool's median and min time:\n")
    for kind, names in (("all", list(cases)), ("correct", [n for n, *_, b in corpus if not b]),
                        ("planted bugs", [n for n, *_, b in corpus if b])):
        print(table(["tool", "per case", f"median over {kind}", "/ torch fast_mode=False", "/ torch fast_mode=True"],
                    summary(times, names)) + "\n")


def run_modules(reps: int) -> None:
    corpus = modules()
    cases = {name: (m, (x,)) for name, m, x in corpus}
    verdicts = {(name, tool): says(tool, *cases[name]) for name in cases for tool in TOOLS}
    times = timed(cases, reps)
    rows = [[name, sum(p.numel() for p in m.parameters())] + [f"{verdicts[name, t]} {min_med(times[name, t])}"
                                                              for t in TOOLS] for name, m, _ in corpus]
    print(f"\n### {len(corpus)} small modules (float64, eval mode)\n")
    print(table(["module", "parameters"] + [f"{t}: verdict min / median" for t in TOOLS], rows))
    print("\nMedian over the modules of each tool's median and min time:\n")
    print(table(["tool", "per case", "median over the modules", "/ torch fast_mode=False", "/ torch fast_mode=True"],
                summary(times, list(cases))))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every call (default 5)")
    ap.add_argument("--only", choices=("functions", "modules"), help="one half of the corpus")
    ap.add_argument("--quick", action="store_true", help="2 repetitions (smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps = 2
    match_threads(1)
    print(f"machine: {machine()}\n")
    if args.only != "modules":
        run_functions(args.reps)
    if args.only != "functions":
        run_modules(args.reps)
    print(f"\n{args.reps} repetitions, interleaved; after the runs: {load()}")


if __name__ == "__main__":
    main()
