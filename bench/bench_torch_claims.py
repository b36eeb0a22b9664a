"""torch.autograd.gradcheck and gradcheck_client.torch on the same planted bugs: what each says, and its time.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_torch_claims.py

The cases are tests/test_torch_claims.py's: a custom autograd.Function y = x**3 whose backward is right,
1% off, wrong at one element, wrong for negative inputs; a hook that doubles a gradient; opaque nodes
(opaque.py): a torch.library custom op whose registered backward is 1% off for negative inputs, and a
custom Function around cumsum (an op outside the capture's table) whose backward is 1% off. Prints a
Markdown table: each tool's verdict and first line, and its median time over a few runs (in process;
gradcheck_client.torch includes its capture, torch's backward, the custom Function's own check and the
verification with the symbolic oracle and finite differences).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from harness import machine, median, table  # noqa: E402
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
    return f"{report.verdict.upper()}: " + first[:140]


def timed(say, fn, reps: int = 3):
    times, said = [], ""
    for _ in range(reps):
        t0 = time.perf_counter()
        said = say(fn)
        times.append(time.perf_counter() - t0)
    return said, median(times)


def main() -> None:
    print(f"machine: {machine()}\n")
    rows = []
    for name, fn in CASES.items():
        theirs, t_theirs = timed(torch_says, fn)
        ours, t_ours = timed(ours_says, fn)
        rows.append([name, theirs, f"{t_theirs * 1e3:.1f} ms", ours, f"{t_ours * 1e3:.0f} ms"])
    print(table(["case", "torch.autograd.gradcheck", "time", "gradcheck_client.torch", "time"], rows))


if __name__ == "__main__":
    main()
