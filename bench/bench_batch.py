"""Batch throughput: graphs/s of `gradcheck-svc batch` with 1 and 2 local shards, and the time
`gradcheck-svc batch-merge` takes for 10,000 results.

Shards are separate processes, exactly as an Indexed Job's pods are (JOB_COMPLETION_INDEX set), timed
wall-clock from launch to the last shard's exit, process start-up included. The merge input is 10,000
records made by copying the records of a real batch run under 10,000 distinct graph names (a merge reads
and renders records; it never re-verifies, so their content is what matters, not how many graphs ran).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_batch.py [--graphs 400] [--reps 3] [--quick]

BENCHMARKS.md's issue-10 table: `--reps 5`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python"), str(ROOT / "bench")]

from harness import fmt_s, load, machine, median, table  # noqa: E402

from gradcheck_svc.batch.generate import write_graphs  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]))
CLI = [sys.executable, "-m", "gradcheck_svc.cli"]


def run_shards(corpus: Path, out: Path, shards: int, threads: int) -> float:
    # each shard's BLAS gets `threads` threads, as a pod with that CPU limit should be told to (a
    # container's BLAS sees the node's cores, not its quota)
    env = dict(ENV, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*CLI, "batch", "--manifest", str(corpus), "--shard-count", str(shards),
                               "--out", str(out)], env=dict(env, JOB_COMPLETION_INDEX=str(i)),
                              stderr=subprocess.DEVNULL) for i in range(shards)]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - t0
    assert codes == [0] * shards, codes
    CPU.setdefault(shards, []).append(_children_cpu() - cpu0)
    return elapsed


CPU: dict[int, list[float]] = {}  # CPU seconds (user + system) of each run's shard processes


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fake_10k(real: Path, dest: Path, n: int) -> None:
    """n records in 4 shard units of one run, copied round-robin from the real records under new graph names
    (each keeps its content hash; the unit.json lists it, and the file is named by the record's key)."""
    from gradcheck_svc.batch.manifest import shard_of
    from gradcheck_svc.store.records import RUNS, key_of

    run = next((real / RUNS).iterdir())
    sources = [json.loads(p.read_text()) for p in sorted(run.glob("shard-*/results/*.json"))]
    plan = json.loads(next(run.glob("shard-*/unit.json")).read_text())
    names = [f"models/m{i:05d}.json" for i in range(n)]
    records = {name: dict(sources[i % len(sources)], graph=name) for i, name in enumerate(names)}
    dest = dest / RUNS / run.name
    for s in range(4):
        unit = dest / f"shard-{s:04d}"
        (unit / "results").mkdir(parents=True)
        contents = {g: r["graph_sha256"] for g, r in records.items() if shard_of(g, 4) == s}
        (unit / "unit.json").write_text(json.dumps(dict(plan, unit=unit.name, shard_index=s, shard_count=4,
                                                        graphs=names, contents=contents)))
    for name, rec in records.items():
        s = shard_of(name, 4)
        rec.update(unit=f"shard-{s:04d}", shard_index=s, shard_count=4)
        (dest / f"shard-{s:04d}" / "results" / f"{key_of(rec)}.json").write_text(json.dumps(rec))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads per shard process (default 1)")
    ap.add_argument("--size", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--merge-results", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.graphs, a.reps, a.merge_results = 100, 1, 2000
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    try:
        corpus = tmp / "graphs"
        load_before = load()
        write_graphs(corpus, a.graphs, size=a.size, kinds=lambda i: "mismatch" if i % 10 == 3 else "ok")
        rows, times, startup = [], {1: [], 2: []}, []
        for rep in range(a.reps):
            for shards in (1, 2):  # alternated, so background load hits both alike
                out = tmp / f"out-{shards}-{rep}"
                times[shards].append(run_shards(corpus, out, shards, a.threads))
            startup.append(run_shards(corpus, tmp / f"out-1-{rep}", 1, a.threads))  # all done: start-up + skip
        for shards, ts in times.items():
            cpu = CPU[shards][0::2] if shards == 1 else CPU[shards]  # 1 shard: leave out the start-up runs
            rows.append([shards, a.graphs, len(ts), fmt_s(min(ts)), fmt_s(median(ts)),
                         f"{a.graphs / median(ts):.1f}", f"{a.graphs / min(ts):.1f}",
                         f"{median(cpu) / a.graphs * 1e3:.2f} ms"])
        print(f"\nBatch: {a.graphs} generated graphs (width {a.size}, 10% planted mismatches), in-process, "
              f"{a.threads} BLAS thread(s) per shard; load before: {load_before}")
        print(table(["shards", "graphs", "reps", "wall min", "wall median", "graphs/s (median)",
                     "graphs/s (best)", "CPU per graph (median)"], rows))
        print(f"\nA shard with nothing left to do (start-up, manifest scan, {a.graphs} skips): min "
              f"{fmt_s(min(startup))}, median {fmt_s(median(startup))}")
        per_core = a.graphs / median(CPU[1][0::2])
        print(f"\nProjection (an estimate, not a measurement): shards share nothing but the results volume, so "
              f"N pods with one CPU each ~ N x {per_core:.0f} graphs/s (1 / the CPU per graph of one shard, start-up "
              f"included), less waiting on a network volume's rename/fsync and each pod's start (image pull).")

        merge_in = tmp / "merge"
        fake_10k(tmp / "out-1-0", merge_in, a.merge_results)
        mt = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            rc = subprocess.run([*CLI, "batch-merge", str(merge_in)], env=ENV, capture_output=True).returncode
            mt.append(time.perf_counter() - t0)
            assert rc == 1, rc  # the copied records include planted mismatches
        size = sum(p.stat().st_size for p in merge_in.rglob("*.json") if "results" in p.parts)
        print(f"\nMerge: {a.merge_results} results ({size / 2**20:.1f} MiB of records) -> merged.json, junit.xml, "
              f"summary.md")
        print(table(["results", "reps", "min", "median"], [[a.merge_results, len(mt), fmt_s(min(mt)),
                                                             fmt_s(median(mt))]]))
        print(f"\nMachine: {machine()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
