"""Diagnosis benchmarks.

1. Saved-tensor integrity overhead: engine forward+backward with integrity
   "off" vs "check" (fingerprint every saved tensor at save, again at load),
   on the core benchmark's graphs: an MLP (3 x 1024, batch 256, cross-entropy)
   and a 200-node chain of small elementwise ops. Goal: under 10%.
2. Diagnosis cost: verify() of 50- and 200-node chains with 1 and 3 planted
   wrong derivative rules: the diagnosis time (timings.diagnosis_s, every
   culprit named) as a multiple of one verification without localization.
   Goal: within 3x.

Runs are interleaved (off, check, off, check, ...) and medians reported.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_diagnosis.py [--device cpu|cuda] [--repeats N] [--quick]
                                                                          [--localization-only]

BENCHMARKS.md's issue-4 tables: `--repeats 31`; its issue-16 localization table:
`--localization-only --repeats 15`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np

from gradcheck_svc.backend import get_backend
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import get_op
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify


def mlp(width=1024, layers=3, batch=256, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mlp")
    h = b.input("x", rng.standard_normal((batch, width)))
    for i in range(layers):
        w = b.input(f"W{i}", rng.standard_normal((width, width)) / np.sqrt(width), requires_grad=True)
        bias = b.input(f"b{i}", np.zeros(width), requires_grad=True)
        h = b.node("relu", b.node("add", b.node("matmul", h, w), bias))
    wo = b.input("Wo", rng.standard_normal((width, classes)) / np.sqrt(width), requires_grad=True)
    logits = b.node("matmul", h, wo, name="logits")
    b.output(b.node("cross_entropy", logits, b.input("y", rng.integers(0, classes, batch)), name="loss"))
    return load_graph(b.build())


def chain(n=200, size=64, seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("chain")
    h = b.input("x", rng.uniform(-1, 1, size), requires_grad=True)
    a = b.input("a", rng.uniform(0.5, 1.5, size), requires_grad=True)
    ops = ["sin", "mul", "tanh", "add", "sigmoid"]
    for i in range(n - 1):
        op = ops[i % len(ops)]
        h = b.node(op, h, a) if op in ("mul", "add") else b.node(op, h)
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


def time_engine(program, backend, integrity):
    feeds = prepare_feeds(program, backend)
    backend.synchronize()
    t0 = time.perf_counter()
    tape = forward(program, backend, feeds, integrity=integrity)
    backward(tape)
    backend.synchronize()
    return time.perf_counter() - t0


def integrity_overhead(graph, backend, repeats, dtype):
    program = Program(graph, dtype)
    for mode in ("off", "check"):  # warm-up
        time_engine(program, backend, mode)
    times = {"off": [], "check": []}
    for _ in range(repeats):
        for mode in ("off", "check"):
            times[mode].append(time_engine(program, backend, mode))
    off, check = statistics.median(times["off"]), statistics.median(times["check"])
    return {"graph": graph.name, "dtype": np.dtype(dtype).name, "off_ms": off * 1e3, "check_ms": check * 1e3,
            "overhead": check / off - 1.0}


def planted(nodes=50, bugs=(31,)):
    """A chain of `nodes` nodes (matmul, then sin / mul / tanh) with a wrong derivative rule
    (buggy_square: 3x instead of 2x) at each position in `bugs`."""
    rng = np.random.default_rng(7)
    b = GraphBuilder(f"planted{nodes}x{len(bugs)}")
    h = b.node("matmul", b.input("x", rng.uniform(-1, 1, (8, 16))),
               b.input("W", rng.uniform(-1, 1, (16, 16)), requires_grad=True), name="n0")
    a = b.input("a", rng.uniform(0.5, 1.5, 16), requires_grad=True)
    for i in range(1, nodes - 1):
        op = "buggy_square" if i in bugs else ["sin", "mul", "tanh"][i % 3]
        h = b.node(op, h, a, name=f"n{i}") if op == "mul" else b.node(op, h, name=f"n{i}")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


# (nodes, bug positions): one bug, and three spread along the chain (all on every parameter's path)
LOCALIZATION_CASES = [(50, (31,)), (50, (10, 25, 40)), (200, (131,)), (200, (40, 100, 160))]


def localization_cost(repeats):
    """Per case: one verification without localization (the unit), and the diagnosis time of a
    verification with it (timings.diagnosis_s), interleaved; min and median of each."""
    register(dataclasses.replace(get_op("square"), name="buggy_square",
                                 vjp=lambda xp, g, saved, **_: (g * 3.0 * saved[0],)))
    rows = []
    try:
        for nodes, bugs in LOCALIZATION_CASES:
            graph = planted(nodes, bugs)
            verify(graph)  # warm-up
            plain, diag = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                verify(graph, VerifyOptions(localize=False))
                plain.append(time.perf_counter() - t0)
                r = verify(graph)
                diag.append(r.timings["diagnosis_s"])
            named = sorted(f.node for f in r.findings if f.cause == "rule_error")
            assert named == sorted(f"n{i}" for i in bugs), named  # every culprit, nothing else
            rows.append({"graph": graph.name, "nodes": len(graph.nodes), "bugs": len(bugs), "named": named,
                         "verify_min_ms": min(plain) * 1e3, "verify_median_ms": statistics.median(plain) * 1e3,
                         "diagnosis_min_ms": min(diag) * 1e3, "diagnosis_median_ms": statistics.median(diag) * 1e3,
                         "ratio_min": min(diag) / min(plain),
                         "ratio_median": statistics.median(diag) / statistics.median(plain)})
        return rows
    finally:
        del REGISTRY["buggy_square"]


def machine():
    """What the numbers ran on: CPU model, BLAS kernel and threads (threadpoolctl), load."""
    import os
    import platform

    cpu = platform.processor() or "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = []
    try:
        from threadpoolctl import threadpool_info
        blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, {i.get('num_threads')} threads)"
                for i in threadpool_info()]
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "blas": blas, "load": os.getloadavg(),
            "python": platform.python_version(), "numpy": np.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="a smaller MLP (width 256) for a fast look")
    ap.add_argument("--localization-only", action="store_true", help="skip the integrity overhead runs")
    args = ap.parse_args()
    backend = get_backend(args.device)
    out = {"device": args.device, "machine": machine(), "integrity": [], "localization": None}
    if not args.localization_only:
        graphs = [mlp(256 if args.quick else 1024), chain()]
        for g in graphs:
            for dtype in (np.float32, np.float64):
                out["integrity"].append(integrity_overhead(g, backend, args.repeats, dtype))
    if args.device == "cpu":
        out["localization"] = localization_cost(args.repeats)
    for row in out["integrity"]:
        print(f"integrity  {row['graph']:<6} {row['dtype']:<8} off {row['off_ms']:8.2f} ms  check "
              f"{row['check_ms']:8.2f} ms  overhead {100 * row['overhead']:+.1f}%")
    for row in out["localization"] or ():
        print(f"diagnose   {row['nodes']:>3} nodes, {row['bugs']} bug(s) (named {', '.join(row['named'])}): "
              f"verify min {row['verify_min_ms']:.1f} / median {row['verify_median_ms']:.1f} ms; diagnosis min "
              f"{row['diagnosis_min_ms']:.1f} / median {row['diagnosis_median_ms']:.1f} ms = "
              f"{row['ratio_min']:.2f}x / {row['ratio_median']:.2f}x one verification")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
