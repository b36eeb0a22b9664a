"""Server throughput and latency vs in-process verification, in one interleaved run.

For the seed graph and an MLP-sized graph: in-process `verify()` latency (the
peer) and a real `gradcheck-svc serve` on loopback driven by 1, 8 and 64
concurrent asyncio clients (one client process, one channel). The four cases
alternate within every round (harness.interleaved: the order rotates round to
round), so background load hits them alike; each round runs about 1/--rounds of
each case's requests. Reports verifications/s, min/p50/p99 latency over every
request of every round, p99/p50 (starvation), and the server's overhead over
in-process verification at p50 with one client; the machine line above the table.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_server.py [--workers N] [--rounds 5] [--quick]

BENCHMARKS.md's table: `--workers 2 --rounds 5` (--workers defaults to the CPU count).
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
sys.path.insert(2, str(ROOT / "bench"))

from gradcheck_client import AsyncClient, Tracer, load_graph, ops  # noqa: E402
from gradcheck_svc.graph import validate  # noqa: E402
from gradcheck_svc.server.launcher import LocalServer  # noqa: E402
from gradcheck_svc.verify import verify  # noqa: E402
from harness import interleaved, load, machine  # noqa: E402


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


async def drive(client, graph, clients, per_client):
    """clients concurrent callers, per_client requests each: (latencies, wall seconds)."""
    lat = []

    async def one():
        for _ in range(per_client):
            t0 = time.perf_counter()
            await client.verify(graph)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return lat, time.perf_counter() - t0


async def _open(target):
    return AsyncClient(target, timeout=600)  # created inside the loop that will use its channel


def measure(loop, client, graph, n, rounds):
    """In-process and server at 1, 8 and 64 clients, interleaved: {case: (latencies, wall seconds)}."""
    lat = {case: [] for case in ("in-process", 1, 8, 64)}
    wall = dict.fromkeys(lat, 0.0)

    def inproc():
        xs = in_process(graph, max(1, math.ceil(n / rounds)))
        lat["in-process"] += xs
        wall["in-process"] += sum(xs)

    def server(clients):
        per = max(1, math.ceil(max(1, n // clients) / rounds))
        xs, w = loop.run_until_complete(drive(client, graph, clients, per))
        lat[clients] += xs
        wall[clients] += w

    cases = {"in-process": inproc, **{f"server {c}": (lambda c=c: server(c)) for c in (1, 8, 64)}}
    for fn in cases.values():  # warm-up: the channel, the workers, the caches; not measured
        fn()
    for case in lat:
        lat[case].clear()
        wall[case] = 0.0
    interleaved(cases, reps=rounds, warmup=0)
    return {case: (lat[case], wall[case]) for case in lat}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5; --quick: 2)")
    ap.add_argument("--quick", action="store_true", help="fewer requests and 2 rounds (a smoke run)")
    args = ap.parse_args()
    scale = 0.2 if args.quick else 1.0
    rounds = 2 if args.quick else args.rounds
    graphs = {"seed": load_graph(ROOT / "examples" / "graphs" / "seed.json"), "mlp": mlp_graph()}
    budget = {"seed": 400, "mlp": 64}  # requests per concurrency level
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:2] + [os.environ.get("PYTHONPATH", "")]))
    rows = []
    with LocalServer("--workers", str(args.workers), "--max-queue", "256", env=env) as server:
        loop = asyncio.new_event_loop()
        client = loop.run_until_complete(_open(server.target))
        try:
            for name, graph in graphs.items():
                n = max(8, int(budget[name] * scale))
                res = measure(loop, client, graph, n, rounds)
                peer, peer_wall = res["in-process"]
                base = statistics.median(peer)
                rows.append((name, "in-process", 1, peer, len(peer) / peer_wall, None))
                for clients in (1, 8, 64):
                    lat, wall = res[clients]
                    rows.append((name, "server", clients, lat, len(lat) / wall,
                                 statistics.median(lat) - base if clients == 1 else None))
        finally:
            loop.run_until_complete(client.close())
            loop.close()
    print("## bench_server: gRPC server vs in-process verification, one interleaved run\n")
    print(f"machine: {machine()}\n")
    print(f"workers={args.workers} (server processes), {rounds} interleaved rounds, client and server on the same "
          "machine; latency min / p50 / p99 over every request of every round\n")
    print("| graph | mode | clients | requests | verif/s | min ms | p50 ms | p99 ms | p99/p50 | "
          "overhead p50 ms (ratio) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    base = {}
    for name, mode, clients, lat, tput, over in rows:
        p50, p99 = statistics.median(lat), pct(lat, 99)
        if mode == "in-process":
            base[name] = p50
        ratio = f"{over * 1e3:.2f} ({p50 / base[name]:.2f}x)" if over is not None else ""
        print(f"| {name} | {mode} | {clients} | {len(lat)} | {tput:.0f} | {min(lat) * 1e3:.2f} | {p50 * 1e3:.2f} | "
              f"{p99 * 1e3:.2f} | {p99 / p50:.2f} | {ratio} |")
    print(f"\nafter the run: {load()}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
