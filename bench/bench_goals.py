"""Issue 15's goals, each a row (project, torch or floor, ratio, goal, met), in one interleaved run.

Every case below runs once per round and the rounds rotate their order (harness.interleaved),
so background load on a shared machine hits all of them alike. 1 thread for numpy's BLAS and
torch (2-thread torch timings swing with load on shared machines). Reported: min / median over
the rounds for both sides (latency goals: min / p50 or min / p99 over every sample of every round);
ratios and the "met" verdicts are computed on the medians (p50, p99) only.

  engine   mlp 3x1024 batch 256 and the 200-op chain (bench_engine's graphs), f32 and f64,
           integrity off and check, against torch eager forward+backward
  seed     in-process verify(validate(msg)) of examples/graphs/seed.json, default options
  cli      `python -m gradcheck_svc.cli verify seed.json --symbolic off` (a fresh process)
  grpc     the same verification through a real server on loopback (1 worker), minus in-process
  profile  chain_1024: run_engine with the memory profile minus without, against the gradient run
  ckpt     chain_256 (width 32, batch 256): run_engine under sqrt (recompute check on) vs none;
           the process peak of each (tracemalloc) is reported beside it
  fd       full-Jacobian FD at 20,000 elements vs torch.autograd.gradcheck, and vs the FLOP floor
           (GEMM FLOPs of 2N forwards at the best 1024^3 GEMM rate of the same run)

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_goals.py [--rounds N] [--baseline DIR] [--quick]

BENCHMARKS.md's issue-15 table: `--rounds 9 --baseline /tmp/base` (see there for /tmp/base).

--baseline DIR: also run the engine, in-process, memory and FD cases with the gradcheck_svc/ under
DIR (e.g. `git archive COMMIT gradcheck_svc | tar -x -C DIR`), interleaved in the same rounds,
and print a before/after table.

(On machines where OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set for old OpenBLAS builds, unset
both for this command only: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ...`; the machine line
prints the kernel threadpoolctl sees.)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "clients" / "python")]

import bench_engine  # noqa: E402
import bench_fd  # noqa: E402
from harness import fmt_s, interleaved, load, machine, match_threads, median, min_med, table  # noqa: E402

from gradcheck_client import Client  # noqa: E402
from gradcheck_svc.graph import load_graph, parse_graph, validate  # noqa: E402
from gradcheck_svc.server.launcher import LocalServer  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.engine_run import run_engine  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from gen_chain import chain  # noqa: E402

SEED = ROOT / "examples" / "graphs" / "seed.json"


def engine_cases(cases, samples):
    rng = np.random.default_rng(0)
    for name, case in (("mlp", bench_engine.mlp_case(rng)), ("chain", bench_engine.chain_case(rng))):
        for dtype in (np.float32, np.float64):
            engine, eager = bench_engine.engine_and_torch(name, case, dtype)
            key = f"{name} {np.dtype(dtype).name}"
            inner = 3 if name == "mlp" else 30  # several calls per round: one slow call must not decide a median
            for integrity in ("off", "check"):
                cases[f"{key} {integrity}"] = _repeat(lambda e=engine, i=integrity: e(i), inner,
                                                      samples.setdefault(f"{key} {integrity}", []))
            cases[f"{key} torch"] = _repeat(eager, inner, samples.setdefault(f"{key} torch", []))


def _repeat(fn, n, out, first=None):
    """A case that runs fn n times and records each call's seconds in out. first: a list that gets
    the round's first call instead (it is not in out): on this VM the first call after the process
    idled through other cases runs ~8 ms slower, in-process and through gRPC alike (the kernel
    reclaims idle pages: DAMON), which would otherwise decide the latency rows' p99."""
    def case():
        if first is not None:
            t0 = time.perf_counter()
            fn()
            first.append(time.perf_counter() - t0)
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return case


def gemm_cases(cases, samples):
    """The MLP's forward+backward GEMMs alone (8 of 256x1024x1024 -- x's gradient is skipped on both
    sides -- and the 1024x10 layer's), numpy against torch: the BLAS's own ratio, which bounds the
    engine/torch ratio from below however little the engine does around them."""
    import torch

    b, w, c = bench_engine.BATCH, bench_engine.WIDTH, bench_engine.CLASSES
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        a, m, g = (rng.standard_normal(shape).astype(dtype) for shape in ((b, w), (w, w), (b, w)))
        m3, g3 = rng.standard_normal((w, c)).astype(dtype), rng.standard_normal((b, c)).astype(dtype)

        def gemms(a, m, g, m3, g3):
            for _ in range(3):  # forward: three square layers and the last one
                a @ m
            a @ m3
            a.T @ g3, g3 @ m3.T  # backward: the last layer, two square layers, the first one's weight
            for _ in range(2):
                a.T @ g, g @ m.T
            a.T @ g
        key = f"mlp {np.dtype(dtype).name} gemms"
        t = [torch.from_numpy(v) for v in (a, m, g, m3, g3)]
        cases[f"{key} numpy"] = _repeat(lambda v=(a, m, g, m3, g3): gemms(*v), 3, samples.setdefault(f"{key} numpy", []))
        cases[f"{key} torch"] = _repeat(lambda v=t: gemms(*v), 3, samples.setdefault(f"{key} torch", []))


