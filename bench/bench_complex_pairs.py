"""Issue 43 item 3, the cost complex steps buy back, measured on one thread:

1. A joint screen's complex forward (every parameter perturbed, 16 copies; forward_batched on complex128) with
   matmul and conv written out on (real, imaginary) pairs (executor.multilinear_step: the base's output as the
   real part, the imaginary part as real products) against NumPy's complex products (the pair path switched
   off), and against one real batched forward of the same copies (central differences need two).
2. The matmul VJP for x[S, 1, D] @ W[D, N]: W's gradient as one product over the batch (ops/linalg.py) against
   the [S, D, N] stack of outer products summed afterwards (the rule before), and torch.
3. A whole verification's peak (tracemalloc) over the engine's training peak, per method, on the CNN that
   tests/verify/test_memory_verification.py bounds.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=.:clients/python .venv/bin/python \
        bench/bench_complex_pairs.py [--reps 7]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import interleaved, machine, match_threads, min_med, table  # noqa: E402
from plants import mlp  # noqa: E402

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import executor  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.build import GraphBuilder  # noqa: E402
from gradcheck_svc.ops.registry import REGISTRY  # noqa: E402
from gradcheck_svc.oracles.finite_diff import FiniteDifferences  # noqa: E402

COPIES = 16


def cnn():
    """conv 3->16 -> relu -> conv 16->16 -> relu -> max-pool -> matmul 10 on 4 images 16x16."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("cnn")
    h = b.input("x", rng.uniform(-1, 1, (4, 3, 16, 16)))
    for i, (c, m) in enumerate([(3, 16), (16, 16)]):
        w = b.input(f"W{i}", rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c), requires_grad=True)
        h = b.node("relu", b.node("conv", h, w, b.input(f"b{i}", rng.uniform(-0.1, 0.1, m), requires_grad=True),
                                  pads=[1, 1, 1, 1]))
    h = b.node("reshape", b.node("max_pool", h, kernel_shape=[2, 2], strides=[2, 2]), shape=[4, -1])
    w = b.input("Wf", rng.standard_normal((16 * 64, 10)) / 32, requires_grad=True)
    b.output(b.node("sum", b.node("tanh", b.node("matmul", h, w)), name="L"))
    return load_graph(b.build())


def joint_forward(graph, dtype):
    """A callable: the loss of COPIES copies of every parameter perturbed at once (complex: by i h v)."""
    fd = FiniteDifferences(graph)
    rng = np.random.default_rng(1)
    over = {}
    for p in fd.program.params:
        x = np.asarray(fd.base[p], dtype=np.float64)
        v = rng.standard_normal((COPIES,) + x.shape)
        over[p] = x + (1j * 2.0 ** -64 * v if dtype == "complex" else 1e-6 * v)
    return lambda: executor.forward_batched(fd.program, NUMPY, fd.base, over, frozen=fd.frozen,
                                            complex_steps=dtype == "complex")


def part_one(reps):
    pairs = executor.multilinear_step
    rows = []
    for name, graph in [("MLP 256 wide, 3 layers, batch 32", mlp(width=256, depth=3, batch=32)), ("CNN", cnn())]:
        complex_fn, real_fn = joint_forward(graph, "complex"), joint_forward(graph, "real")

        def plain():
            executor.multilinear_step = lambda *a: None
            try:
                complex_fn()
            finally:
                executor.multilinear_step = pairs
        t = interleaved({"pairs": complex_fn, "plain": plain, "real": real_fn}, reps)
        rows.append([name, min_med(t["plain"]), min_med(t["pairs"]), min_med(t["real"]),
                     f"{np.median(t['plain']) / np.median(t['pairs']):.2f}x"])
    print(table(["model (16 copies, every parameter)", "complex products (before)", "real pairs (after)",
                 "one real forward", "before / after"], rows))


def part_two(reps, s=512, d=256, n=256):
    import torch
    rng = np.random.default_rng(2)
    x, w, g = rng.standard_normal((s, 1, d)), rng.standard_normal((d, n)), rng.standard_normal((s, 1, n))
    op = REGISTRY["matmul"]

    def stack():  # the rule before: the [S, D, N] outer products, then the engine's sum over the batch
        return np.matmul(g, w.T), np.matmul(np.swapaxes(x, -1, -2), g).sum(axis=0)
    tx, tw, tg = (torch.tensor(a, requires_grad=True) for a in (x, w, g))
    ty = torch.matmul(tx, tw)
    ga, gb = op.vjp(np, g, (x, w), ranks=(3, 2))
    assert np.allclose(gb, stack()[1]) and np.allclose(gb, torch.autograd.grad(ty, tw, tg, retain_graph=True)[0])
    t = interleaved({"stack": stack, "one": lambda: op.vjp(np, g, (x, w), ranks=(3, 2)),
                     "torch": lambda: torch.autograd.grad(ty, (tx, tw), tg, retain_graph=True)}, reps)
    print(table([f"matmul VJP x[{s},1,{d}] @ W[{d},{n}]", "min / median", "median / torch's"],
                [[k, min_med(t[k]), f"{np.median(t[k]) / np.median(t['torch']):.2f}x"]
                 for k in ("stack", "one", "torch")]))


def part_three():
    import tracemalloc

    from plants import cnn as plants_cnn

    from gradcheck_svc.oracles.fd_plan import FDOptions
    from gradcheck_svc.verify import VerifyOptions, verify
    rows = []
    for method in ("complex", "central"):
        options = VerifyOptions(fd=FDOptions(method=method))
        verify(plants_cnn(4, 4, 1, 8), options)  # first-use allocations out of the way
        tracemalloc.start()
        report = verify(plants_cnn(32, 64, 4, 48), options)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        training = report.memory["training_peak_bytes"]
        rows.append([method, f"{peak / 2**20:.1f} MiB", f"{training / 2**20:.2f} MiB", f"{peak / training:.2f}x"])
    print(table(["CNN verification (fd_method)", "peak", "training peak", "ratio"], rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run (2 repetitions): bench/run_all.py --quick")
    args = ap.parse_args()
    if args.quick:
        args.reps = 2
    match_threads(1)
    print(machine())
    part_one(args.reps)
    part_two(args.reps)
    part_three()


if __name__ == "__main__":
    main()
