"""Real models exported from PyTorch: `gradcheck-svc verify` with default options vs
torch.autograd.gradcheck(fast_mode=True) (issue 22 item 6, issue 25 goal 2, issue 32 item 6): SqueezeNet 1.1,
ResNet-18 and MobileNetV3-small at 1x3x224x224, a ViT-tiny (224x224: 197 tokens) and a 2-layer BERT-style
encoder at sequence 128.

The models: bench/torch_models.py, the architectures, layer names and initialization written from plain
torch.nn (torchvision is not needed; nothing is downloaded), random weights, float64, eval mode, one input
(an image uniform in [0, 1), --size; BERT's token embeddings normal, --seq). Each is exported with
torch.onnx.export(model, (x,), f) -- the TorchScript exporter's defaults -- and the loss is the sum of the
outputs on both sides (the importer's default loss).

Timed, per repetition (interleaved, 1 thread first: numpy's BLAS and torch the same):
  ours   the in-process `gradcheck-svc verify MODEL.onnx`: import (within limits raised for the model:
         ResNet-18 is over the default 10^7 elements) + validation + verify() with default options
  torch  torch.autograd.gradcheck(f, params, fast_mode=True), f(*params) = the module's sum of outputs by
         torch.func.functional_call, params its parameters (BatchNorm's weight and bias too; the export
         folds BatchNorm into the convs, so ours checks fewer, folded tensors): one random direction per
         tensor, 2 forwards each, against one vector-Jacobian product; it raises on a mismatch
Before timing, both sides must agree: the engine's loss equals torch's, and every initializer that kept
its torch name (and its shape) has torch autograd's gradient within 1e-9 relative.

Then, each in a fresh process of its own (the peak resident memory the kernel counted for it,
/proc's VmHWM): ours (the ONNX file read, imported and verified with defaults; torch is not imported), torch
(the model built, gradcheck once), and ours with --fd projection (its verdict and time; killed at
--projection-timeout).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_models.py [--quick] [--models a,b] [--reps N]
        [--size S] [--seq N] [--threads 1,2] [--no-projection] [--projection-timeout S] [--separate a,b]

--separate picks the separate runs (default all four): ours and torch (peak resident memory), projection, and
traced -- the verification's own peak under tracemalloc over the engine's training peak (report.memory), issue
43's memory goal (<= 2.5x), counted as tests/verify/test_memory_verification.py counts it. Issue 43's table in
BENCHMARKS.md: `--models M --reps 2 --separate traced`, one model per process, smallest first.

BENCHMARKS.md's table: no options (224x224, sequence 128, 1 thread, 3 repetitions). The agreement check's
calls (one verification, one torch forward and backward) are the warm-up. --quick: SqueezeNet at 32x32
and BERT at sequence 16, 1 repetition.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fmt_s, interleaved, load, machine, match_threads, median, table, thread_counts  # noqa: E402

from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.validate import Limits  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.onnx_import.folding import FoldBudget  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions  # noqa: E402
from gradcheck_svc.verify import verify  # noqa: E402

MODELS = ("squeezenet1_1", "resnet18", "mobilenet_v3_small", "vit_tiny", "bert_2layer")
MAX_ELEMENTS = 100_000_000  # --max-elements for these models (ResNet-18 at 64x64: ~12.5 M)
SERVER_SECONDS = 120.0  # the server's default max_request_seconds (limits.py)


def export(model, x) -> bytes:
    import torch

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


def ours(blob: bytes, x: np.ndarray, xname: str, fd_mode: str = "auto", must_pass: bool = True):
    """What `gradcheck-svc verify MODEL.onnx --max-elements 1e8 [--fd MODE]` does in process: import,
    validate, verify."""
    from gradcheck_svc.oracles.finite_diff import FDOptions
    from gradcheck_svc.verify import VerifyOptions

    msg = import_onnx(blob, ImportOptions(inputs={xname: x}), budget=FoldBudget(max_elements=MAX_ELEMENTS))
    graph = load_graph(msg, limits=Limits(max_elements=MAX_ELEMENTS))
    report = verify(graph, VerifyOptions(fd=FDOptions(mode=fd_mode)))
    assert report.verdict == "pass" or not must_pass, report.to_text()
    return graph, report


def torch_problem(model, x):
    import torch

    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in model.named_parameters())
    buffers = dict(model.named_buffers())

    def f(*ps):
        return torch.func.functional_call(model, {**dict(zip(names, ps)), **buffers}, (x,)).sum()
    return f, names, params


# ONNX float attributes are float32: MobileNetV3's HardSigmoid slope 1/6 is exported as 1/6 (1 + 3.0e-8), so
# the gradients through its squeeze-excitation blocks differ from torch's exact 1/6 by that much (relative)
AGREEMENT = {"mobilenet_v3_small": 1e-7}


def agree(report, graph, f, names, params, within: float = 1e-9) -> tuple[float, int]:
    """Loss and the gradients of the initializers that kept their torch names equal torch's."""
    import torch

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
    assert n and worst < within, (n, worst)
    return worst, n


