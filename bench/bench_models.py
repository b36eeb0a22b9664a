"""Real models exported from PyTorch: `gradcheck-svc verify` with default options vs
torch.autograd.gradcheck(fast_mode=True) on ResNet-18 and SqueezeNet 1.1 (issue 22 item 6, issue 25 goal 2).

The models: bench/torch_models.py, torchvision's architectures, layer names and initialization written
from plain torch.nn (torchvision is not needed; nothing is downloaded), random weights, float64, eval
mode, one 1x3xSxS input (uniform [0, 1), --size, default 64). Each is exported with
torch.onnx.export(model, (x,), f) -- the TorchScript exporter's defaults -- and the loss is the sum of
the logits on both sides (the importer's default loss).

Timed, per repetition:
  ours   the in-process `gradcheck-svc verify MODEL.onnx`: import (within limits raised for the model:
         ResNet-18 is over the default 10^7 elements) + validation + verify() with default options
         (--fd auto: the joint screen of all parameters, 16 directions; the symbolic oracle's size check)
  torch  torch.autograd.gradcheck(f, params, fast_mode=True), f(*params) = the module's sum of logits by
         torch.func.functional_call, params its parameters (BatchNorm's weight and bias too; the export
         folds BatchNorm into the convs, so ours checks fewer, folded tensors): one random direction per
         tensor, 2 forwards each, against one vector-Jacobian product; it raises on a mismatch
Before timing, both sides must agree: the engine's loss equals torch's, and every initializer that kept
its torch name (and its shape) has torch autograd's gradient within 1e-9 relative. The cases alternate
within every repetition (interleaved); min and median; 1 thread first (numpy's BLAS and torch the same).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_models.py [--quick] [--reps N] [--resnet-reps N]
        [--size S] [--threads 1,2]

BENCHMARKS.md's table: no options (size 64, 1 thread, 5 repetitions of each model). The agreement check's
calls (one verification, one torch forward and backward) are the warm-up. --quick: SqueezeNet only, 1
repetition, size 32.
"""
from __future__ import annotations

import argparse
import io
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fmt_s, interleaved, load, machine, match_threads, median, table, thread_counts  # noqa: E402
from torch_models import build  # noqa: E402

from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.validate import Limits  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.onnx_import.folding import FoldBudget  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions  # noqa: E402
from gradcheck_svc.verify import verify  # noqa: E402

MODELS = ("squeezenet1_1", "resnet18")
MAX_ELEMENTS = 100_000_000  # --max-elements for these models (ResNet-18 at 64x64: ~12.5 M)
SERVER_SECONDS = 120.0  # the server's default max_request_seconds (limits.py)


def export(model, x) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        f = io.BytesIO()
        torch.onnx.export(model, (x,), f, dynamo=False)
        return f.getvalue()


def input_name(blob: bytes) -> str:
    import onnx

    m = onnx.load_from_string(blob)
    inits = {t.name for t in m.graph.initializer}
    (name,) = [vi.name for vi in m.graph.input if vi.name not in inits]
    return name


def ours(blob: bytes, x: np.ndarray, xname: str):
    """What `gradcheck-svc verify MODEL.onnx --max-elements 1e8` does in process: import, validate, verify."""
    msg = import_onnx(blob, ImportOptions(inputs={xname: x}), budget=FoldBudget(max_elements=MAX_ELEMENTS))
    graph = load_graph(msg, limits=Limits(max_elements=MAX_ELEMENTS))
    report = verify(graph)
    assert report.verdict == "pass", report.to_text()
    return graph, report


def torch_problem(model, x):
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in model.named_parameters())
    buffers = dict(model.named_buffers())

    def f(*ps):
        return torch.func.functional_call(model, {**dict(zip(names, ps)), **buffers}, (x,)).sum()
    return f, names, params


def agree(report, graph, f, names, params) -> tuple[float, int]:
    """Loss and the gradients of the initializers that kept their torch names equal torch's."""
    loss = f(*params)
    grads = dict(zip(names, torch.autograd.grad(loss, params)))
    value = float(loss.detach())
    assert abs(value - report.loss) <= 1e-9 * abs(value), (value, report.loss)
    worst, n = 0.0, 0
    for p in report.parameters:
        g = grads.get(p.name)
        if g is None or tuple(g.shape) != tuple(p.shape) or p.source_names:
            continue  # renamed, merged or folded by the exporter: its gradient is another tensor's
        g = g.numpy()
        worst = max(worst, float(np.abs(p.gradient - g).max() / max(np.abs(g).max(), 1e-300)))
        n += 1
    assert n and worst < 1e-9, (n, worst)
    return worst, n


