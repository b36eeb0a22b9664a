"""Engine forward+backward vs PyTorch CPU eager, same graphs, same process.

Three graphs, each run in float32 and float64:
  mlp   x[256,1024] -> 3 x (matmul 1024x1024 + bias, relu) -> matmul 1024x10 + bias -> cross_entropy
  ffn   a transformer block's feed-forward at sequence 128, width 256: x[128,256] -> matmul 256x1024 + bias,
        exact (erf) gelu -> matmul 1024x256 + bias -> sum of squares. Its cost beyond the two GEMMs is
        gelu's erf and derivative: the table that shows whether the special function keeps up with torch
  chain 200 small elementwise nodes on a 16-vector (tanh, add, sin, mul, exp, neg, cos, sub;
        add/mul/sub read a second parameter w, so w has 75 consumers) -> sum. This op order
        keeps the gradients well scaled: with sigmoid in the cycle dL/dx vanished to 1e-51, and
        float32 runs slowed 1.3-2x once values went subnormal.

What is timed, per repetition: engine `backward(forward(program, NUMPY, feeds, integrity=...))`
(the Program compiled and the feeds placed once, as torch's tensors are created once) against
torch `autograd.grad(model(x), params)`. The engine runs twice per repetition: integrity "off"
(forward's default: the plain engine, memory metered as always) and integrity "check" (what a
verification run uses by default: saved tensors fingerprinted at save and at load). The three
alternate within every repetition; min / median are reported, ratios of the medians. numpy's
BLAS and torch get the same thread count (threadpoolctl): one table per count of --threads
(default 1,2), the 1-thread table first; each table has its machine line (CPU, BLAS kernel and
threads, torch threads, load).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=.:clients/python .venv/bin/python bench/bench_engine.py \
        [--quick] [--threads 1,2] [--only mlp|chain] [--baseline DIR]

BENCHMARKS.md's engine table: no options (`--threads 1,2`); its before/after table:
`--only chain --baseline /tmp/base`. (`env -u`: see bench_goals.py.)

--baseline DIR: also time the engine of another checkout (DIR holds its gradcheck_svc/,
e.g. `git archive COMMIT gradcheck_svc | tar -x -C DIR`), imported under another name and
interleaved with the rest, for before/after ratios measured in the same process.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, load, machine, match_threads, median, min_med, table, thread_counts  # noqa: E402

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.build import GraphBuilder  # noqa: E402

BATCH, WIDTH, DEPTH, CLASSES = 256, 1024, 3, 10
CHAIN_NODES, CHAIN_WIDTH = 200, 16
CHAIN_OPS = ["tanh", "add", "sin", "mul", "exp", "neg", "cos", "sub"]  # mul/add/sub take w


def mlp_case(rng):
    x = rng.standard_normal((BATCH, WIDTH))
    labels = rng.integers(0, CLASSES, size=BATCH)
    dims = [WIDTH] * (DEPTH + 1) + [CLASSES]
    params = {}
    for i in range(DEPTH + 1):
        params[f"W{i}"] = rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])
        params[f"b{i}"] = 0.1 * rng.standard_normal(dims[i + 1])

    b = GraphBuilder("mlp")
    h = b.input("x", x)
    y = b.input("labels", labels, dtype="int64")
    for i in range(DEPTH + 1):
        w, bias = b.input(f"W{i}", params[f"W{i}"], True), b.input(f"b{i}", params[f"b{i}"], True)
        h = b.node("add", b.node("matmul", h, w), bias)
        if i < DEPTH:
            h = b.node("relu", h)
    b.output(b.node("cross_entropy", h, y, name="loss"))

    def torch_model(t):
        h = t["x"]
        for i in range(DEPTH + 1):
            h = h @ t[f"W{i}"] + t[f"b{i}"]
            if i < DEPTH:
                h = torch.relu(h)
        return F.cross_entropy(h, t["labels"])

    return b.build(), {"x": x, "labels": labels, **params}, list(params), torch_model


FFN_SEQ, FFN_WIDTH, FFN_HIDDEN = 128, 256, 1024


def ffn_case(rng):
    x = rng.standard_normal((FFN_SEQ, FFN_WIDTH))
    params = {"W1": rng.standard_normal((FFN_WIDTH, FFN_HIDDEN)) / np.sqrt(FFN_WIDTH),
              "b1": 0.1 * rng.standard_normal(FFN_HIDDEN),
              "W2": rng.standard_normal((FFN_HIDDEN, FFN_WIDTH)) / np.sqrt(FFN_HIDDEN),
              "b2": 0.1 * rng.standard_normal(FFN_WIDTH)}
    b = GraphBuilder("ffn")
    h = b.input("x", x)
    w1, b1, w2, b2 = (b.input(k, v, True) for k, v in params.items())
    h = b.node("gelu", b.node("add", b.node("matmul", h, w1), b1))
    h = b.node("add", b.node("matmul", h, w2), b2)
    b.output(b.node("sum", b.node("mul", h, h), name="loss"))

    def torch_model(t):
        h = F.gelu(t["x"] @ t["W1"] + t["b1"])
        h = h @ t["W2"] + t["b2"]
        return (h * h).sum()

    return b.build(), {"x": x, **params}, list(params), torch_model


def chain_case(rng):
    x0 = rng.uniform(-1, 1, CHAIN_WIDTH)
    w = rng.uniform(0.5, 1.5, CHAIN_WIDTH)
    b = GraphBuilder("chain")
    h, wn = b.input("x", x0, True), b.input("w", w, True)
    for i in range(CHAIN_NODES - 1):
        op = CHAIN_OPS[i % len(CHAIN_OPS)]
        h = b.node(op, h, wn) if op in ("mul", "add", "sub") else b.node(op, h)
    b.output(b.node("sum", h, name="loss"))

    fns = {"tanh": torch.tanh, "sin": torch.sin, "neg": torch.neg, "cos": torch.cos, "exp": torch.exp,
           "mul": torch.mul, "add": torch.add, "sub": torch.sub}

    def torch_model(t):
        h, w = t["x"], t["w"]
        for i in range(CHAIN_NODES - 1):
            op = CHAIN_OPS[i % len(CHAIN_OPS)]
            h = fns[op](h, w) if op in ("mul", "add", "sub") else fns[op](h)
        return h.sum()

    return b.build(), {"x": x0, "w": w}, ["x", "w"], torch_model


def load_baseline(root: str):
    """The engine of the gradcheck_svc package under root, as an engine(msg, dtype) -> run factory."""
    pkg = Path(root) / "gradcheck_svc"
    spec = importlib.util.spec_from_file_location("gradcheck_baseline", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    sys.modules["gradcheck_baseline"] = mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    eng, graph, backend = (importlib.import_module(f"gradcheck_baseline.{m}") for m in ("engine", "graph", "backend"))

    def make(msg, dtype, integrity):
        program = eng.Program(graph.load_graph(msg), dtype)
        feeds = eng.prepare_feeds(program, backend.NUMPY)
        return lambda: eng.backward(eng.forward(program, backend.NUMPY, feeds, integrity=integrity))
    return make


def engine_and_torch(name, case, dtype, backend=NUMPY, device="cpu", limits=None):
    """(engine(integrity="off"), eager()): the case's forward+backward in the engine (Program compiled
    and feeds placed once, as torch's tensors are created once) and in torch eager, after checking
    that both give the same gradients (else a comparison of their times means nothing). The one
    setup of every engine-vs-torch benchmark (bench_engine, bench_goals, bench_gpu)."""
    msg, values, params, torch_model = case
    program = Program(load_graph(msg, limits=limits) if limits else load_graph(msg), dtype)
    feeds = prepare_feeds(program, backend)
    tdtype = torch.float32 if dtype == np.float32 else torch.float64
    t = {k: (torch.tensor(v, dtype=tdtype, device=device, requires_grad=k in params)
             if np.asarray(v).dtype.kind == "f" else torch.tensor(v, device=device)) for k, v in values.items()}
    tparams = [t[p] for p in params]

    def engine(integrity="off"):
        return backward(forward(program, backend, feeds, integrity=integrity))

    def eager():
        return torch.autograd.grad(torch_model(t), tparams)

    ours, theirs = engine(), eager()
    tol = 1e-3 if dtype == np.float32 else 1e-9
    for p, g in zip(params, theirs):
        np.testing.assert_allclose(backend.to_host(ours[p]), g.cpu().numpy(), rtol=tol,
                                   atol=tol * float(g.abs().max()), err_msg=f"{name}: gradient of {p} differs from torch")
    return engine, eager


def run(name, case, dtype, reps, budget_s, baseline=None):
    msg = case[0]
    engine, eager = engine_and_torch(name, case, dtype)
    cases = {"off": engine, "check": lambda: engine("check"), "torch": eager}
    if baseline is not None:
        cases.update({"base off": baseline(msg, dtype, "off"), "base check": baseline(msg, dtype, "check")})
    times = interleaved(cases, reps=reps, warmup=2, budget_s=budget_s)
    med = {k: median(v) for k, v in times.items()}
    off, check, tt = med["off"], med["check"], med["torch"]
    row = [name, np.dtype(dtype).name, len(times["torch"]), min_med(times["off"]), min_med(times["check"]),
           min_med(times["torch"]), f"{off / tt:.2f}x", f"{check / tt:.2f}x"]
    if baseline is not None:
        row += [f"{med['base off'] / tt:.2f}x", f"{med['base check'] / tt:.2f}x",
                f"{off / med['base off']:.2f}", f"{check / med['base check']:.2f}"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--threads", default="1,2",
                    help="thread counts for numpy's BLAS and for torch alike, one table each, 1 first (default 1,2)")
    ap.add_argument("--baseline", metavar="DIR", help="also time the engine of the gradcheck_svc/ under DIR")
    ap.add_argument("--only", choices=("mlp", "ffn", "chain"), help="run one graph only")
    args = ap.parse_args(argv)
    counts = thread_counts(args.threads)
    baseline = load_baseline(args.baseline) if args.baseline else None
    rng = np.random.default_rng(0)
    mlp, ffn, chain = mlp_case(rng), ffn_case(rng), chain_case(rng)
    reps = 5 if args.quick else 40
    header = ["graph", "dtype", "reps", "engine min / median (integrity off)",
              "engine min / median (integrity check)", "torch min / median", "engine/torch (off, medians)",
              "engine/torch (check, medians)"]
    if baseline is not None:
        header += ["baseline/torch (off)", "baseline/torch (check)", "engine/baseline (off)", "engine/baseline (check)"]
    for threads in counts:
        match_threads(threads)
        rows = []
        for dtype in (np.float32, np.float64):
            if args.only in (None, "mlp"):
                rows.append(run("mlp 3x1024, batch 256", mlp, dtype, reps, budget_s=40, baseline=baseline))
            if args.only in (None, "ffn"):
                rows.append(run(f"ffn {FFN_WIDTH}-{FFN_HIDDEN}-{FFN_WIDTH} gelu, seq {FFN_SEQ}", ffn, dtype, reps,
                                budget_s=20, baseline=baseline))
            if args.only in (None, "chain"):
                rows.append(run(f"chain of {CHAIN_NODES} elementwise, width {CHAIN_WIDTH}", chain, dtype, reps * 5,
                                budget_s=15, baseline=baseline))
        print(f"## bench_engine: forward+backward, engine (NumPy) vs torch eager (CPU), {threads} thread(s)\n")
        print(f"machine: {machine()}; numpy's BLAS and torch both use {threads} thread(s)\n")
        print(table(header, rows))
        print("\ngoals: mlp engine/torch <= 1.3x; ffn (gelu) <= 1.5x; chain engine/torch < 1.0x")
        print(f"after the runs: {load()}\n", flush=True)

if __name__ == "__main__":
    main()