def problem(name: str, size: int, seq: int):
    """(model, input, ONNX bytes, the input's name in the ONNX graph)."""
    from torch_models import build, example_input

    model, x = build(name, size=size, seq=seq), example_input(name, size, seq)
    blob = export(model, x)
    return model, x, blob, input_name(blob)


def run_model(name: str, size: int, seq: int, reps: int):
    """(table row cells, a note, the interleaved times) of one model: both sides agree, then are timed."""
    import torch

    model, x, blob, xname = problem(name, size, seq)
    t0 = time.perf_counter()
    graph, report = ours(blob, x.numpy(), xname)
    first = time.perf_counter() - t0
    f, names, params = torch_problem(model, x)
    worst, matched = agree(report, graph, f, names, params, AGREEMENT.get(name, 1e-9))
    cases = {"ours": lambda: ours(blob, x.numpy(), xname),
             "torch": lambda: torch.autograd.gradcheck(f, params, fast_mode=True)}
    times = interleaved(cases, reps=reps, warmup=0)  # warmed up by the agreement check
    modes = {}
    for p in report.parameters:
        modes[p.fd.checked_by] = modes.get(p.fd.checked_by, 0) + 1
    elements = sum(int(np.prod(p.shape)) for p in report.parameters)
    checked = (f"{len(report.parameters)} / {elements / 1e6:.2f} M; "
               f"{len(params)} / {sum(p.numel() for p in params) / 1e6:.2f} M")
    timings = {k: round(v, 2) for k, v in report.timings.items()}
    note = (f"{name}: {len(blob) / 1e6:.1f} MB ONNX, {sum(s.size for s in graph.specs.values()) / 1e6:.1f} M elements "
            f"in the graph; first verification {first:.1f} s (timings {timings}); fd_checked_by {modes}; "
            f"{matched} parameters that kept their torch names match torch autograd to {worst:.1e} (relative)")
    return [checked, report.verdict.upper()], note, times, blob, x.numpy(), xname


def in_child(args: list, timeout: float) -> dict:
    """Run this script's --child mode in a fresh process: its JSON line (verdict, seconds, the process's
    peak resident memory) -- or {"verdict": "not finished in N s"}."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"verdict": f"not finished in {timeout:.0f} s", "peak_bytes": None, "seconds": None}
    if proc.returncode != 0:
        return {"verdict": f"exit {proc.returncode}", "peak_bytes": None, "seconds": None}
    return json.loads(out.strip().splitlines()[-1])


def child(argv: list) -> int:
    """--child ours|projection DIR, or --child torch NAME SIZE SEQ: one run; prints
    {verdict, seconds, peak_bytes} (ru_maxrss of this process)."""
    kind = argv[0]
    t0 = time.perf_counter()
    if kind == "torch":
        import torch

        match_threads(1)
        from torch_models import build, example_input

        name, size, seq = argv[1], int(argv[2]), int(argv[3])
        f, _, params = torch_problem(build(name, size=size, seq=seq), example_input(name, size, seq))
        t0 = time.perf_counter()
        verdict = "PASS" if torch.autograd.gradcheck(f, params, fast_mode=True, raise_exception=False) else "FAIL"
    elif kind == "traced":
        return traced(Path(argv[1]))
    else:
        match_threads(1)
        d = Path(argv[1])
        blob, x = (d / "model.onnx").read_bytes(), np.load(d / "x.npy")
        _, report = ours(blob, x, (d / "input_name").read_text(), "projection" if kind == "projection" else "auto",
                         must_pass=False)
        verdict = report.verdict.upper()
    peak = peak_rss()
    print(json.dumps({"verdict": verdict, "seconds": time.perf_counter() - t0, "peak_bytes": peak}))
    return 0


def traced(d: Path) -> int:
    """--child traced DIR: the verification's own peak under tracemalloc (NumPy's buffers and Python's objects,
    not the BLAS's workspace; the import and the graph's reading before it) over the engine's training peak
    (report.memory), issue 43's memory goal (<= 2.5x), as tests/verify/test_memory_verification.py measures it."""
    import tracemalloc

    from gradcheck_svc.verify import VerifyOptions

    match_threads(1)
    blob, x = (d / "model.onnx").read_bytes(), np.load(d / "x.npy")
    msg = import_onnx(blob, ImportOptions(inputs={(d / "input_name").read_text(): x}),
                      budget=FoldBudget(max_elements=MAX_ELEMENTS))
    graph = load_graph(msg, limits=Limits(max_elements=MAX_ELEMENTS))
    del msg, blob
    t0 = time.perf_counter()
    tracemalloc.start()
    try:
        report = verify(graph, VerifyOptions())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    training = report.memory["training_peak_bytes"]
    print(json.dumps({"verdict": report.verdict.upper(), "seconds": time.perf_counter() - t0,
                      "traced_peak_bytes": peak, "training_peak_bytes": training}))
    return 0