def service_cases(cases, samples, server):
    msg = parse_graph(SEED)
    cases["seed in-process"] = _repeat(lambda: verify(validate(msg)), 50, samples.setdefault("seed in-process", []),
                                       samples.setdefault("seed in-process first", []))
    client = Client(server.target, timeout=60)
    client.verify(msg)  # connect and warm the worker
    cases["seed grpc"] = _repeat(lambda: client.verify(msg), 50, samples.setdefault("seed grpc", []),
                                 samples.setdefault("seed grpc first", []))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]))
    # Bytecode compiled first, as pip compiles an installed package's: an editable install on a machine
    # with PYTHONDONTWRITEBYTECODE=1 (this one) would otherwise compile ~70 modules on every run (~70 ms).
    import compileall

    for package in (ROOT / "gradcheck_svc", ROOT / "clients" / "python" / "gradcheck_client",
                    ROOT / "clients" / "python" / "gradcheck"):
        compileall.compile_dir(str(package), quiet=1)
    cli = [sys.executable, "-m", "gradcheck_svc.cli", "verify", str(SEED), "--symbolic", "off"]
    cases["cli"] = _repeat(lambda: subprocess.run(cli, env=env, check=True, capture_output=True), 1,
                           samples.setdefault("cli", []))
    return client


def memory_cases(cases, samples, peaks):
    deep = load_graph(chain(1024, width=8, batch=4).build())
    opts = VerifyOptions(checkpoint="none")
    cases["chain_1024 profile"] = _repeat(lambda: run_engine(deep, opts, "float64"), 1,
                                          samples.setdefault("chain_1024 profile", []))
    cases["chain_1024 no profile"] = _repeat(lambda: run_engine(deep, opts, "float64", profile=False), 1,
                                             samples.setdefault("chain_1024 no profile", []))
    wide = load_graph(chain(256, width=32, batch=256).build())
    for policy in ("none", "sqrt"):
        cases[f"ckpt {policy}"] = _repeat(lambda p=policy: run_engine(wide, VerifyOptions(checkpoint=p), "float64"),
                                          1, samples.setdefault(f"ckpt {policy}", []))
        tracemalloc.start()
        run_engine(wide, VerifyOptions(checkpoint=policy), "float64")
        peaks[policy] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def baseline_cases(cases, samples, root):
    """The same cases with another checkout's engine (bench_engine.load_baseline's import)."""
    import importlib

    make = bench_engine.load_baseline(root)
    base = {m: importlib.import_module(f"gradcheck_baseline.{m}")
            for m in ("graph", "verify", "verify.engine_run", "oracles.finite_diff")}
    rng = np.random.default_rng(0)
    for name, case in (("mlp", bench_engine.mlp_case(rng)), ("chain", bench_engine.chain_case(rng))):
        for dtype in (np.float32, np.float64):
            for integrity in ("off", "check"):
                key = f"{name} {np.dtype(dtype).name} {integrity}"
                cases[f"base {key}"] = _repeat(make(case[0], dtype, integrity), 3 if name == "mlp" else 30,
                                               samples.setdefault(f"base {key}", []))
    msg = parse_graph(SEED)
    cases["base seed in-process"] = _repeat(lambda: base["verify"].verify(base["graph"].validate(msg)), 50,
                                            samples.setdefault("base seed in-process", []))
    run = base["verify.engine_run"].run_engine
    deep = base["graph"].load_graph(chain(1024, width=8, batch=4).build())
    cases["base chain_1024 profile"] = _repeat(lambda: run(deep, base["verify"].VerifyOptions(), "float64"), 1,
                                               samples.setdefault("base chain_1024 profile", []))
    cases["base chain_1024 no profile"] = _repeat(
        lambda: run(deep, base["verify"].VerifyOptions(), "float64", profile=False), 1,
        samples.setdefault("base chain_1024 no profile", []))
    wide = base["graph"].load_graph(chain(256, width=32, batch=256).build())
    for policy in ("none", "sqrt"):
        cases[f"base ckpt {policy}"] = _repeat(
            lambda p=policy: run(wide, base["verify"].VerifyOptions(checkpoint=p), "float64"), 1,
            samples.setdefault(f"base ckpt {policy}", []))
    fd_graph = base["graph"].load_graph(_fd_message())  # the FD problem's graph, decoded by the baseline
    fdm = base["oracles.finite_diff"]

    def base_fd():
        fd = fdm.FiniteDifferences(fd_graph, fdm.FDOptions(mode="full"))
        return {p: fd.gradient(p).reference for p in fd_graph.parameters}
    cases["base fd ours"] = _repeat(base_fd, 1, samples.setdefault("base fd ours", []))


