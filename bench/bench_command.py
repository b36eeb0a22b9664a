"""The whole command against the function: chain_256 verified in a fresh process vs in process.

Issue 32's goal: `gradcheck-svc verify` and `gradcheck verify` (in process, no server) on
examples/graphs/chain_256.json (2 MB of JSON: 512 tensors, 270,336 values) and on the same graph as
binary .pb, each within 1.5x of `verify()` in process -- decoding the graph and encoding the report
cost what the bytes cost, not per-element Python. Cases, interleaved (harness.interleaved), 1 thread:

  function        verify(validate(decoded message)) in this process (the graph decoded once, before)
  svc json        `python -m gradcheck_svc.cli verify chain_256.json --format json` (a fresh process)
  svc pb          the same on chain_256.pb
  client json     `python -m gradcheck_client.cli verify chain_256.json --format json` (in process mode)
  client pb       the same on chain_256.pb

Each process row is start-up + decode + the same verification + the JSON report on stdout; its
ratio is against the function's median.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_command.py [--quick] [--rounds N]

--quick: 2 rounds (a smoke run).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "clients" / "python")]

from harness import interleaved, load, machine, match_threads, median, min_med, table  # noqa: E402

from gradcheck_core.graphio import load_graph as read_graph, save_graph  # noqa: E402
from gradcheck_svc.graph import validate  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402

CHAIN = ROOT / "examples" / "graphs" / "chain_256.json"


def command_cases(msg, pb: Path, env: dict) -> dict:
    """The function and the four commands (fresh processes under env), each a no-argument callable."""

    def process(*cmd):
        return lambda: subprocess.run([sys.executable, "-m", *cmd], env=env, check=True, capture_output=True)

    return {
        "function": lambda: verify(validate(msg), VerifyOptions()),
        "svc json": process("gradcheck_svc.cli", "verify", str(CHAIN), "--format", "json"),
        "svc pb": process("gradcheck_svc.cli", "verify", str(pb), "--format", "json"),
        "client json": process("gradcheck_client.cli", "verify", str(CHAIN), "--format", "json"),
        "client pb": process("gradcheck_client.cli", "verify", str(pb), "--format", "json"),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="2 rounds (smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 2
    match_threads(1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")])}
    msg = read_graph(CHAIN)
    with tempfile.TemporaryDirectory() as tmp:
        pb = save_graph(msg, Path(tmp) / "chain_256.pb")
        cases = command_cases(msg, pb, env)
        times = interleaved(cases, reps=args.rounds, warmup=1)
    base = median(times["function"])
    rows = [[name, len(ts), min_med(ts), "-" if name == "function" else f"{median(ts) / base:.2f}x"]
            for name, ts in times.items()]
    print(f"machine: {machine()}\n")
    print(table(["case", "rounds", "min / median", "median / function's"], rows))
    print(f"\ngoal: every process row <= 1.5x the function's; after the runs: {load()}")


if __name__ == "__main__":
    main()
