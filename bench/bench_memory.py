"""Activation memory and time of gradient checkpointing on deep chains.

For chains of n = 16 ... 1,024 layers of tanh(h @ W_i + b_i) (width 32, the
generator of examples/graphs/chain_256.json), one forward + backward under
each policy -- none, sqrt, every:4, and sqrt without the recompute check, to
show what the check costs -- measuring peak activation bytes (saved tensors
plus checkpoint values, as the engine holds them), peak live bytes, op
evaluations, and the median wall time of --repeats runs. Side by side, the
same chain in PyTorch (the peer): plain autograd vs
torch.utils.checkpoint.checkpoint_sequential with about sqrt(n) segments,
timed the same way (time only: torch on CPU offers no per-run measure of
activation bytes comparable to ours).

    OPENBLAS_NUM_THREADS=1 python bench/bench_memory.py [--batch 32] [--repeats 9] [--max-layers 1024]

Writes a markdown table to stdout and bench/memory_activations.svg and
bench/memory_time.svg (log-log). Goal: sqrt at n = 1,024 under 1/10 of the
activation memory of none for under 1.5x its time.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from gen_chain import chain  # noqa: E402

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import Program, backward, checkpoint_plan, forward, prepare_feeds  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.verify.plot import Series, line_plot  # noqa: E402

POLICIES = [("none", "none", True), ("sqrt", "sqrt", True), ("every:4", "every:4", True),
            ("sqrt, no check", "sqrt", False)]


def measure(program, feeds, repeats):
    """Every policy once per round, rounds interleaved, so load from other processes hits all alike."""
    plans = {label: checkpoint_plan(program, policy, check=check) for label, policy, check in POLICIES}
    times = {label: [] for label in plans}
    out = {}
    for _ in range(repeats):
        for label, plan in plans.items():
            t0 = time.perf_counter()
            tape = forward(program, NUMPY, feeds, checkpoint=plan)
            backward(tape)
            times[label].append(time.perf_counter() - t0)
            out[label] = {"act": tape.store.saved.peak, "live": tape.live.peak, "evals": tape.op_evaluations}
    for label in plans:
        out[label]["time"] = statistics.median(times[label])
    return out


def torch_peer(n, width, batch, repeats, segments):
    """Median time of the same chain in torch, plain and checkpoint_sequential."""
    try:
        import torch
        from torch.utils.checkpoint import checkpoint_sequential
    except ImportError:
        return None
    torch.manual_seed(0)
    torch.set_num_threads(1)  # like our NumPy run (OPENBLAS_NUM_THREADS=1): one core, comparable, less noisy
    layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
                                   for _ in range(n)]).double()
    x = torch.rand(batch, width, dtype=torch.float64)
    out = {}
    for label, run in (("plain", lambda: layers(x)),
                       ("sqrt", lambda: checkpoint_sequential(layers, segments, x, use_reentrant=False))):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run().sum().backward()
            times.append(time.perf_counter() - t0)
            layers.zero_grad(set_to_none=True)
        out[label] = {"time": statistics.median(times)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--max-layers", type=int, default=1024)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    ns = [n for n in (16, 32, 64, 128, 256, 512, 1024) if n <= args.max_layers]
    rows = {}
    for n in ns:
        graph = load_graph(chain(n, args.width, args.batch).build())
        program = Program(graph, np.float64)
        feeds = prepare_feeds(program, NUMPY)
        rows[n] = measure(program, feeds, args.repeats)
        if not args.no_torch:
            rows[n]["torch"] = torch_peer(n, args.width, args.batch, args.repeats, max(1, round(math.sqrt(n))))
        print(f"n={n} done", file=sys.stderr)

    mb = lambda b: f"{b / 1e6:.3f}"  # noqa: E731
    print(f"chain width {args.width}, batch {args.batch}, float64, NumPy; median of {args.repeats} runs of "
          "forward + backward; activations = peak bytes of saved tensors + checkpoint values\n")
    print("| n | none act MB | sqrt act MB | every:4 act MB | sqrt/none act | none ms | sqrt ms | every:4 ms "
          "| sqrt no-check ms | sqrt/none time | sqrt no-check/none time | sqrt evals/none |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        none, sq, e4, nc = r["none"], r["sqrt"], r["every:4"], r["sqrt, no check"]
        print(f"| {n} | {mb(none['act'])} | {mb(sq['act'])} | {mb(e4['act'])} | {sq['act'] / none['act']:.3f} "
              f"| {none['time'] * 1e3:.1f} | {sq['time'] * 1e3:.1f} | {e4['time'] * 1e3:.1f} "
              f"| {nc['time'] * 1e3:.1f} | {sq['time'] / none['time']:.2f} | {nc['time'] / none['time']:.2f} "
              f"| {sq['evals'] / none['evals']:.2f} |")
    if not args.no_torch and rows[ns[0]].get("torch"):
        print("\nPeer: PyTorch (one thread), same chain (nn.Linear + Tanh, float64), plain "
              "autograd vs checkpoint_sequential(use_reentrant=False) with round(sqrt(n)) segments\n")
        print("| n | torch plain ms | torch sqrt ms | torch sqrt/plain time | ours none ms | ours sqrt ms "
              "| ours sqrt/none time |")
        print("|---|---|---|---|---|---|---|")
        for n, r in rows.items():
            t = r["torch"]
            print(f"| {n} | {t['plain']['time'] * 1e3:.1f} | {t['sqrt']['time'] * 1e3:.1f} "
                  f"| {t['sqrt']['time'] / t['plain']['time']:.2f} | {r['none']['time'] * 1e3:.1f} "
                  f"| {r['sqrt']['time'] * 1e3:.1f} | {r['sqrt']['time'] / r['none']['time']:.2f} |")

    for key, name, ylabel, scale in (("act", "memory_activations", "peak activation bytes", 1),
                                     ("time", "memory_time", "median ms (forward + backward)", 1e3)):
        series = [Series(label, ns, [rows[n][label][key] * scale for n in ns]) for label, _, _ in POLICIES]
        line_plot(ROOT / "bench" / f"{name}.svg", series, logx=True, logy=True, xlabel="layers n",
                  ylabel=ylabel, title=f"chain of n tanh layers, width {args.width}, batch {args.batch}: {ylabel}")
    print("\nplots: bench/memory_activations.svg, bench/memory_time.svg", file=sys.stderr)


if __name__ == "__main__":
    main()