def peak_rss() -> int | None:
    """This process's peak resident memory: /proc's VmHWM, which exec starts afresh (getrusage's ru_maxrss
    would carry the parent's peak across the exec)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def fmt_bytes(b) -> str:
    return "-" if b is None else f"{b / 2 ** 30:.2f} GiB" if b >= 2 ** 30 else f"{b / 2 ** 20:.0f} MiB"


NOT_RUN = {"verdict": "not run", "seconds": None, "peak_bytes": None}


def separate_runs(name: str, size: int, seq: int, blob: bytes, x: np.ndarray, xname: str, runs: set,
                  timeout: float) -> list:
    """Peak memory of each side, each in its own process, --fd projection's verdict and time, and the
    verification's traced peak over the engine's training peak -- those of `runs` only."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "model.onnx").write_bytes(blob)
        np.save(Path(tmp) / "x.npy", x)
        (Path(tmp) / "input_name").write_text(xname)
        mine = in_child(["ours", tmp], timeout) if "ours" in runs else NOT_RUN
        theirs = in_child(["torch", name, str(size), str(seq)], timeout) if "torch" in runs else NOT_RUN
        proj = in_child(["projection", tmp], timeout) if "projection" in runs else NOT_RUN
        tr = in_child(["traced", tmp], timeout) if "traced" in runs else {}
    traced_text = (f"{fmt_bytes(tr['traced_peak_bytes'])} / {fmt_bytes(tr['training_peak_bytes'])} = "
                   f"{tr['traced_peak_bytes'] / tr['training_peak_bytes']:.2f}x" if tr.get("traced_peak_bytes")
                   else tr.get("verdict", "not run"))
    ratio = (f"{mine['peak_bytes'] / theirs['peak_bytes']:.2f}x" if mine.get("peak_bytes") and theirs.get("peak_bytes")
             else "-")
    proj_text = proj["verdict"] + (f" ({proj['seconds']:.1f} s)" if proj.get("seconds") else "")
    return [fmt_bytes(mine.get("peak_bytes")), fmt_bytes(theirs.get("peak_bytes")), ratio, theirs["verdict"], proj_text,
            traced_text]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="SqueezeNet 32x32 and BERT at sequence 16, 1 repetition")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each model (default 3)")
    ap.add_argument("--size", type=int, default=224, help="image height and width (default 224)")
    ap.add_argument("--seq", type=int, default=128, help="BERT's sequence length (default 128)")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts, 1 first (default 1)")
    ap.add_argument("--no-projection", action="store_true", help="leave out the --fd projection runs")
    ap.add_argument("--separate", default="ours,torch,projection,traced",
                    help="the separate runs, comma-separated: ours and torch (peak resident memory), projection "
                         "(--fd projection's verdict), traced (the verification's tracemalloc peak over the engine's "
                         "training peak); default all")
    ap.add_argument("--projection-timeout", type=float, default=900.0, help="seconds per separate run")
    args = ap.parse_args(argv)
    models = ["squeezenet1_1", "bert_2layer"] if args.quick else args.models.split(",")
    size, seq, reps = (32, 16, 1) if args.quick else (args.size, args.seq, args.reps)
    rows, notes = [], []
    for n in thread_counts(args.threads):
        match_threads(n)
        for name in models:
            cells, note, times, blob, x, xname = run_model(name, size, seq, reps)
            t, o = median(times["torch"]), median(times["ours"])
            runs = set(args.separate.split(",")) - ({"projection"} if args.no_projection else set())
            extra = (separate_runs(name, size, seq, blob, x, xname, runs, args.projection_timeout)
                     if n == 1 else ["-"] * 6)
            rows.append([name, n, cells[0], len(times["ours"]), fmt_s(min(times["ours"])) + " / " + fmt_s(o),
                         fmt_s(min(times["torch"])) + " / " + fmt_s(t), f"{t / o:.2f}x", *extra[:3],
                         cells[1], extra[3], extra[4], extra[5]])
            notes.append(note)
            print(f"done {name}: {rows[-1]}; {load()}", file=sys.stderr, flush=True)
    print(f"## bench_models: torch.nn models exported with torch.onnx.export (images 1x3x{size}x{size}, BERT sequence "
          f"{seq}, float64), `verify` with default options vs torch.autograd.gradcheck(fast_mode=True)\n")
    print(f"machine: {machine()}\n")
    print(table(["model", "threads", "checked: ours; torch (tensors / elements)", "reps", "ours min / median",
                 "torch min / median", "speed (torch / ours, medians)", "peak ours", "peak torch",
                 "peak ours / torch", "verdict ours", "verdict torch", "ours --fd projection",
                 "verification traced peak / engine training peak"], rows))
    print()
    for note in notes:
        print(f"- {note}")
    print("\ngoals (issue 32 item 6): speed >= 2x torch's with the default directions, peak memory <= 2x torch's, "
          "PASS; --fd projection PASS on every model; issue 43: verification peak <= 2.5x the engine's training peak")
    print(f"after the runs: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