def run_model(name: str, size: int, reps: int):
    model = build(name)
    x = torch.rand(1, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    blob = export(model, x)
    xname = input_name(blob)
    t0 = time.perf_counter()
    graph, report = ours(blob, x.numpy(), xname)
    first = time.perf_counter() - t0
    f, names, params = torch_problem(model, x)
    worst, matched = agree(report, graph, f, names, params)
    cases = {"ours (verify, defaults)": lambda: ours(blob, x.numpy(), xname),
             "torch gradcheck fast_mode": lambda: torch.autograd.gradcheck(f, params, fast_mode=True)}
    times = interleaved(cases, reps=reps, warmup=0)  # warmed up by the agreement check
    t = median(times["torch gradcheck fast_mode"])
    modes = {}
    for p in report.parameters:
        modes[p.fd.checked_by] = modes.get(p.fd.checked_by, 0) + 1
    elements = sum(int(np.prod(p.shape)) for p in report.parameters)
    torch_elements = sum(p.numel() for p in params)
    rows = []
    for case, ts in times.items():
        mine = case.startswith("ours")
        rows.append([name, case, torch.get_num_threads(),
                     f"{len(report.parameters)} / {elements / 1e6:.2f} M" if mine else
                     f"{len(params)} / {torch_elements / 1e6:.2f} M",
                     len(ts), fmt_s(min(ts)), fmt_s(median(ts)), "-" if not mine else f"{t / median(ts):.2g}x"])
    timings = {k: round(v, 2) for k, v in report.timings.items()}
    notes = (f"{name}: {len(blob) / 1e6:.1f} MB ONNX, {sum(s.size for s in graph.specs.values()) / 1e6:.1f} M elements "
             f"in the graph; first verification {first:.1f} s (timings {timings}); fd_checked_by {modes}; "
             f"{matched} parameters that kept their torch names match torch autograd to {worst:.1e} (relative)")
    return rows, notes, max(times["ours (verify, defaults)"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="SqueezeNet only, 1 repetition, 32x32 (smoke run)")
    ap.add_argument("--reps", type=int, default=5, help="SqueezeNet's repetitions (default 5)")
    ap.add_argument("--resnet-reps", type=int, default=5, help="ResNet-18's repetitions (default 5)")
    ap.add_argument("--size", type=int, default=64, help="input height and width (default 64)")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts, 1 first (default 1)")
    args = ap.parse_args(argv)
    models = MODELS[:1] if args.quick else MODELS
    size = 32 if args.quick else args.size
    reps = {"squeezenet1_1": 1 if args.quick else args.reps, "resnet18": args.resnet_reps}
    rows, notes, slowest = [], [], {}
    for n in thread_counts(args.threads):
        match_threads(n)
        for name in models:
            r, note, worst_s = run_model(name, size, reps[name])
            rows += r
            notes.append(note)
            slowest[name] = max(slowest.get(name, 0.0), worst_s)
    print(f"## bench_models: torch.nn models exported with torch.onnx.export (1x3x{size}x{size}, float64), "
          "`verify` with default options vs torch.autograd.gradcheck(fast_mode=True)\n")
    print(f"machine: {machine()}\n")
    print(table(["model", "case", "threads (numpy BLAS = torch)", "parameters checked (tensors / elements)", "reps",
                 "min", "median", "speed-up (torch median / this)"], rows))
    print()
    for note in notes:
        print(f"- {note}")
    print("\ngoals: >= 2x faster than gradcheck(fast_mode=True) (issue 25 goal 2); ResNet-18 within the server's "
          f"default {SERVER_SECONDS:g} s request time (issue 22 item 6): slowest ResNet-18 run "
          + (f"{slowest['resnet18']:.1f} s" if "resnet18" in slowest else "not run"))
    print(f"after the runs: {load()}")


if __name__ == "__main__":
    main()
