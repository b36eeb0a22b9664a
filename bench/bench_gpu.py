"""GPU benchmark (issue 11): engine forward+backward on CuPy vs PyTorch CUDA eager, and the
cost of fingerprinting saved tensors on the device. Short by design: it runs inside
bench/gpu_check.sh's 6-minute budget on the one GPU session we get.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_gpu.py [--quick]

(BENCHMARKS.md's GPU numbers come from `bash bench/gpu_check.sh`, which runs this.)

Cases: the MLP of bench_engine.py at batch 4,096, width 4,096 (float32 and float64) and a
1,000-node elementwise chain; and the batched finite-difference check of a 1-million-element
parameter in projection mode (sum(tanh(x @ W)), W 1000x1000, 16 directions: the FD oracle runs
on the host in float64 by design, the engine's gradient comes from the device). Gradients are compared with torch's before anything is timed.
Without a CUDA device it says so and exits 0. --rehearse runs the same code on the strict CPU
stand-in against torch on the CPU, at --quick sizes, so gpu_check.sh is rehearsed on CPU
machines and the one GPU run is not spent on a typo.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gradcheck_svc.backend import cuda_available, get_backend  # noqa: E402


def timed(fn, sync, reps):
    fn()
    sync()  # warm-up: kernel compilation and the memory pool's first allocations
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


def run(name, case, dtype, reps, device="cuda"):
    import torch

    import bench_engine as be
    from gradcheck_svc.graph.validate import Limits

    backend = get_backend(device)
    tdev = "cuda" if device == "cuda" else "cpu"
    # the batch-4096 MLP holds ~130M elements, past the service's default request limit
    engine, eager = be.engine_and_torch(name, case, dtype, backend, tdev, limits=Limits(max_elements=1 << 31))
    sync = lambda: (backend.synchronize(), tdev == "cuda" and torch.cuda.synchronize())  # noqa: E731
    e, c, te = timed(engine, sync, reps), timed(lambda: engine("check"), sync, reps), timed(eager, sync, reps)
    print(f"{device:6s} {name:6s} {np.dtype(dtype).name:8s} engine {e * 1e3:9.2f} ms  torch {te * 1e3:9.2f} ms  "
          f"ratio {e / te:5.2f}x (goal <= 1.5x)  fingerprints +{(c / e - 1) * 100:5.1f}% (goal < 5%)", flush=True)


def fd_projection(n: int, device: str) -> None:
    """Projection-mode FD of an n x n parameter against the device engine's gradient."""
    from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
    from gradcheck_svc.graph import load_graph
    from gradcheck_svc.graph.build import GraphBuilder
    from gradcheck_svc.graph.validate import Limits
    from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences

    rng = np.random.default_rng(3)
    b = GraphBuilder(f"fd_projection_{n}")
    prod = b.node("matmul", b.input("x", rng.standard_normal((64, n)) / np.sqrt(n)),
                  b.input("W", rng.standard_normal((n, n)) / np.sqrt(n), True))
    b.output(b.node("sum", b.node("tanh", prod), name="L"))
    graph = load_graph(b.build(), limits=Limits(max_elements=1 << 31))
    backend = get_backend(device)
    program = Program(graph, np.float64)
    t0 = time.perf_counter()
    g = backend.to_host(backward(forward(program, backend, prepare_feeds(program, backend)))["W"])
    t1 = time.perf_counter()
    result = FiniteDifferences(graph, FDOptions(mode="projection", directions=16)).gradient("W")
    t2 = time.perf_counter()
    err = float(np.max(np.abs(result.directions @ g.reshape(-1) - result.reference)))
    print(f"{device:6s} fd-projection {n * n:,} elements: engine gradient {(t1 - t0) * 1e3:.1f} ms, "
          f"FD {result.evaluations} forwards {(t2 - t1) * 1e3:.1f} ms, max |g.v - FD| {err:.1e} "
          f"(noise {float(np.max(result.noise)):.1e})", flush=True)
    assert err <= 10 * float(np.max(result.noise)) + 1e-9, "projection FD disagrees with the engine"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 512, width 512, 200-node chain, 3 repetitions")
    ap.add_argument("--rehearse", action="store_true", help="on the strict CPU stand-in vs torch CPU, quick sizes")
    args = ap.parse_args(argv)
    device = "strict" if args.rehearse else "cuda"
    args.quick = args.quick or args.rehearse
    if device == "cuda" and not cuda_available():
        print("bench_gpu: no CUDA device on this machine; GPU benchmark skipped")
        return 0
    import bench_engine as be

    be.BATCH, be.WIDTH = (512, 512) if args.quick else (4096, 4096)
    be.CHAIN_NODES, be.CHAIN_WIDTH = (200, 1 << 16) if args.quick else (1000, 1 << 20)
    reps = 3 if args.quick else 10
    rng = np.random.default_rng(0)
    mlp, chain = be.mlp_case(rng), be.chain_case(rng)
    for dtype in (np.float32, np.float64):
        run("mlp", mlp, dtype, reps, device)
        run("chain", chain, dtype, reps, device)
    fd_projection(300 if args.quick else 1000, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
