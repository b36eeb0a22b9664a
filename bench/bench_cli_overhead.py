"""What `gradcheck-svc verify` pays beyond `verify()` on chain_256 (issue 48 item 2: within 1.5x).

Two parts, 1 thread (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1), bytecode cached as an installed package's
is (PYTHONPYCACHEPREFIX: a checkout run with PYTHONDONTWRITEBYTECODE=1 compiles every module, every run):

  processes, interleaved (harness.interleaved, --rounds N, min / median; wall, and CPU: user + sys of the
  process and the child it forks, which load on the machine does not inflate as it does wall time):
    function      verify(validate(message)) in this process, the message decoded once before
    svc json      `python -m gradcheck_svc.cli verify chain_256.json --format json` (a fresh process)
    svc pb        the same on chain_256.pb
    client json   `python -m gradcheck_client.cli verify chain_256.json --format json` (in process mode)
    client pb     the same on chain_256.pb   (the cases are bench_command.py's)
  steps, in one fresh process each (--rounds N, medians): what the command does beyond the function --
    start         `python -c pass`
    imports       the CLI module and the request pipeline imported
    decode        the .json (or .pb) graph file parsed into its message
    verify        run_request: the request's checks and the verification (the function and its checks)
    report        the report's JSON text

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_cli_overhead.py [--rounds N] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "clients" / "python")]

from bench_command import CHAIN, command_cases  # noqa: E402 -- the same cases, timed here also in CPU
from harness import interleaved, load, machine, match_threads, median, min_med, table  # noqa: E402


# one fresh process's steps, timed with perf_counter (printed as JSON)
STEPS = r"""
import json, sys, time
t0 = time.perf_counter()
import gradcheck_svc.cli, gradcheck_svc.request
from gradcheck_core.graphio import load_graph
from gradcheck_core.request_message import make_request
from gradcheck_svc.outcome import report_of
t1 = time.perf_counter()
message = load_graph(sys.argv[1])
t2 = time.perf_counter()
report = report_of(gradcheck_svc.request.run_request(make_request(message, "")))
t3 = time.perf_counter()
text = report.to_json()
t4 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "decode": t2 - t1, "verify": t3 - t2, "report": t4 - t3}))
"""


def environment(cache: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]),
           "PYTHONPYCACHEPREFIX": cache}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def processes(pb: Path, env: dict, rounds: int) -> dict:
    from gradcheck_core.graphio import load_graph

    msg = load_graph(CHAIN)

    cpu = {}  # CPU seconds per case (user + sys; a command's forked child included): steadier than wall under load

    def timed(name, fn):
        def run():
            t0, c0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
            fn()
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.setdefault(name, []).append(time.process_time() - t0 + c1.ru_utime - c0.ru_utime
                                            + c1.ru_stime - c0.ru_stime)
        return run

    cases = command_cases(msg, pb, env)
    times = interleaved({name: timed(name, fn) for name, fn in cases.items()}, reps=rounds, warmup=1)
    return times, {name: ts[1:] for name, ts in cpu.items()}  # the warm-up round left out


def steps(path: Path, env: dict, rounds: int) -> dict:
    out = {"start": [], "imports": [], "decode": [], "verify": [], "report": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        out["start"].append(time.perf_counter() - t0)
        run = subprocess.run([sys.executable, "-c", STEPS, str(path)], env=env, check=True, capture_output=True,
                             text=True)
        for k, v in json.loads(run.stdout).items():
            out[k].append(v)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 rounds (smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 2
    match_threads(1)
    from gradcheck_core.graphio import load_graph, save_graph

    with tempfile.TemporaryDirectory() as tmp:
        env = environment(str(Path(tmp) / "pycache"))
        pb = save_graph(load_graph(CHAIN), Path(tmp) / "chain_256.pb")
        times, cpu = processes(pb, env, args.rounds)
        by_step = {fmt: steps(p, env, args.rounds) for fmt, p in (("json", CHAIN), ("pb", pb))}
    base, cpu_base = median(times["function"]), median(cpu["function"])
    rows = [[name, len(ts), min_med(ts), "-" if name == "function" else f"{median(ts) / base:.2f}x",
             min_med(cpu[name]), "-" if name == "function" else f"{median(cpu[name]) / cpu_base:.2f}x"]
            for name, ts in times.items()]
    print(f"machine: {machine()}\n")
    print(table(["case", "rounds", "wall min / median", "median / function's", "CPU min / median",
                 "CPU median / function's"], rows))
    print()
    names = list(next(iter(by_step.values())))
    print(table(["step (one process, wall)", *(f"{fmt} median" for fmt in by_step)],
                [[n, *(f"{median(s[n]) * 1e3:.0f} ms" for s in by_step.values())] for n in names]))
    print(f"\ngoal: every process row <= 1.5x the function's; after the runs: {load()}")


if __name__ == "__main__":
    main()
