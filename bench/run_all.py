"""Run every bench/bench_*.py in turn (found by glob, so new benchmarks join by
their file name alone) and say which failed. Extra arguments (e.g. --quick) are
passed to each script.

    PYTHONPATH=.:clients/python .venv/bin/python bench/run_all.py [--quick]
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    scripts = sorted(HERE.glob("bench_*.py"))
    env = dict(os.environ)
    # the repo's code first, whether or not it is installed into the interpreter
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    failed = []
    for script in scripts:
        print(f"\n===== {script.name} =====", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script), *args], cwd=ROOT, env=env)
        print(f"----- {script.name}: exit {rc}, {time.perf_counter() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(script.name)
    print(f"\n{len(scripts) - len(failed)} of {len(scripts)} benchmarks ran"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
