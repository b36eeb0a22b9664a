"""Activation memory and time of gradient checkpointing on deep chains.

For chains of n = 16 ... 1,024 layers of tanh(h @ W_i + b_i) (width 32, the
generator of examples/graphs/chain_256.json), one forward + backward under
each policy -- none, sqrt, every:4, and sqrt without the recompute check, to
show what the check costs -- measuring peak activation bytes (saved tensors
plus checkpoint values, as the engine holds them), peak live bytes, op
evaluations, and the min / median wall time of --repeats runs. Side by side, the
same chain in PyTorch (the peer): plain autograd vs
torch.utils.checkpoint.checkpoint_sequential with about sqrt(n) segments,
timed the same way (time only: torch on CPU offers no per-run measure of
activation bytes comparable to ours). Every policy and both torch runs alternate
within every round (order rotating, as harness.interleaved), so load hits all
alike; numpy's BLAS and torch get 1 thread (harness.match_threads). The machine
line (CPU, BLAS kernel and threads, load) heads the output.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_memory.py [--batch 32] [--repeats 9] [--max-layers 1024] [--quick]

BENCHMARKS.md's tables: the defaults (no options). --quick (a smoke run): n <= 64, 3 repeats, and
no plots written.

Writes markdown tables to stdout and bench/memory_activations.svg and
bench/memory_time.svg (log-log; medians). Goal: sqrt at n = 1,024 under 1/10 of the
activation memory of none for under 1.5x its time (medians).
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

sys.path.insert(0, str(ROOT / "bench"))
from harness import load, machine, match_threads  # noqa: E402

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import Program, backward, checkpoint_plan, forward, prepare_feeds  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.verify.plot import Series, line_plot  # noqa: E402

POLICIES = [("none", "none", True), ("sqrt", "sqrt", True), ("every:4", "every:4", True),
            ("sqrt, no check", "sqrt", False)]


def measure(program, feeds, repeats, peers=None):
    """Every policy (and each peer: label -> (run, after)) once per round, the order rotating
    round to round, so load from other processes hits all alike, after one unrecorded warm-up round.
    Seconds per run in "times"."""
    plans = {label: checkpoint_plan(program, policy, check=check) for label, policy, check in POLICIES}
    out = {label: {} for label in plans}
    cases = {}
    for label, plan in plans.items():
        def ours(label=label, plan=plan):
            tape = forward(program, NUMPY, feeds, checkpoint=plan)
            backward(tape)
            out[label].update(act=tape.store.saved.peak, live=tape.live.peak, evals=tape.op_evaluations)
        cases[label] = (ours, None)
    for label, (run, after) in (peers or {}).items():
        cases[f"torch {label}"] = (run, after)
    names = list(cases)
    times = {name: [] for name in names}
    for r in range(-1, repeats):  # round -1 warms up (first-call costs), not recorded
        for name in names[r % len(names):] + names[:r % len(names)]:
            run, after = cases[name]
            t0 = time.perf_counter()
            run()
            if r >= 0:
                times[name].append(time.perf_counter() - t0)
            if after is not None:
                after()
    for label in plans:
        out[label]["times"] = times[label]
    if peers:
        out["torch"] = {label: {"times": times[f"torch {label}"]} for label in peers}
    return out


def torch_peer(n, width, batch, segments):
    """The same chain in torch: {"plain": (run, after), "sqrt": (run, after)} (run: forward + backward,
    after: zero the gradients, untimed), or None without torch."""
    try:
        import torch
        from torch.utils.checkpoint import checkpoint_sequential
    except ImportError:
        return None
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
                                   for _ in range(n)]).double()
    x = torch.rand(batch, width, dtype=torch.float64)
    after = lambda: layers.zero_grad(set_to_none=True)  # noqa: E731
    return {"plain": (lambda: layers(x).sum().backward(), after),
            "sqrt": (lambda: checkpoint_sequential(layers, segments, x, use_reentrant=False).sum().backward(), after)}


def med(r):
    return statistics.median(r["times"])


def mm(r):
    """min / median ms."""
    return f"{min(r['times']) * 1e3:.1f} / {med(r) * 1e3:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--max-layers", type=int, default=1024)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--quick", action="store_true", help="n <= 64, 3 repeats, no plots (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.max_layers, args.repeats = min(args.max_layers, 64), 3
    match_threads(1)  # numpy's BLAS and torch alike: one core, comparable, less noisy
    ns = [n for n in (16, 32, 64, 128, 256, 512, 1024) if n <= args.max_layers]
    rows = {}
    for n in ns:
        graph = load_graph(chain(n, args.width, args.batch).build())
        program = Program(graph, np.float64)
        feeds = prepare_feeds(program, NUMPY)
        peers = None if args.no_torch else torch_peer(n, args.width, args.batch, max(1, round(math.sqrt(n))))
        rows[n] = measure(program, feeds, args.repeats, peers)
        print(f"n={n} done", file=sys.stderr)

    mb = lambda b: f"{b / 1e6:.3f}"  # noqa: E731
    print(f"machine: {machine()}\n")
    print(f"chain width {args.width}, batch {args.batch}, float64, NumPy; {args.repeats} interleaved rounds of "
          "forward + backward (every policy and the torch runs alternate within each round); times min / median ms, "
          "ratios of the medians; activations = peak bytes of saved tensors + checkpoint values\n")
    print("| n | none act MB | sqrt act MB | every:4 act MB | sqrt/none act | none ms | sqrt ms | every:4 ms "
          "| sqrt no-check ms | sqrt/none time | sqrt no-check/none time | sqrt evals/none |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        none, sq, e4, nc = r["none"], r["sqrt"], r["every:4"], r["sqrt, no check"]
        print(f"| {n} | {mb(none['act'])} | {mb(sq['act'])} | {mb(e4['act'])} | {sq['act'] / none['act']:.3f} "
              f"| {mm(none)} | {mm(sq)} | {mm(e4)} "
              f"| {mm(nc)} | {med(sq) / med(none):.2f} | {med(nc) / med(none):.2f} "
              f"| {sq['evals'] / none['evals']:.2f} |")
    if not args.no_torch and rows[ns[0]].get("torch"):
        print("\nPeer: PyTorch (one thread), same chain (nn.Linear + Tanh, float64), plain "
              "autograd vs checkpoint_sequential(use_reentrant=False) with round(sqrt(n)) segments, "
              "in the same rounds as ours; min / median ms, ratios of the medians\n")
        print("| n | torch plain ms | torch sqrt ms | torch sqrt/plain time | ours none ms | ours sqrt ms "
              "| ours sqrt/none time |")
        print("|---|---|---|---|---|---|---|")
        for n, r in rows.items():
            t = r["torch"]
            print(f"| {n} | {mm(t['plain'])} | {mm(t['sqrt'])} "
                  f"| {med(t['sqrt']) / med(t['plain']):.2f} | {mm(r['none'])} "
                  f"| {mm(r['sqrt'])} | {med(r['sqrt']) / med(r['none']):.2f} |")
    print(f"\nafter the run: {load()}")

    if args.quick:
        return
    for key, name, ylabel, scale in (("act", "memory_activations", "peak activation bytes", 1),
                                     ("time", "memory_time", "median ms (forward + backward)", 1e3)):
        value = (lambda r: r["act"]) if key == "act" else med
        series = [Series(label, ns, [value(rows[n][label]) * scale for n in ns]) for label, _, _ in POLICIES]
        line_plot(ROOT / "bench" / f"{name}.svg", series, logx=True, logy=True, xlabel="layers n",
                  ylabel=ylabel, title=f"chain of n tanh layers, width {args.width}, batch {args.batch}: {ylabel}")
    print("\nplots: bench/memory_activations.svg, bench/memory_time.svg", file=sys.stderr)

if __name__ == "__main__":
    main()
