"""Diagnosis benchmarks.

1. Saved-tensor integrity overhead: engine forward+backward with integrity
   "off" vs "check" (fingerprint every saved tensor at save, again at load),
   on the core benchmark's graphs: an MLP (3 x 1024, batch 256, cross-entropy)
   and a 200-node chain of small elementwise ops. Goal: under 10%.
2. Localization cost: verify() of a 50-node graph with a planted wrong
   derivative rule, with and without localization; reported as the
   diagnosis time over the rest of the verification. Goal: under 3x.

Runs are interleaved (off, check, off, check, ...) and medians reported.

    PYTHONPATH=.:clients/python python bench/bench_diagnosis.py [--device cpu|cuda] [--repeats N] [--quick]
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


def planted_50():
    """A 50-node graph (matmul, then sin / mul / tanh) with a wrong derivative rule at node 31."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("planted50")
    h = b.node("matmul", b.input("x", rng.uniform(-1, 1, (8, 16))),
               b.input("W", rng.uniform(-1, 1, (16, 16)), requires_grad=True), name="n0")
    a = b.input("a", rng.uniform(0.5, 1.5, 16), requires_grad=True)
    for i in range(1, 49):
        op = "buggy_square" if i == 31 else ["sin", "mul", "tanh"][i % 3]
        h = b.node(op, h, a, name=f"n{i}") if op == "mul" else b.node(op, h, name=f"n{i}")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


def localization_cost(repeats):
    register(dataclasses.replace(get_op("square"), name="buggy_square",
                                 vjp=lambda xp, g, saved, **_: (g * 3.0 * saved[0],)))
    try:
        graph = planted_50()
        verify(graph)
        plain, with_loc, diag = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            verify(graph, VerifyOptions(localize=False))
            plain.append(time.perf_counter() - t0)
            r = verify(graph)
            with_loc.append(r.timings["total_s"])
            diag.append(r.timings["diagnosis_s"])
        [f] = r.findings
        p, w, d = statistics.median(plain), statistics.median(with_loc), statistics.median(diag)
        return {"graph": graph.name, "nodes": len(graph.nodes), "finding": f"{f.node} ({f.op}): {f.cause}",
                "verify_ms": p * 1e3, "verify_with_localization_ms": w * 1e3, "localization_ms": d * 1e3,
                "localization_over_verification": d / p, "total_ratio": w / p}
    finally:
        del REGISTRY["buggy_square"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="a smaller MLP (width 256) for a fast look")
    args = ap.parse_args()
    backend = get_backend(args.device)
    out = {"device": args.device, "integrity": [], "localization": None}
    graphs = [mlp(256 if args.quick else 1024), chain()]
    for g in graphs:
        for dtype in (np.float32, np.float64):
            out["integrity"].append(integrity_overhead(g, backend, args.repeats, dtype))
    if args.device == "cpu":
        out["localization"] = localization_cost(args.repeats)
    for row in out["integrity"]:
        print(f"integrity  {row['graph']:<6} {row['dtype']:<8} off {row['off_ms']:8.2f} ms  check "
              f"{row['check_ms']:8.2f} ms  overhead {100 * row['overhead']:+.1f}%")
    loc = out["localization"]
    if loc:
        print(f"localize   {loc['graph']} ({loc['nodes']} nodes, found {loc['finding']}): verify "
              f"{loc['verify_ms']:.1f} ms, localization {loc['localization_ms']:.1f} ms = "
              f"{loc['localization_over_verification']:.2f}x one verification")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
