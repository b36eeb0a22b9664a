"""The JSON report's writer: chain_256's command against the function, and the old writer against the new.

Issue 48 item 2: `gradcheck-svc verify chain_256.json|.pb --format json` within 1.5x of `verify()` in process,
the report's ~290,000 listed values written by orjson (gradcheck_core/json_text.py) instead of
float.__repr__ per value. Cases, interleaved (harness.interleaved), 1 thread:

  function   verify(validate(decoded message)) in this process (the graph decoded once, before)
  svc json   `python -m gradcheck_svc.cli verify chain_256.json --format json` (a fresh process)
  svc pb     the same on chain_256.pb
  old text   the previous json_text.dumps (C json.dumps per list: float.__repr__) of that report's dict
  new text   json_text.dumps of the same dict (Report.to_json's writer)

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_json_report.py [--rounds N]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "clients" / "python")]

from harness import interleaved, load, machine, match_threads, median, min_med, table  # noqa: E402

from gradcheck_core import json_text  # noqa: E402
from gradcheck_core.graphio import load_graph, save_graph  # noqa: E402
from gradcheck_svc.graph import validate  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402

CHAIN = ROOT / "examples" / "graphs" / "chain_256.json"
_PLAIN = frozenset((int, float, str, bool, type(None)))


def old_dumps(obj, indent=2, allow_nan=False) -> str:
    """The writer before orjson (commit ca03fd8's json_text.dumps), kept here as the baseline only."""
    token, lists = secrets.token_hex(8), []

    def lift(o):
        if isinstance(o, dict):
            return {k: lift(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            if _PLAIN.issuperset(map(type, o)):
                lists.append(o)
                return f"{token}{len(lists) - 1}"
            return [lift(v) for v in o]
        return o

    text = json.dumps(lift(obj), indent=indent, allow_nan=allow_nan)
    return re.sub(f'"{token}(\\d+)"', lambda m: json.dumps(lists[int(m.group(1))], allow_nan=allow_nan), text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run (1 round): bench/run_all.py --quick")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 1
    match_threads(1)
    path = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": path}
    msg = load_graph(CHAIN)
    d = verify(validate(msg), VerifyOptions()).to_dict()
    assert json.loads(old_dumps(d)) == json.loads(json_text.dumps(d, allow_nan=False))
    with tempfile.TemporaryDirectory() as tmp:
        pb = save_graph(msg, Path(tmp) / "chain_256.pb")

        def process(*cmd):
            return lambda: subprocess.run([sys.executable, "-m", *cmd], env=env, check=True, capture_output=True)

        times = interleaved({
            "function": lambda: verify(validate(msg), VerifyOptions()),
            "svc json": process("gradcheck_svc.cli", "verify", str(CHAIN), "--format", "json"),
            "svc pb": process("gradcheck_svc.cli", "verify", str(pb), "--format", "json"),
            "old text": lambda: old_dumps(d),
            "new text": lambda: json_text.dumps(d, allow_nan=False),
        }, reps=args.rounds, warmup=1)
    base = median(times["function"])
    rows = [[name, len(ts), min_med(ts), f"{median(ts) / base:.2f}x" if name.startswith("svc") else "-"]
            for name, ts in times.items()]
    print(f"machine: {machine()}\n")
    print(table(["case", "rounds", "min / median", "median / function's"], rows))
    print(f"\nnew text / old text (medians): {median(times['new text']) / median(times['old text']):.2f}; "
          f"goal: svc rows <= 1.5x the function's; after the runs: {load()}")


if __name__ == "__main__":
    main()
