"""Localization cost against depth (issue 44 item 4): a clean verification against one with a rule bug or a
cache overwrite planted in the middle, on chains of 100 to 2,000 nodes; 1 thread, the three cases
interleaved, min / median seconds (goal: each faulty case within 3x the clean one). Also what localize()
itself costs: its adjoint checks (O(log n)).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_localize_depth.py [--sizes 100,500,1000,2000]
        [--reps 3] [--layers 10,20] [--cache 256,500]

The chains are tests/verify/test_localize.py's deep_chain (x @ W, then h * a and h + b alternately: three
parameter tensors, a gradient that neither vanishes nor explodes with depth). --layers: besides, chains of
scripts/gen_chain.py (tanh(h @ W_i + b_i), two parameter tensors per layer) with a fault in the middle
layer, one run each: there every parameter upstream of the fault is flagged by the joint screen; the cheapest
are checked element by element within a budget (joint_check.spare), the rest decided by their own
directional values. --cache: gen_chain chains (256 layers: examples/graphs/chain_256.json, 769 nodes; 500
layers: 1,501 nodes) with a cached activation corrupted near the input, in the middle and near the loss
(`--fault hK:scale:1.01`), against the clean verification, wall and CPU seconds (--sizes '' skips the rest).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "verify"), str(ROOT / "scripts"),
                str(Path(__file__).resolve().parent)]

from harness import interleaved, load, machine, match_threads, min_med, table  # noqa: E402
from test_localize import _localized, deep_chain  # noqa: E402

from gradcheck_svc.engine.faults import Fault  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.ops import get_op  # noqa: E402
from gradcheck_svc.ops.registry import register  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402


OVERWRITE = 2.0  # `--fault nMID:overwrite:2`: every saved copy of the middle value replaced by 2


def _register_bug() -> None:
    """square with d/dx = 3x, as test_localize.py's buggy_square fixture."""
    register(dataclasses.replace(get_op("square"), name="buggy_square",
                                 vjp=lambda xp, g, saved, **_: (g * 3.0 * saved[0],)))


def _named(report) -> str:
    return ", ".join(f"{f.node} {f.cause}" for f in report.findings if f.severity == "error") or report.verdict


def depth_rows(sizes: list[int], reps: int) -> list[list]:
    rows = []
    for n in sizes:
        mid = n // 2
        clean, rule = deep_chain(n, None), deep_chain(n, mid)
        fault = VerifyOptions(faults=(Fault(f"n{mid}", "overwrite", OVERWRITE),))
        last = {}
        cases = {"clean": lambda: last.__setitem__("clean", verify(clean)),
                 "rule": lambda: last.__setitem__("rule", verify(rule)),
                 "fault": lambda: last.__setitem__("fault", verify(clean, fault))}
        times = interleaved(cases, reps, warmup=0)
        base = min(times["clean"])
        checked = _localized(rule, ["W", "a", "c"]).checked
        rows.append([n, min_med(times["clean"]), min_med(times["rule"]), f"{min(times['rule']) / base:.2f}x",
                     min_med(times["fault"]), f"{min(times['fault']) / base:.2f}x", checked,
                     f"{_named(last['rule'])}; {_named(last['fault'])}"])
        print(f"  n={n} done ({load()})", flush=True)
    return rows


