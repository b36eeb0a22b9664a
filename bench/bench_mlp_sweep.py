"""Cost without cliffs (issue 32 items 3 and 6): a tanh MLP swept in width (64-1024 at depth 4) and in depth
(2-64 at width 64), `verify` with default options vs torch.autograd.gradcheck(fast_mode=True) on the same
float64 function and loss, and each side's log-log slope of time against the parameter count.

The graph: tests/plants.py `mlp` (batch 8, h = tanh(h @ W_i + b_i), loss = sum of the last h); torch: the
same arithmetic on the same values, gradcheck over (W_0, b_0, ...). Before timing, the engine's loss and
gradients equal torch autograd's (1e-9 relative). Interleaved (harness.interleaved), 1 thread, min and
median; the slope is the least-squares fit of log(median) on log(parameters) over the sweep (1.0: time
linear in the parameters).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_mlp_sweep.py [--quick] [--reps N]

--quick: widths 64 and 128, depths 2 and 4, 1 repetition (a smoke run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import interleaved, load, machine, match_threads, median, min_med, table  # noqa: E402
from bench_joint import torch_problem  # noqa: E402  (the same tanh chain in torch)
from plants import mlp  # noqa: E402

from gradcheck_svc.verify import verify  # noqa: E402

WIDTHS, DEPTHS = (64, 128, 256, 512, 1024), (2, 4, 8, 16, 32, 64)


def ours(graph):
    report = verify(graph)
    assert report.verdict == "pass", report.to_text()
    return report


def run(width: int, depth: int, reps: int) -> tuple[int, dict, dict]:
    graph = mlp(width=width, depth=depth)
    f, params = torch_problem(graph)
    report = ours(graph)
    loss = f(*params)
    grads = torch.autograd.grad(loss, params)
    assert abs(float(loss.detach()) - report.loss) <= 1e-9 * max(1.0, abs(report.loss))
    for p, g in zip(report.parameters, grads):
        assert np.abs(p.gradient - g.numpy()).max() <= 1e-9 * max(np.abs(g.numpy()).max(), 1e-300), p.name
    modes = {}
    for p in report.parameters:
        modes[p.fd.checked_by] = modes.get(p.fd.checked_by, 0) + 1
    times = interleaved({"ours": lambda: ours(graph),
                         "torch": lambda: torch.autograd.gradcheck(f, params, fast_mode=True)}, reps=reps, warmup=0)
    return sum(p.numel() for p in params), times, modes


def slope(xs, ys) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def sweep(label: str, shapes: list, reps: int) -> str:
    rows, sizes, mine, theirs = [], [], [], []
    for width, depth in shapes:
        n, times, modes = run(width, depth, reps)
        sizes.append(n)
        mine.append(median(times["ours"]))
        theirs.append(median(times["torch"]))
        rows.append([width, depth, f"{n:,}", len(times["ours"]), min_med(times["ours"]), min_med(times["torch"]),
                     f"{theirs[-1] / mine[-1]:.2f}x", ", ".join(f"{k} {v}" for k, v in modes.items())])
        print(f"done {label} {width}x{depth}: {rows[-1]}; {load()}", file=sys.stderr, flush=True)
    text = table(["width", "depth", "parameters", "reps", "ours min / median", "torch min / median",
                  "speed (torch / ours, medians)", "fd_checked_by"], rows)
    return (f"### {label}\n\n{text}\n\nlog-log slope of the median time in the parameters: ours "
            f"{slope(sizes, mine):.2f}, torch {slope(sizes, theirs):.2f}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two widths, two depths, 1 repetition (smoke run)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each shape (default 3)")
    args = ap.parse_args(argv)
    match_threads(1)
    widths, depths, reps = ((64, 128), (2, 4), 1) if args.quick else (WIDTHS, DEPTHS, args.reps)
    print(f"## bench_mlp_sweep: tanh MLP (batch 8), verify with default options vs "
          f"torch.autograd.gradcheck(fast_mode=True)\n\nmachine: {machine()}\n")
    print(sweep("width (depth 4)", [(w, 4) for w in widths], reps))
    print(sweep("depth (width 64)", [(64, d) for d in depths], reps))
    print(f"after the runs: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
