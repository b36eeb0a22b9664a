"""The torch drop-in before and after, side by side (issue 42, item 7): two warm worker processes, one running a
base revision's gradcheck_client (a /tmp copy: `git archive REV | tar -x -C DIR`), one this tree's, driven call
by call from here -- every (case, tool, version) call of a repetition in a seeded random order, so background
load hits both alike; CPU time (time.process_time in the worker) and wall per call, 1 thread.

    git archive 12977b6 | tar -x -C /tmp/dropin_base
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=.:clients/python \\
        .venv/bin/python bench/bench_torch_dropin_ab.py /tmp/dropin_base [--reps 5] [--only functions|modules]

--quick (bench/run_all.py --quick): a smoke run -- HEAD (`git archive HEAD` into a temporary directory, unless a
base is given) against the working tree, 2 repetitions, the first QUICK_CASES cases of each group.

Cases: bench/torch_dropin_corpus.py (this tree's copy, in both workers). Tools: the drop-in with fast_mode False
and True in both versions; torch.autograd.gradcheck with each fast_mode in this tree's worker (torch's code is
the same in both). Per case its min and median over the repetitions, then the median over the cases, for the
correct Functions, the planted-bug twins and the modules; verdicts must agree between the versions.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = ("torch False", "torch True", "ours False", "ours True")
QUICK_CASES = 2  # --quick: cases of each group (correct Functions, planted-bug twins, modules)

WORKER = r"""
import json, sys, time, warnings, importlib
sys.path.insert(0, sys.argv[1])
import torch
from harness import match_threads
match_threads(1)
from torch_dropin_corpus import functions, modules
from gradcheck_client.torch import gradcheck
GradcheckError = importlib.import_module("torch.autograd.gradcheck").GradcheckError
cases = {n: (c.apply, x) for n, c, x, _ in functions()}
cases.update({n: (m, (x,)) for n, m, x in modules()})
warnings.simplefilter("ignore")
for line in sys.stdin:
    name, tool, fast = json.loads(line)
    f, x = cases[name]
    call = torch.autograd.gradcheck if tool == "torch" else gradcheck
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        verdict = "pass" if call(f, x, fast_mode=fast) else "FAIL"
    except GradcheckError:
        verdict = "FAIL"
    c1, w1 = time.process_time(), time.perf_counter()
    print(json.dumps([verdict, c1 - c0, w1 - w0]), flush=True)
"""


def worker(root: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'clients' / 'python'}", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", WORKER, str(HERE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=root)


def ask(proc: subprocess.Popen, name: str, tool: str) -> list:
    kind, fast = tool.split()
    proc.stdin.write(json.dumps([name, kind, fast == "True"]) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def run(base: Path, names: list, reps: int, seed: int) -> dict:
    """{(case, column): [(verdict, cpu s, wall s)]}, columns 'torch False' .. 'before ours True', 'after ...'."""
    procs = {"before": worker(base), "after": worker(HERE.parent)}
    calls = [(n, "after", t) for n in names for t in TOOLS[:2]] + \
        [(n, v, t) for n in names for v in ("before", "after") for t in TOOLS[2:]]
    for n, v, t in calls:  # warm-up: every call once (imports, per-class caches)
        ask(procs[v], n, t)
    out: dict = {}
    rng = random.Random(seed)
    for _ in range(reps):
        rng.shuffle(calls)
        for n, v, t in calls:
            column = t if t.startswith("torch") else f"{v} {t}"
            out.setdefault((n, column), []).append(ask(procs[v], n, t))
    for p in procs.values():
        p.stdin.close()
        p.wait()
    return out


COLUMNS = ("torch False", "torch True", "before ours False", "before ours True", "after ours False",
           "after ours True")


def summary(times: dict, names: list, label: str) -> None:
    """Per column: the median over the cases of each case's min and median, CPU and wall."""
    print(f"\n{label} ({len(names)}): median over the cases of each case's min / median, ms")
    print("| measure | " + " | ".join(COLUMNS) + " | after / before (True) | after True / torch False | "
          "after True / torch True |")
    print("|" + "---|" * (len(COLUMNS) + 4))
    for which, k in (("CPU", 1), ("wall", 2)):
        for stat in (min, statistics.median):
            m = {c: statistics.median(stat(r[k] for r in times[n, c]) for n in names) for c in COLUMNS}
            print(f"| {which} {stat.__name__} | " + " | ".join(f"{m[c] * 1e3:.1f}" for c in COLUMNS) +
                  f" | {m['after ours True'] / m['before ours True']:.2f} | "
                  f"{m['after ours True'] / m['torch False']:.2f}x | {m['after ours True'] / m['torch True']:.2f}x |")
    for n in names:
        for t in TOOLS[2:]:
            before = {r[0] for r in times[n, f'before {t}']}
            after = {r[0] for r in times[n, f'after {t}']}
            if before != after:
                print(f"VERDICTS DIFFER: {n} {t}: before {sorted(before)}, after {sorted(after)}")


@contextlib.contextmanager
def head_tree():
    """HEAD's tree (`git archive HEAD | tar -x`) in a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="dropin_head_") as tmp:
        archive = subprocess.Popen(["git", "archive", "HEAD"], cwd=HERE.parent, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", tmp], stdin=archive.stdout, check=True)
        archive.stdout.close()
        if archive.wait() != 0:
            raise SystemExit(f"git archive HEAD failed (exit {archive.returncode}) in {HERE.parent}")
        yield Path(tmp)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, nargs="?", help="the base revision's tree (git archive REV | tar -x -C DIR)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", choices=("functions", "modules"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help=f"HEAD (unless a base is given) against the working tree, 2 repetitions, {QUICK_CASES} "
                         "cases of each group (smoke run)")
    args = ap.parse_args(argv)
    if args.base is None and not args.quick:
        ap.error("give the base revision's tree (or --quick: HEAD's)")
    if args.quick:
        args.reps = 2
    with contextlib.nullcontext(args.base) if args.base is not None else head_tree() as base:
        _bench(base, args)


def _bench(base: Path, args) -> None:
    sys.path.insert(0, str(HERE))
    from harness import load, machine, match_threads
    from torch_dropin_corpus import functions, modules
    match_threads(1)
    print(f"machine: {machine()}\nbefore: {base}{' (HEAD)' if args.base is None else ''}; after: {HERE.parent}; "
          f"{args.reps} repetitions, seed {args.seed}; before the runs: {load()}")
    fns = [] if args.only == "modules" else functions()
    mods = [] if args.only == "functions" else modules()
    groups = {"correct Functions": [n for n, *_, b in fns if not b], "planted-bug twins": [n for n, *_, b in fns if b],
              "modules": [n for n, *_ in mods]}
    if args.quick:
        groups = {label: names[:QUICK_CASES] for label, names in groups.items()}
    times = run(base, [n for g in groups.values() for n in g], args.reps, args.seed)
    for label, names in groups.items():
        if names:
            summary(times, names, label)
    print(f"\nafter the runs: {load()}")

if __name__ == "__main__":
    main()
