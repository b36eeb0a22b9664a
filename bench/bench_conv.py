"""The conv op alone, this tree's ops/conv.py against a baseline copy of it (by default main's, from git):
forward, vjp (input and weight gradients) and the finite differences' batched forwards (leading copy axes on
X or on W), at ResNet shapes, CPU time and wall, the two versions interleaved in every repetition.

--model NAME (bench/torch_models.py, e.g. resnet18 at --size 224): instead, one whole verify() of that model
exported to ONNX (bench_models.py's `ours`: import, validate, verify with defaults), the registry's conv and
conv_transpose switched between the baseline's functions and this tree's before each run, interleaved.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=.:clients/python .venv/bin/python \
        bench/bench_conv.py [--reps 7 | --quick] [--baseline main | --baseline-file path/to/conv.py] [--model resnet18]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, median  # noqa: E402

from gradcheck_svc.ops import conv as current  # noqa: E402
from gradcheck_svc.ops.windows import geometry  # noqa: E402

# name: X, W, strides, pads (every side), group, copies (leading axis on "x" or "w", or none)
CASES = {
    "3x3 64->64 @56": ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1, None),
    "7x7/2 3->64 @224 (stem)": ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1, None),
    "3x3 512->512 @7": ((1, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1, None),
    "1x1/2 64->128 @56": ((1, 64, 56, 56), (128, 64, 1, 1), 2, 0, 1, None),
    "1x1 256->64 @28, N=4": ((4, 256, 28, 28), (64, 256, 1, 1), 1, 0, 1, None),
    "depthwise 3x3 64 @56": ((1, 64, 56, 56), (64, 1, 3, 3), 1, 1, 64, None),
    "3x3 128->128 @28, 8 X copies": ((1, 128, 28, 28), (128, 128, 3, 3), 1, 1, 1, ("x", 8)),
    "3x3 512->512 @7, 8 X copies": ((1, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1, ("x", 8)),
    "3x3 128->128 @28, 8 W copies": ((1, 128, 28, 28), (128, 128, 3, 3), 1, 1, 1, ("w", 8)),
}


def baseline_module(args):
    """The baseline conv.py, its functions only (its ops not registered a second time)."""
    if args.baseline_file:
        source = Path(args.baseline_file).read_text()
    else:
        run = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.baseline}:gradcheck_svc/ops/conv.py"],
                             capture_output=True, text=True)
        if run.returncode:  # a checkout without that revision (make bench in a fresh clone): no comparison
            print(f"no baseline: git show {args.baseline} failed ({run.stderr.strip()}); "
                  "both sides below are this tree's conv.py")
            return vars(current)
        source = run.stdout
    source = (source.replace("from ..", "from gradcheck_svc.").replace("from .", "from gradcheck_svc.ops.")
              .replace("register(OpDef(", "(OpDef("))
    namespace = {"__name__": "baseline_conv"}
    exec(compile(source, "baseline_conv.py", "exec"), namespace)
    return namespace


def calls(mod, case, rng):
    """name -> callable for one case and one version of the module (a dict: the module's namespace)."""
    xs, ws, stride, pad, group, copies = case
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    geo = geometry("bench", xs[2:], ws[2:], {"strides": [stride] * 2, "pads": [pad] * 4})
    conv, vjp = mod["_conv"], mod["_conv_vjp"]
    if copies is not None:
        which, n = copies
        x = np.stack([x] * n) if which == "x" else x
        w = np.stack([w] * n) if which == "w" else w
        return {"batched forward": lambda: conv(np, x, w, b, geo=geo, group=group, bias=True)}
    g = rng.standard_normal(conv(np, x, w, b, geo=geo, group=group, bias=True).shape)
    return {"forward": lambda: conv(np, x, w, b, geo=geo, group=group, bias=True),
            "vjp": lambda: vjp(np, g, (x, w), geo, group, True)}


def timed(fn):
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def agree(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return max(float(np.max(np.abs(u - v)) / max(1.0, float(np.max(np.abs(v))))) for u, v in zip(a, b))


def use(ns):
    """Point the registry's conv and conv_transpose at the functions of one version (ns: a module namespace)."""
    from gradcheck_svc.ops.registry import REGISTRY
    for op, fields in (("conv", {"forward": "_conv", "vjp": "_conv_vjp", "sliced": "_sliced"}),
                       ("conv_transpose", {"forward": "_conv_transpose", "vjp": "_conv_transpose_vjp"})):
        for field, fn in fields.items():
            object.__setattr__(REGISTRY[op], field, ns[fn])  # OpDef is frozen: a bench-only switch


def whole_model(args, base, mine):
    """One verify() of the model per version and repetition, interleaved: CPU and wall seconds."""
    from bench_models import ours, problem
    _, x, blob, xname = problem(args.model, args.size, 128)
    t = {"baseline": [], "this": []}
    grads = {}
    for r in range(args.reps):
        for side in (("baseline", "this") if r % 2 == 0 else ("this", "baseline")):
            use(base if side == "baseline" else mine)
            c0, w0 = time.process_time(), time.perf_counter()
            _, report = ours(blob, x, xname)
            t[side].append((time.process_time() - c0, time.perf_counter() - w0))
            grads[side] = {p.name: p.gradient for p in report.parameters}
    diff = max(agree(grads["this"][n], grads["baseline"][n]) for n in grads["baseline"])
    for side, v in t.items():
        cpu, wall = [c for c, _ in v], [w for _, w in v]
        print(f"| {args.model} {args.size}x{args.size} verify() | {side} | CPU {min(cpu):.1f} / {median(cpu):.1f} s | "
              f"wall {min(wall):.1f} / {median(wall):.1f} s |")
    print(f"max relative difference of the gradients: {diff:.1e}; {machine().rsplit('; ', 1)[-1]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--baseline", default="main", help="git revision whose ops/conv.py is the baseline")
    ap.add_argument("--baseline-file", help="a conv.py file as the baseline instead")
    ap.add_argument("--only", help="cases whose name contains this")
    ap.add_argument("--model", help="a whole verify() of this bench/torch_models.py model instead")
    ap.add_argument("--size", type=int, default=224, help="--model's image size")
    ap.add_argument("--quick", action="store_true", help="3 repetitions (bench/run_all.py --quick)")
    args = ap.parse_args()
    args.reps = 3 if args.quick else args.reps
    base, mine = baseline_module(args), vars(current)
    print(machine())
    if args.model:
        return whole_model(args, base, mine)
    print("| case | call | baseline CPU min / median | this CPU min / median | CPU ratio (medians) | "
          "wall ratio (medians) | max rel. diff |")
    print("|---|---|---|---|---|---|---|")
    for name, case in CASES.items():
        if args.only and args.only not in name:
            continue
        before, after = calls(base, case, np.random.default_rng(1)), calls(mine, case, np.random.default_rng(1))
        for call in before:
            diff = agree(after[call](), before[call]())
            t = {"b": [], "a": []}
            for r in range(args.reps):
                for side in ("ba" if r % 2 == 0 else "ab"):
                    t[side].append(timed((before if side == "b" else after)[call]))
            cpu = {s: [c for c, _ in v] for s, v in t.items()}
            wall = {s: [w for _, w in v] for s, v in t.items()}
            print(f"| {name} | {call} | {min(cpu['b']) * 1e3:.1f} / {median(cpu['b']) * 1e3:.1f} ms | "
                  f"{min(cpu['a']) * 1e3:.1f} / {median(cpu['a']) * 1e3:.1f} ms | "
                  f"{median(cpu['b']) / median(cpu['a']):.2f}x | {median(wall['b']) / median(wall['a']):.2f}x | "
                  f"{diff:.1e} |", flush=True)
    print(machine().rsplit("; ", 1)[-1])


if __name__ == "__main__":
    main()
