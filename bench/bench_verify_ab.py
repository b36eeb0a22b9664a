"""One in-process `verify()` of an ONNX model, a base revision's tree against this one, interleaved: each round
runs both, each in a fresh process (base, this, this, base, ...), every process importing the model and then timing
`verify()` alone (CPU and wall), 1 BLAS thread; min and median per side, the machine line.

    git archive REV | tar -x -C /tmp/base
    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_verify_ab.py /tmp/base [--model resnet18] [--size 224] \
        [--rounds 4]

The model is bench_models' export (torchvision's layout where torchvision is absent: bench/torch_models.py), made
once in a temporary directory and read by both sides. --quick: this tree against itself, SqueezeNet 1.1 at 32x32,
one round (a smoke run of the script).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import load, machine, match_threads  # noqa: E402

CHILD = r'''
import json, sys, time
from pathlib import Path
import numpy as np
import bench_models as b
from gradcheck_svc.verify import VerifyOptions, verify
b.match_threads(1)
d = Path(sys.argv[1])
blob, x = (d / "model.onnx").read_bytes(), np.load(d / "x.npy")
msg = b.import_onnx(blob, b.ImportOptions(inputs={(d / "input_name").read_text(): x}),
                    budget=b.FoldBudget(max_elements=b.MAX_ELEMENTS))
graph = b.load_graph(msg, limits=b.Limits(max_elements=b.MAX_ELEMENTS))
t0, c0 = time.perf_counter(), time.process_time()
report = verify(graph, VerifyOptions())
print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0, "verdict": report.verdict}))
'''


def timed(tree: Path, model_dir: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree}/clients/python:{tree}/bench"}
    out = subprocess.run([sys.executable, "-c", CHILD, model_dir], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{tree}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, nargs="?", help="the base revision's tree (git archive REV | tar -x -C DIR)")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="this tree against itself, squeezenet1_1 at 32, one round")
    args = ap.parse_args(argv)
    if args.quick:
        args.base, args.model, args.size, args.rounds = args.base or ROOT, "squeezenet1_1", 32, 1
    if args.base is None:
        ap.error("give the base revision's tree")
    import bench_models

    match_threads(1)  # (the machine line says what the children run with)
    sides = {"base": args.base.resolve(), "this": ROOT}
    times = {k: [] for k in sides}
    with tempfile.TemporaryDirectory() as tmp:
        _, x, blob, name = bench_models.problem(args.model, args.size, 128)
        (Path(tmp) / "model.onnx").write_bytes(blob)
        np.save(Path(tmp) / "x.npy", x.detach().numpy() if hasattr(x, "detach") else x)
        (Path(tmp) / "input_name").write_text(name)
        for r in range(args.rounds):
            for side in (("base", "this") if r % 2 == 0 else ("this", "base")):
                times[side].append(timed(sides[side], tmp))
    print(f"{args.model} at {args.size}x{args.size}, {args.rounds} round(s), one verify() per process, 1 thread")
    print(f"machine: {machine()}")
    print("| side | verdicts | CPU min / median | wall min / median |\n|---|---|---|---|")
    for side, runs in times.items():
        cpu, wall = [t["cpu"] for t in runs], [t["wall"] for t in runs]
        print(f"| {side} ({sides[side]}) | {', '.join(sorted({t['verdict'] for t in runs}))} | "
              f"{min(cpu):.2f} s / {statistics.median(cpu):.2f} s | {min(wall):.2f} s / {statistics.median(wall):.2f} s |")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