def layer_rows(layers: list[int]) -> list[list]:
    from gen_chain import chain
    rows = []
    for k in layers:
        graph = load_graph(chain(k).build())
        mid = f"h{k // 2}"
        t0 = time.perf_counter()
        clean = verify(graph)
        t1 = time.perf_counter()
        faulty = verify(graph, VerifyOptions(faults=(Fault(mid, "scale", 2.0),)))
        t2 = time.perf_counter()
        failing = sum(p.status != "ok" for p in faulty.parameters)
        how = [p.fd.checked_by for p in faulty.parameters if p.status != "ok"]
        rows.append([f"{k} layers ({len(graph.nodes)} nodes)", f"{t1 - t0:.2f}", f"{t2 - t1:.2f}",
                     f"{(t2 - t1) / (t1 - t0):.1f}x", mid, failing,
                     f"{how.count('joint, then full')} / {how.count('joint, by the screen')}",
                     f"{faulty.timings['finite_differences_s']:.2f}", f"{faulty.timings['diagnosis_s']:.2f}"])
        print(f"  {k} layers done ({load()})", flush=True)
    return rows


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of fn(): the CPU time is what the run itself costs
    whatever else the shared machine runs (the wall time is that plus waiting for a core)."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _rows_of(report) -> str:
    from collections import Counter
    counts = Counter(p.status for p in report.parameters)
    return ", ".join(f"{n} {s}" for s, n in counts.most_common())


def cache_rows(layers: list[int], reps: int) -> list[list]:
    """scripts/gen_chain.py chains (chain_256 is examples/graphs/chain_256.json) with a cached activation
    scaled by 1.01 (`--fault hK:scale:1.01`) near the input, in the middle and near the loss, against the
    clean verification: reps runs each, the cases interleaved (rotating order); min / median of wall and
    CPU seconds, the ratios of the mins."""
    from gen_chain import chain
    rows = []
    for n in layers:
        graph = load_graph(chain(n).build())
        faults = [f"h{k}" for k in (2, n // 2, n - 6)]
        cases = {"none": VerifyOptions(), **{f: VerifyOptions(faults=(Fault(f, "scale", 1.01),)) for f in faults}}
        times = {f: [] for f in cases}
        last = {}
        for r in range(reps):
            order = list(cases)[r % len(cases):] + list(cases)[:r % len(cases)]
            for f in order:
                times[f].append(_timed(lambda f=f: last.__setitem__(f, verify(graph, cases[f]))))
        wall0, cpu0 = (min(t[i] for t in times["none"]) for i in (0, 1))
        for f, ts in times.items():
            wall, cpu = [t[0] for t in ts], [t[1] for t in ts]
            rows.append([f"chain_{n} ({len(graph.nodes)} nodes)", f if f == "none" else f"{f}:scale:1.01",
                         min_med(wall), f"{min(wall) / wall0:.2f}x", min_med(cpu), f"{min(cpu) / cpu0:.2f}x",
                         _named(last[f]), _rows_of(last[f])])
        print(f"  chain_{n} done ({load()})", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,500,1000,2000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", default="10,20", help="gen_chain sizes (layers); empty: none")
    ap.add_argument("--cache", default="", help="gen_chain sizes (layers, e.g. 256,500) for the cache-fault table "
                    "(hK:scale:1.01 at K = 2, layers / 2, layers - 6); empty: none")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run (size 100, 1 repetition, 10 layers, no cache table): bench/run_all.py --quick")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.reps, args.layers, args.cache = "100", 1, "10", ""
    match_threads(1)
    _register_bug()
    print(f"machine: {machine()}")
    verify(deep_chain(10, 5))  # imports and first-call costs (SymPy's), outside the timings
    if args.cache:
        rows = cache_rows([int(s) for s in args.cache.split(",")], args.reps)
        print(table(["chain", "fault", "wall s (min / med)", "wall / clean (min)", "CPU s (min / med)",
                     "CPU / clean (min)", "named", "rows"], rows))
    if not args.sizes:
        print(load())
        return
    rows = depth_rows([int(s) for s in args.sizes.split(",")], args.reps)
    print(table(["nodes", "clean s (min / med)", "rule bug s", "rule / clean", "fault s", "fault / clean",
                 "localize adjoint checks", "named"], rows))
    if args.layers:
        rows = layer_rows([int(s) for s in args.layers.split(",")])
        print(table(["gen_chain", "clean s", "fault s", "fault / clean", "fault at", "failing parameters",
                     "of those: checked in full / by the screen (joint_check.spare)",
                     "fault: FD s", "fault: diagnosis s"], rows))
    print(load())


if __name__ == "__main__":
    main()
