"""Full-Jacobian finite-difference check: our FD oracle vs torch.autograd.gradcheck.

The function, in float64 on both sides, with P parameter elements:
    loss = cross_entropy(tanh(x @ W1) @ W2, labels),   x [16, d] data, W1 [d, h], W2 [h, c]
    P = 2,000  (d, h, c = 20, 80, 5)     and     P = 20,000  (d, h, c = 100, 160, 25)
an elementwise graph ending in a sum (P = 20,000; full FD is O(P) with slices, O(P^2) dense):
    loss = sum(exp(tanh(w) * sin(v))),   w, v [10,000]
and a small CNN (P = 3,472):
    loss = sum(mean(relu(conv(max_pool(relu(conv(x, W1) + b1)), W2)), spatial))
    x [1, 8, 24, 24], W1 [16, 8, 3, 3], b1 [16], W2 [16, 16, 3, 3], pads 1, pool 2x2 stride 2

Timed, per repetition:
  ours   FiniteDifferences(graph, FDOptions(mode="full")) and .gradient(p) for every
         parameter (2P perturbed forwards, stacked) + the engine's forward+backward
  torch  torch.autograd.gradcheck(f, (W1, W2), fast_mode=False) (2P forwards, one at a time,
         + backward); it raises on a mismatch, and passes here
The two alternate within every repetition; medians are reported, with each FD's max
error against the analytic gradient (torch autograd, float64). torch's numerical
gradient is recomputed outside the timing with the same routine and step (eps=1e-6)
that gradcheck uses.

Threads: numpy's BLAS and torch always get the same number; the run is repeated for
each count in --threads (default 1,2: 2 is numpy's default here). The 2P perturbed
forwards are tiny, so torch's intra-op threads cannot speed them up, and on a loaded
2-core machine its OpenMP threads slowed gradcheck at 2,000 elements from 0.27 s
(1 thread) to 2.4 s (2 threads, load average 3.2): 1 thread is torch's best case.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_fd.py [--quick] [--threads 1,2]

BENCHMARKS.md's table: no options, prefixed `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fmt_s, interleaved, load, machine, match_threads, median, table  # noqa: E402

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.build import GraphBuilder  # noqa: E402
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences  # noqa: E402

BATCH = 16
SIZES = {2_000: (20, 80, 5), 20_000: (100, 160, 25)}
TORCH_EPS = 1e-6  # gradcheck's default step
_gradcheck_module = sys.modules["torch.autograd.gradcheck"]


def problem(elements: int, rng):
    d, h, c = SIZES[elements]
    assert d * h + h * c == elements
    x = rng.standard_normal((BATCH, d))
    labels = rng.integers(0, c, size=BATCH)
    w1 = rng.standard_normal((d, h)) / np.sqrt(d)
    w2 = rng.standard_normal((h, c)) / np.sqrt(h)
    b = GraphBuilder(f"fd{elements}")
    hidden = b.node("tanh", b.node("matmul", b.input("x", x), b.input("W1", w1, True)))
    logits = b.node("matmul", hidden, b.input("W2", w2, True))
    b.output(b.node("cross_entropy", logits, b.input("labels", labels, dtype="int64"), name="loss"))
    graph = load_graph(b.build())

    tx, tl = torch.tensor(x), torch.tensor(labels)

    def f(W1, W2):
        return F.cross_entropy(torch.tanh(tx @ W1) @ W2, tl)

    tw = (torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True))
    return graph, f, tw


CNN_ELEMENTS = 16 * 8 * 9 + 16 + 16 * 16 * 9


def cnn_problem(rng):
    x = rng.standard_normal((1, 8, 24, 24))
    w1, b1 = rng.standard_normal((16, 8, 3, 3)) / 8, 0.1 * rng.standard_normal(16)
    w2 = rng.standard_normal((16, 16, 3, 3)) / 12
    b = GraphBuilder("cnn")
    h = b.node("relu", b.node("conv", b.input("x", x), b.input("W1", w1, True), b.input("b1", b1, True),
                              pads=[1, 1, 1, 1]))
    h = b.node("max_pool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = b.node("relu", b.node("conv", h, b.input("W2", w2, True), pads=[1, 1, 1, 1]))
    b.output(b.node("sum", b.node("mean", h, axis=[2, 3]), name="L"))
    graph = load_graph(b.build())
    tx = torch.tensor(x)

    def f(W1, b1, W2):
        h = F.max_pool2d(torch.relu(F.conv2d(tx, W1, b1, padding=1)), 2)
        return torch.relu(F.conv2d(h, W2, padding=1)).mean(dim=(2, 3)).sum()

    tw = tuple(torch.tensor(v, requires_grad=True) for v in (w1, b1, w2))
    return graph, f, tw


def elementwise_problem(rng):
    w, v = rng.standard_normal(10_000), rng.standard_normal(10_000)
    b = GraphBuilder("elementwise")
    prod = b.node("mul", b.node("tanh", b.input("w", w, True)), b.node("sin", b.input("v", v, True)))
    b.output(b.node("sum", b.node("exp", prod), name="L"))

    def f(w, v):
        return torch.exp(torch.tanh(w) * torch.sin(v)).sum()

    return load_graph(b.build()), f, (torch.tensor(w, requires_grad=True), torch.tensor(v, requires_grad=True))


def ours(graph):
    fd = FiniteDifferences(graph, FDOptions(mode="full"))
    refs = {p: fd.gradient(p).reference for p in graph.parameters}
    program = Program(graph, np.float64)
    grads = backward(forward(program, NUMPY, prepare_feeds(program, NUMPY)))
    return refs, grads


def theirs(f, tw):
    return torch.autograd.gradcheck(f, tw, fast_mode=False, eps=TORCH_EPS)


GEMM_N = 1024  # the rate reference: one square float64 GEMM, timed in the same interleaved run


def forward_flops(elements: int) -> int:
    """GEMM FLOPs of one forward of the problem (tanh and the loss not counted: the floor is
    the arithmetic a perfect BLAS cannot avoid)."""
    d, h, c = SIZES[elements]
    return 2 * BATCH * d * h + 2 * BATCH * h * c


def run(elements, reps, budget_s, warmup, kind="mlp"):
    make = {"mlp": lambda r: problem(elements, r), "cnn": cnn_problem, "elementwise": elementwise_problem}[kind]
    graph, f, tw = make(np.random.default_rng(elements))
    names = graph.parameters
    square = np.random.default_rng(1).standard_normal((GEMM_N, GEMM_N))
    analytic = [g.numpy() for g in torch.autograd.grad(f(*tw), tw)]

    refs, grads = ours(graph)
    our_err = max(float(np.abs(refs[p] - a).max()) for p, a in zip(names, analytic))
    engine_err = max(float(np.abs(np.asarray(grads[p]) - a).max()) for p, a in zip(names, analytic))
    with torch.no_grad():
        numerical = _gradcheck_module._get_numerical_jacobian(f, tw, eps=TORCH_EPS)
    # numerical[i][0]: d(loss)/d(input i) as a column (n_i, 1)
    torch_err = max(float(np.abs(numerical[i][0].numpy().reshape(a.shape) - a).max())
                    for i, a in enumerate(analytic))

    times = interleaved({"ours": lambda: ours(graph), "torch": lambda: theirs(f, tw),
                         "gemm": lambda: square @ square}, reps=reps, warmup=max(warmup, 1), budget_s=budget_s)
    o, t = median(times["ours"]), median(times["torch"])
    rate = 2 * GEMM_N ** 3 / min(times["gemm"])  # the machine's best GEMM rate in this run
    floor = None if kind != "mlp" else 2 * elements * forward_flops(elements) / rate  # 2N forwards at that rate (the MLP only)
    return [f"{elements:,}" + (f" ({kind})" if kind != "mlp" else ""), torch.get_num_threads(), len(times["ours"]),
            fmt_s(min(times["ours"])), fmt_s(o), fmt_s(min(times["torch"])), fmt_s(t), f"{t / o:.1f}x",
            f"{rate / 1e9:.0f}", fmt_s(floor) if floor else "-", f"{o / floor:.2f}x" if floor else "-",
            f"{our_err:.1e}", f"{torch_err:.1e}", f"{engine_err:.1e}"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--threads", default="1,2",
                    help="comma-separated thread counts, each given to numpy's BLAS and torch alike; "
                         "2,000 elements run at each, 20,000 at the first only (default 1,2)")
    args = ap.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    rows = []
    for i, n in enumerate(counts):
        match_threads(n)
        # gradcheck raises if it finds a mismatch, so every timed torch call also checks
        rows.append(run(2_000, reps=3 if args.quick else 15, budget_s=60, warmup=1))
        if i == 0:  # torch: ~4 s a call with 1 thread, 30-100 s with 2 on a loaded machine
            rows.append(run(20_000, reps=1 if args.quick else 5, budget_s=60, warmup=0))
            rows.append(run(CNN_ELEMENTS, reps=1 if args.quick else 5, budget_s=60, warmup=0, kind="cnn"))
            rows.append(run(20_000, reps=1 if args.quick else 5, budget_s=60, warmup=0, kind="elementwise"))
    print("## bench_fd: full-Jacobian finite differences, ours vs torch.autograd.gradcheck(fast_mode=False)\n")
    print(f"machine: {machine()}\n")
    print(table(["parameter elements", "threads (numpy BLAS = torch)", "reps", "ours min", "ours median",
                 "torch gradcheck min", "torch gradcheck median", "speed-up (torch/ours, medians)",
                 "GEMM GFLOP/s (best)", "FLOP floor (2N forwards)", "ours/floor (median)", "our FD max error",
                 "torch FD max error", "engine grad max error"], rows))
    print("\nerrors: max |FD - analytic| over all elements, analytic = torch autograd float64")
    print("goals: speed-up >= 10x at 2,000 elements with our FD error <= torch's; at 20,000 >= 5x torch and "
          "<= 2x the FLOP floor (the GEMM FLOPs of 2N forwards at the best 1024^3 GEMM rate of the same run)")
    print(f"after the runs: {load()}")


if __name__ == "__main__":
    main()