def _fd_message():
    """bench_fd.problem(20,000)'s graph as a message (same seed, same values)."""
    from gradcheck_svc.graph.build import GraphBuilder

    rng = np.random.default_rng(20_000)
    d, h, c = bench_fd.SIZES[20_000]
    x = rng.standard_normal((bench_fd.BATCH, d))
    labels = rng.integers(0, c, size=bench_fd.BATCH)
    w1 = rng.standard_normal((d, h)) / np.sqrt(d)
    w2 = rng.standard_normal((h, c)) / np.sqrt(h)
    b = GraphBuilder("fd20000")
    hidden = b.node("tanh", b.node("matmul", b.input("x", x), b.input("W1", w1, True)))
    logits = b.node("matmul", hidden, b.input("W2", w2, True))
    b.output(b.node("cross_entropy", logits, b.input("labels", labels, dtype="int64"), name="loss"))
    return b.build()


def fd_cases(cases, samples):
    graph, f, tw = bench_fd.problem(20_000, np.random.default_rng(20_000))
    square = np.random.default_rng(1).standard_normal((bench_fd.GEMM_N, bench_fd.GEMM_N))
    cases["fd ours"] = _repeat(lambda: bench_fd.ours(graph), 1, samples.setdefault("fd ours", []))
    cases["fd torch"] = _repeat(lambda: bench_fd.theirs(f, tw), 1, samples.setdefault("fd torch", []))
    cases["gemm"] = _repeat(lambda: square @ square, 3, samples.setdefault("gemm", []))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 round (a smoke run: proves it runs, numbers mean little)")
    ap.add_argument("--baseline", metavar="DIR", help="also time the gradcheck_svc/ under DIR (before/after)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 1
    match_threads(1)
    samples, peaks, cases = {}, {}, {}
    engine_cases(cases, samples)
    gemm_cases(cases, samples)
    memory_cases(cases, samples, peaks)
    fd_cases(cases, samples)
    if args.baseline:
        baseline_cases(cases, samples, args.baseline)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    with LocalServer("--workers", "1", env=env) as server:
        client = service_cases(cases, samples, server)
        interleaved(cases, reps=args.rounds, warmup=1)
        client.close()
    for v in samples.values():  # the warm-up round's samples are not measurements
        del v[:len(v) // (args.rounds + 1)]
    print(report(samples, peaks, args.rounds))
    if args.baseline:
        print("\n" + before_after(samples))


def before_after(s) -> str:
    rows = []
    for key in sorted(k[5:] for k in s if k.startswith("base ")):
        before, after = _med(s, "base " + key), _med(s, key)
        rows.append([key, min_med(s["base " + key]), min_med(s[key]), f"{after / before:.2f}"])
    return "### Before/after, same interleaved run (min / median; after/before of the medians)\n\n" + \
        table(["case", "before (baseline) min / median", "after (this tree) min / median", "after/before (medians)"],
              rows)


def _med(samples, key):
    return median(samples[key])


def report(s, peaks, rounds) -> str:
    """Every goal's row: project and reference as "min / median" (latency: "min / p50" or
    "min / p99"); the ratio and the verdict are computed on the medians, as before."""
    rows = []

    def row(goal_name, ours, ref, ratio_text, goal, met):
        rows.append([goal_name, ours, ref, ratio_text, goal, "met" if met else "**missed**"])

    mm = lambda key: min_med(s[key])  # noqa: E731

    for name in ("mlp", "chain"):
        for dt in ("float32", "float64"):
            key = f"{name} {dt}"
            torch_t = _med(s, f"{key} torch")
            for integ, goal in (("off", 1.1 if name == "mlp" else 1.0), ("check", 1.2 if name == "mlp" else None)):
                ours = _med(s, f"{key} {integ}")
                r = ours / torch_t
                if goal is None:
                    row(f"{key} engine/torch, integrity {integ}", mm(f"{key} {integ}"), mm(f"{key} torch"),
                        f"{r:.2f}x", "(no goal)", True)
                    continue
                row(f"{key} engine/torch, integrity {integ}", mm(f"{key} {integ}"), mm(f"{key} torch"), f"{r:.2f}x",
                    f"<= {goal}x", r <= goal)
            if name == "mlp":
                floor = _med(s, f"{key} gemms numpy") / _med(s, f"{key} gemms torch")
                row(f"{key} its GEMMs alone, numpy/torch (the BLAS floor of the ratios above)",
                    mm(f"{key} gemms numpy"), mm(f"{key} gemms torch"), f"{floor:.2f}x", "(reference)", True)
            over = _med(s, f"{key} check") / _med(s, f"{key} off") - 1
            row(f"{key} integrity overhead", mm(f"{key} check"), mm(f"{key} off") + " (off)",
                f"+{over * 100:.1f}%", "< +10%", over < 0.10)
    seed = np.asarray(s["seed in-process"])
    seed_mm = f"{fmt_s(float(seed.min()))} / {fmt_s(float(np.median(seed)))}"
    row("seed verify in-process p50", seed_mm, "-", "-", "<= 1 ms", np.median(seed) <= 1e-3)
    g = np.asarray(s["seed grpc"])
    over_min = float(g.min() - seed.min())  # the fastest request through the server minus the fastest in-process
    over50 = float(np.median(g) - np.median(seed))
    over99 = float(np.percentile(g, 99) - np.median(seed))  # conservative: samples cannot be paired
    row("gRPC overhead p50 (seed, 1 client)", f"{fmt_s(over_min)} / {fmt_s(over50)}", seed_mm + " in-process", "-",
        "< 2 ms", over50 < 2e-3)
    row("gRPC overhead p99 (seed, 1 client; grpc p99 - in-process p50)", f"{fmt_s(over_min)} / {fmt_s(over99)} (p99)",
        seed_mm + " in-process",
        "-", "< 5 ms", over99 < 5e-3)
    row("first call of each round (not in the rows above): in-process / gRPC", mm("seed in-process first"),
        mm("seed grpc first"), "-", "(reported)", True)
    cli = _med(s, "cli")
    row("CLI seed verify --symbolic off (process)", mm("cli"), "-", "-", "<= 250 ms", cli <= 0.25)
    prof, plain = _med(s, "chain_1024 profile"), _med(s, "chain_1024 no profile")
    cost_min = min(s["chain_1024 profile"]) - min(s["chain_1024 no profile"])
    row("chain_1024 memory profile cost / gradient run", f"{fmt_s(cost_min)} / {fmt_s(prof - plain)}",
        mm("chain_1024 no profile"), f"{(prof - plain) / plain:.2f}x", "<= 2x", (prof - plain) / plain <= 2)
    sq, no = _med(s, "ckpt sqrt"), _med(s, "ckpt none")
    row("run_engine sqrt (recompute check) / none, chain_256 w32 b256", mm("ckpt sqrt"), mm("ckpt none"),
        f"{sq / no:.2f}x", "< 1.5x", sq / no < 1.5)
    row("process peak (tracemalloc) sqrt / none, same graph", f"{peaks['sqrt'] / 1e6:.1f} MB (one run)",
        f"{peaks['none'] / 1e6:.1f} MB (one run)", f"{peaks['sqrt'] / peaks['none']:.2f}x", "drops",
        peaks["sqrt"] < peaks["none"])
    fd, tfd = _med(s, "fd ours"), _med(s, "fd torch")
    row("FD full Jacobian N=20,000: torch gradcheck / ours", mm("fd ours"), mm("fd torch"), f"{tfd / fd:.1f}x",
        ">= 5x", tfd / fd >= 5)
    rate = 2 * bench_fd.GEMM_N ** 3 / min(s["gemm"])
    floor = 2 * 20_000 * bench_fd.forward_flops(20_000) / rate
    row(f"FD N=20,000 / FLOP floor ({rate / 1e9:.0f} GFLOP/s GEMM)", mm("fd ours"), fmt_s(floor) + " (floor)",
        f"{fd / floor:.2f}x", "<= 2x", fd / floor <= 2)
    head = (f"## Issue 15 goals, one interleaved run ({rounds} rounds, 1 thread)\n\n"
            f"machine: {machine()}\n\n"
            "Cells: min / median over the rounds (latency rows: min / p50, the p99 row min / p99 over every "
            "sample; gRPC overhead min = fastest server request - fastest in-process; profile cost min = "
            "min with - min without). Ratios and met/missed: medians (p50, p99) only. The latency rows leave "
            "out each round's first call (the machine idled through other cases before it), shown in a row "
            "of its own.\n\n")
    return head + table(["goal", "project min / median", "torch / floor / reference min / median",
                         "ratio (of medians)", "goal", "met"], rows) + \
        f"\n\nafter the run: {load()}"

if __name__ == "__main__":
    main()
