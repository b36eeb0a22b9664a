"""A 1% gradient error planted in each of chain_256's 512 parameter tensors, one at a time: is it found
(verdict FAIL, only that parameter failing) and localized (one error finding, rule_error at the planted
node, naming that parameter) with default options? Issue 25 goal 2; tests/oracles/test_fd_joint.py checks six
of them on every `make test`, this sweeps them all (minutes).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_chain_plants.py [--quick] [--every K] [--first N]

--quick: every 128th tensor (W0, W64, W128, W192: a smoke run), unless --every is given.

The plant: an identity node before the parameter's consumer whose vjp multiplies by 1.01
(tests/oracles/test_fd_joint.py `_planted`). Prints one line per miss and a summary with the time per
verification (min / median / max).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "oracles"))  # test_fd_joint.py's home since the tests mirror the packages
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import load, machine, match_threads, median  # noqa: E402
from test_fd_joint import _one_percent_op, _planted  # noqa: E402

from gradcheck_svc.ops.registry import register  # noqa: E402
from gradcheck_svc.verify import verify  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every 128th tensor (smoke run)")
    ap.add_argument("--every", type=int, default=None, help="plant in every K-th tensor (default 1: all 512)")
    ap.add_argument("--first", type=int, default=None, help="only the first N tensors")
    args = ap.parse_args(argv)
    match_threads(1)  # 1 thread, as the tables say
    register(_one_percent_op())
    doc = json.loads((ROOT / "examples" / "graphs" / "chain_256.json").read_text())
    params = [i["name"] for i in doc["inputs"] if i.get("requiresGrad") or i.get("requires_grad")]
    params = params[:args.first][::args.every or (128 if args.quick else 1)]
    print(f"machine: {machine()}")
    times, missed = [], []
    for target in params:
        t0 = time.perf_counter()
        report = verify(_planted(doc, target))
        times.append(time.perf_counter() - t0)
        failing = [p.name for p in report.parameters if p.status != "ok"]
        errors = [(f.node, f.cause, f.parameters) for f in report.findings if f.severity == "error"]
        ok = report.verdict == "fail" and failing == [target] and errors == [(f"{target}_bug", "rule_error", [target])]
        if not ok:
            missed.append(target)
            print(f"MISSED {target}: verdict {report.verdict}, failing {failing}, errors {errors}", flush=True)
    print(f"planted {len(params)}, found and localized {len(params) - len(missed)}, missed {len(missed)} "
          f"{missed[:20]}; seconds per verification min {min(times):.2f} median {median(times):.2f} "
          f"max {max(times):.2f}; {load()}")


if __name__ == "__main__":
    main()
