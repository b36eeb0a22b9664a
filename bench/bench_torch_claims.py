"""torch.autograd.gradcheck and gradcheck_client.torch on the same planted bugs: what each says, and its time.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=.:clients/python \
        .venv/bin/python bench/bench_torch_claims.py

The cases are tests/torch/test_torch_claims.py's: a custom autograd.Function y = x**3 whose backward is right,
1% off, wrong at one element, wrong for negative inputs; a hook that doubles a gradient; opaque nodes
(opaque.py): a torch.library custom op whose registered backward is 1% off for negative inputs, and a
custom Function around cumsum (an op outside the capture's table) whose backward is 1% off. Prints the
machine line and a Markdown table: each tool's verdict and first line, and its min / median time over the
repetitions (in process, 1 thread for numpy's BLAS and torch alike; every call of both tools interleaved
within each repetition, their order rotating, so background load hits all alike; gradcheck_client.torch
includes its capture, torch's backward, the custom Function's own check and the verification with the
symbolic oracle and finite differences).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers (grpc_helpers)
sys.path.insert(0, str(ROOT / "tests" / "torch"))  # the cases, in test_torch_claims
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from harness import interleaved, load, machine, match_threads, min_med, table  # noqa: E402
from test_torch_claims import (NEGATIVES, OFF_1PC, ONE_ELEMENT, RIGHT, X, cumulative_function,  # noqa: E402
                               through, wavy_wrong)

from gradcheck_client.torch import check  # noqa: E402


def hooked(x):
    h = torch.tanh(x)
    h.register_hook(lambda g: g * 2)
    return (h * h).sum()


CASES = {"right": through(RIGHT), "1% off": through(OFF_1PC), "one element": through(ONE_ELEMENT),
         "negatives": through(NEGATIVES), "hook doubles": hooked,
         "custom op, backward 1% off for x < 0": lambda x: torch.tanh(wavy_wrong(x * 2)).sum(),
         "Function around cumsum, 1% off": through(cumulative_function(1.01))}


def torch_says(fn) -> str:
    try:
        torch.autograd.gradcheck(fn, (X.clone().requires_grad_(True),))
        return "pass"
    except Exception as exc:  # torch raises GradcheckError with the Jacobians
        return "FAIL: " + str(exc).splitlines()[0][:90]


def ours_says(fn) -> str:
    report = check(fn, X)
    if report.passed:
        return "pass"
    first = next(line for line in report.text.splitlines() if not line.startswith("verdict "))  # the culprit's
    return f"{report.verdict.upper()}: " + first.replace(f"{ROOT}/", "")[:140]  # paths as in the repository


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7, help="repetitions of every call (default 7)")
    ap.add_argument("--quick", action="store_true", help="2 repetitions (a smoke run: bench/run_all.py --quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps = 2
    match_threads(1)
    said = {(name, who): say(fn) for name, fn in CASES.items() for who, say in (("torch", torch_says),
                                                                                  ("ours", ours_says))}
    calls = {(name, who): (lambda say=say, fn=fn: say(fn)) for name, fn in CASES.items()
             for who, say in (("torch", torch_says), ("ours", ours_says))}
    times = interleaved(calls, reps=args.reps, warmup=0)  # warmed up by the calls that said what each says
    print(f"machine: {machine()}\n")
    rows = [[name, said[name, "torch"], min_med(times[name, "torch"]), said[name, "ours"], min_med(times[name, "ours"])]
            for name in CASES]
    print(table(["case", "torch.autograd.gradcheck", "min / median", "gradcheck_client.torch", "min / median"], rows))
    print(f"\n{args.reps} repetitions, interleaved; after the runs: {load()}")


if __name__ == "__main__":
    main()
