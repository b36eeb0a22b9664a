"""The screen's guarantee, swept (README "Finite differences"; issue 32 item 2): an error planted in one
element of a parameter, or in every element, at 10x and 100x that element's own bound (its tolerance plus
the rounding of its own central difference, tests/plants.py `element_bound`), in every parameter tensor of
chain_256 (512 tensors, the joint screen) and of a wide MLP (256 x 4: 65,536-element weights, the joint screen
at default options, flagged weights narrowed to elements; also in float32 and with 1e4 added to its loss),
and of ResNet-18 at 1x3x224x224 (bench/torch_models.py exported as bench/bench_models.py does: 42 folded
tensors, 11.7 M parameters), with default options. Each must be found (verdict FAIL, only that parameter
failing) and localized (one error finding, rule_error at the planted node, naming that parameter). Prints
one line per miss and a summary per graph; exit 1 on a miss.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_element_plants.py [--quick] [--every K]
        [--resnet-every K] [--graphs chain_256,mlp,resnet18]

--every K plants in every K-th tensor of chain_256 and the MLPs, --resnet-every K in ResNet-18's (default 1:
all). --quick: a few tensors of chain_256 and the MLPs, single-element errors at 10x only, ResNet-18 left
out (a smoke run); the full sweep is 4 x (536 + 3 x 8 + 42) verifications (hours on one core: sample).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import load, machine, match_threads, median  # noqa: E402
from plants import element_bound, element_bug, mlp, plant, plant_message, unregister  # noqa: E402

from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.verify import verify  # noqa: E402
from gradcheck_svc.verify.compare import Tolerance  # noqa: E402


def _graphs(which: set):
    """(name, the correct graph, build(target, op) -> the graph with the plant, family) of the graphs asked for."""
    if "chain_256" in which:
        doc = json.loads((ROOT / "examples" / "graphs" / "chain_256.json").read_text())
        yield "chain_256", load_graph(doc), lambda target, op: load_graph(plant(doc, target, op)), "chain_256"
    if "mlp" in which:
        for name, kw in (("mlp_256x4", {}), ("mlp_256x4 float32", {"dtype": "float32"}),
                         ("mlp_256x4 loss + 1e4", {"offset": 1e4})):
            yield name, mlp(width=256, depth=4, **kw), \
                lambda target, op, kw=kw: mlp(width=256, depth=4, bugs={target: op}, **kw), "mlp"
    if "resnet18" in which:
        msg, limits = _resnet18_message()
        yield ("resnet18 224x224", load_graph(msg, limits=limits),
               lambda target, op: load_graph(plant_message(msg, target, op), limits=limits), "resnet18")


def _resnet18_message():
    """ResNet-18 at 1x3x224x224 as bench_models.py exports and imports it, and the limits it needs."""
    import torch

    from bench_models import MAX_ELEMENTS, export, input_name
    from torch_models import build, example_input

    from gradcheck_svc.graph.validate import Limits
    from gradcheck_svc.onnx_import import import_onnx
    from gradcheck_svc.onnx_import.folding import FoldBudget
    from gradcheck_svc.onnx_import.importer import ImportOptions

    torch.set_num_threads(1)
    x = example_input("resnet18", 224)
    blob = export(build("resnet18"), x)
    msg = import_onnx(blob, ImportOptions(inputs={input_name(blob): x.numpy()}),
                      budget=FoldBudget(max_elements=MAX_ELEMENTS))
    return msg, Limits(max_elements=MAX_ELEMENTS)


def _delta(kind: str, times: float, bound: np.ndarray, shape, seed: int):
    """(delta, index) for element_bug: one element (n // 3) or every element off by `times` its bound."""
    if kind == "element":
        i = bound.size // 3
        return times * bound[i], i
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], bound.size)
    return (times * bound * signs).reshape(shape), None


def sweep(name, correct, planted, every: int, cases) -> tuple[int, list, list]:
    clean = verify(correct)
    assert clean.verdict == "pass", f"{name}: the correct graph does not pass"
    tol = Tolerance.for_dtype(clean.dtype)
    rows = {p.name: p for p in clean.parameters}
    params = correct.parameters[::every]
    missed, times_s = [], []
    for k, target in enumerate(params):
        g = rows[target].gradient
        bound = element_bound(g, tol, clean.loss, correct.inputs[target].value)
        for kind, times in cases:
            op = element_bug(*_delta(kind, times, bound, g.shape, k))
            try:
                t0 = time.perf_counter()
                report = verify(planted(target, op))
                times_s.append(time.perf_counter() - t0)
            finally:
                unregister(op)
            failing = [p.name for p in report.parameters if p.status != "ok"]
            errors = [(f.node, f.cause, f.parameters) for f in report.findings if f.severity == "error"]
            if not (report.verdict == "fail" and failing == [target] and
                    errors == [(f"{target}_bug", "rule_error", [target])]):
                missed.append((target, kind, times))
                print(f"MISSED {name} {target} {kind} {times}x: verdict {report.verdict}, failing {failing}, "
                      f"errors {errors}", flush=True)
            else:  # progress, for a sweep that may be stopped before its summary
                print(f"found {name} {target} {kind} {times}x in {times_s[-1]:.1f} s", file=sys.stderr, flush=True)
    return len(params) * len(cases), missed, times_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few tensors, single elements at 10x (smoke run)")
    ap.add_argument("--every", type=int, default=None, help="plant in every K-th tensor (default 1; --quick 128)")
    ap.add_argument("--resnet-every", type=int, default=1, help="plant in every K-th tensor of ResNet-18")
    ap.add_argument("--graphs", default="chain_256,mlp,resnet18", help="which graphs (default all three)")
    args = ap.parse_args(argv)
    cases = [("element", 10)] if args.quick else [(k, t) for k in ("element", "tensor") for t in (10, 100)]
    which = set(args.graphs.split(",")) - ({"resnet18"} if args.quick else set())
    match_threads(1)  # 1 thread, as the tables say
    print(f"machine: {machine()}")
    total_missed = 0
    for name, correct, planted, family in _graphs(which):
        every = (args.resnet_every if family == "resnet18" else
                 args.every or (max(1, len(correct.parameters) // 4) if args.quick else 1))
        planted_n, missed, times = sweep(name, correct, planted, every, cases)
        total_missed += len(missed)
        print(f"{name}: planted {planted_n}, found and localized {planted_n - len(missed)}, missed {len(missed)} "
              f"{missed[:10]}; seconds per verification min {min(times):.2f} median {median(times):.2f} "
              f"max {max(times):.2f}; {load()}", flush=True)
    return 1 if total_missed else 0


if __name__ == "__main__":
    sys.exit(main())
