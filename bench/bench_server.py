"""Server throughput and latency vs in-process verification.

For the seed graph and an MLP-sized graph: in-process `verify()` latency (the
peer), then a real `gradcheck-svc serve` on loopback driven by 1, 8 and 64
concurrent asyncio clients (one client process). Reports verifications/s,
p50/p99 latency, p99/p50 (starvation), and the server's overhead over
in-process verification at p50 with one client.

    python bench/bench_server.py [--workers N] [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]

from gradcheck_client import AsyncClient, Tracer, load_graph, ops  # noqa: E402
from gradcheck_svc.graph import validate  # noqa: E402
from gradcheck_svc.server.launcher import LocalServer  # noqa: E402
from gradcheck_svc.verify import verify  # noqa: E402


def mlp_graph():
    """x(16x32) -> tanh(x W1 + b1) (64) -> W2 (10) -> mean squared output: 2,762 parameters."""
    rng = np.random.default_rng(0)
    t = Tracer("mlp")
    x = t.input("x", rng.standard_normal((16, 32)))
    h = ops.tanh(x @ t.param("W1", rng.standard_normal((32, 64)) / 6) + t.param("b1", np.zeros(64)))
    y = h @ t.param("W2", rng.standard_normal((64, 10)) / 8) + t.param("b2", np.zeros(10))
    return t.graph((y * y).mean())


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def in_process(graph, n):
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        verify(validate(graph))
        lat.append(time.perf_counter() - t0)
    return lat


async def drive(target, graph, clients, per_client):
    lat = []
    async with AsyncClient(target, timeout=600) as c:
        await c.verify(graph)  # warm the channel and the workers

        async def one():
            for _ in range(per_client):
                t0 = time.perf_counter()
                await c.verify(graph)
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return lat, wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    args = ap.parse_args()
    scale = 0.2 if args.quick else 1.0
    graphs = {"seed": load_graph(ROOT / "examples" / "graphs" / "seed.json"), "mlp": mlp_graph()}
    budget = {"seed": 400, "mlp": 64}  # requests per concurrency level
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:2] + [os.environ.get("PYTHONPATH", "")]))
    rows = []
    with LocalServer("--workers", str(args.workers), "--max-queue", "256", env=env) as server:
        for name, graph in graphs.items():
            n = max(8, int(budget[name] * scale))
            peer = in_process(graph, n)
            base = statistics.median(peer)
            rows.append((name, "in-process", 1, n / sum(peer), base, pct(peer, 99), None))
            for clients in (1, 8, 64):
                per = max(1, n // clients)
                lat, wall = asyncio.run(drive(server.target, graph, clients, per))
                p50 = statistics.median(lat)
                rows.append((name, "server", clients, len(lat) / wall, p50, pct(lat, 99),
                             p50 - base if clients == 1 else None))
    print(f"workers={args.workers}, cpus={os.cpu_count()}, client and server on the same machine\n")
    print("| graph | mode | clients | verif/s | p50 ms | p99 ms | p99/p50 | overhead p50 ms (ratio) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    base = {}
    for name, mode, clients, tput, p50, p99, over in rows:
        if mode == "in-process":
            base[name] = p50
        ratio = f"{over * 1e3:.2f} ({p50 / base[name]:.2f}x)" if over is not None else ""
        print(f"| {name} | {mode} | {clients} | {tput:.0f} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} | "
              f"{p99 / p50:.2f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
