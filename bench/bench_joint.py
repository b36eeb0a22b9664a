"""Many parameter tensors: a whole verification of chain_256 vs torch.autograd.gradcheck(fast_mode=True).

examples/graphs/chain_256.json: 256 layers tanh(h @ W_i + b_i), width 32, batch 4, float64,
loss = sum; 512 parameter tensors, 270,336 elements.

Timed, per repetition:
  ours   verify(graph) with the default options (in process): engine forward+backward, the
         symbolic oracle's size check (skipped: over its budget), finite differences by cost --
         `auto` screens the parameters jointly (verify/joint_check.py: 16 directions spanning all
         512 tensors, 32 forwards of the graph, the cheapest tensors checked in full) -- and
         the diagnosis; and with --fd projection (16 directions per tensor, 2 x 16 forwards of
         each tensor's downstream graph: the per-parameter plan before the joint screen)
  torch  torch.autograd.gradcheck(f, (W_0, b_0, ..., W_255, b_255), fast_mode=True): one random
         direction per input tensor (2 forwards of the whole function each) against the
         vector-Jacobian product; it raises on a mismatch, and passes here
Ours checks 16 directions per tensor, torch 1. The cases alternate within every repetition
(interleaved); min and median are reported. 1 thread first: numpy's BLAS and torch get the same.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_joint.py [--quick] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fmt_s, interleaved, load, machine, match_threads, median, table, thread_counts  # noqa: E402

from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.oracles.finite_diff import FDOptions  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAIN = ROOT / "examples" / "graphs" / "chain_256.json"


def torch_problem(graph):
    """The same chain in torch, float64: f(W_0, b_0, ...) and the parameter tensors."""
    x = torch.tensor(np.asarray(graph.inputs["x"].value, dtype=np.float64))
    params = tuple(torch.tensor(np.asarray(graph.inputs[p].value, dtype=np.float64), requires_grad=True)
                   for p in graph.parameters)

    def f(*ps):
        h = x
        for w, b in zip(ps[0::2], ps[1::2]):
            h = torch.tanh(h @ w + b)
        return h.sum()
    return f, params


def ours(graph, **fd):
    report = verify(graph, VerifyOptions(fd=FDOptions(**fd)))
    assert report.verdict == "pass", report.to_text()
    return report


def run(reps: int, budget_s: float, projection: bool):
    graph = load_graph(CHAIN)
    f, params = torch_problem(graph)
    assert [n for n in graph.parameters[0::2]] == [f"W{i}" for i in range(256)]
    # the same function on both sides: the loss and every gradient agree
    report = ours(graph)
    loss = f(*params)
    grads = torch.autograd.grad(loss, params)
    assert abs(float(loss.detach()) - report.loss) < 1e-9
    worst = max(float(np.abs(p.gradient - g.numpy()).max()) for p, g in zip(report.parameters, grads))
    assert worst < 1e-9, worst
    modes = {}
    for p in report.parameters:
        modes[p.fd.checked_by] = modes.get(p.fd.checked_by, 0) + 1
    cases = {"ours (default)": lambda: ours(graph),
             "torch fast_mode": lambda: torch.autograd.gradcheck(f, params, fast_mode=True)}
    if projection:
        cases["ours --fd projection"] = lambda: ours(graph, mode="projection")
    times = interleaved(cases, reps=reps, warmup=1, budget_s=budget_s)
    t = median(times["torch fast_mode"])
    rows = [[name, torch.get_num_threads(), len(ts), fmt_s(min(ts)), fmt_s(median(ts)),
             "-" if name.startswith("torch") else f"{t / median(ts):.1f}x"] for name, ts in times.items()]
    return rows, modes, worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts, 1 first (default 1)")
    ap.add_argument("--no-projection", action="store_true", help="leave out the --fd projection row")
    args = ap.parse_args(argv)
    rows = []
    for n in thread_counts(args.threads):
        match_threads(n)
        r, modes, worst = run(reps=2 if args.quick else 7, budget_s=300, projection=not args.no_projection)
        rows += r
    print("## bench_joint: chain_256 (512 parameter tensors), verify with default options vs "
          "torch.autograd.gradcheck(fast_mode=True)\n")
    print(f"machine: {machine()}\n")
    print(table(["case", "threads (numpy BLAS = torch)", "reps", "min", "median", "speed-up (torch median / this)"],
                rows))
    print(f"\nours: fd_checked_by {modes}; engine vs torch autograd max |difference| {worst:.1e}")
    print("goal: default verification >= 5x faster than gradcheck(fast_mode=True), 16 directions per tensor vs 1")
    print(f"after the runs: {load()}")


if __name__ == "__main__":
    main()
