"""Real architectures end to end: SqueezeNet and ResNet-50 (ONNX's light models).

Per model:
  import     gradcheck-svc's ONNX import + graph validation
  forward    the engine's forward (float32, the model's dtype) vs onnxruntime's on the same
             model and input (onnxruntime is the forward-speed reference; a benchmark-only
             dependency: pip install '.[bench]'), interleaved; same thread count on both sides:
             for each count of --threads (default 1,2; the 1-thread table first) numpy's BLAS
             and torch get it (harness.match_threads) and onnxruntime gets it as
             intra_op_num_threads, with sequential execution and inter_op_num_threads 1 (the
             engine runs one op at a time too); min / median, the ratio of the medians
  verify     `gradcheck-svc verify MODEL.onnx --fd projection --loss cotangent --loss-output LOGITS
             --dtype float64 --params P`: SqueezeNet every weight and bias (constants, 1.2 M elements),
             ResNet-50 every Conv and Gemm weight (25.5 M elements); projection FD with K directions,
             streamed in memory-bounded batches; wall time and the process's peak RSS
  fault      the same with `--fault X:scale:1.5`, X the cached input of the middle Conv, the parameter
             its weight; with integrity checking (the default: the fingerprints name the Conv) and
             without (the gradient comparison catches it, localization looks for the node)

Each verify runs in its own process (peak RSS is the process's own), with numpy's default BLAS
threads (printed; no peer is compared there).

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_onnx_models.py [--quick] [--directions K] [--threads 1,2] [--reps N]

BENCHMARKS.md's tables: no options (--threads 1,2, 10 forward repetitions, 2 directions).
--quick: SqueezeNet only, 5 forward repetitions.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import blas_info, fmt_s, interleaved, load, machine, match_threads, median, min_med, table  # noqa: E402
from harness import thread_counts  # noqa: E402

try:
    import onnx
    import onnxruntime as ort
except ImportError:
    raise SystemExit("bench_onnx_models needs onnx and onnxruntime: pip install '.[bench]'") from None

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import Program, forward, prepare_feeds  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.validate import Limits  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ("squeezenet", "resnet50")
BIG = ["--max-elements", "1000000000"]

# runs the CLI in this child process, then reports its own peak RSS on the last stderr line
CHILD = ("import resource, sys; from gradcheck_svc.cli import main; rc = main(sys.argv[1:]); "
         "print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")


def weights(path: Path) -> str:
    """Every Conv and Gemm weight (the ConstantOfShape tensors they multiply), comma-separated."""
    g = onnx.load(path).graph
    return ",".join(n.input[1] for n in g.node if n.op_type in ("Conv", "Gemm"))


# Which parameters and tolerance per model. ResNet-50's loss is ~6e20 (constant weights 0.02 grow the
# activations to 1e19): finite differences then resolve a directional derivative only to ~1e10, which
# is the size of the gradients of BatchNorm biases and running means deep in the net (43 of its 239
# parameter tensors fail for that reason with --params constants; see BENCHMARKS.md). Its Conv and Gemm
# weights (25.5 M of the 25.6 M elements) agree to 1.5e-4: checked at rtol 1e-3.
PLAN = {"squeezenet": (lambda path: "constants", "1e-4"), "resnet50": (weights, "1e-3")}


def landmarks(path: Path) -> tuple[str, str, str]:
    """(logits: the Softmax's input, the middle Conv's input, the middle Conv's weight)."""
    g = onnx.load(path).graph
    logits = next(n.input[0] for n in g.node if n.op_type == "Softmax")
    convs = [n for n in g.node if n.op_type == "Conv"]
    mid = convs[len(convs) // 2]
    return logits, mid.input[0], mid.input[1]


def run_verify(path: Path, args: list[str]) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, "verify", str(path), "--format", "json", *BIG, *args],
                       capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    rss = int(p.stderr.strip().splitlines()[-1].split()[1]) * 1024
    report = json.loads(p.stdout) if p.stdout.strip() else {}
    return {"rc": p.returncode, "seconds": seconds, "rss": rss, "report": report, "stderr": p.stderr[-2000:]}


def forward_times(path: Path, reps: int, counts: list[int]) -> dict[int, tuple[list, list]]:
    """{threads: (engine seconds, onnxruntime seconds)}, the two interleaved, per thread count."""
    graph = load_graph(import_onnx(path, ImportOptions(params="none")), limits=Limits(max_elements=10**9))
    program = Program(graph, np.float32)
    feeds = prepare_feeds(program, NUMPY)
    out = {}
    for threads in counts:
        match_threads(threads)
        opts = ort.SessionOptions()
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1  # sequential execution: one op at a time, as the engine runs them
        opts.log_severity_level = 3
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        x = {i.name: np.asarray(graph.inputs[i.name].value, dtype=np.float32) for i in session.get_inputs()}
        times = interleaved({"engine": lambda: forward(program, NUMPY, feeds, grad=False),
                             "onnxruntime": lambda: session.run(None, x)}, reps=reps)
        out[threads] = (times["engine"], times["onnxruntime"], machine())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="SqueezeNet only, 5 forward repetitions")
    ap.add_argument("--directions", type=int, default=None, help="projection directions (default 2)")
    ap.add_argument("--threads", default="1,2",
                    help="forward comparison thread counts, numpy's BLAS, torch and onnxruntime alike, one table "
                         "each, 1 first (default 1,2)")
    ap.add_argument("--reps", type=int, default=None, help="forward repetitions (default 10; --quick 5)")
    args = ap.parse_args()
    k = args.directions or 2
    counts = thread_counts(args.threads)
    reps = args.reps or (5 if args.quick else 10)
    default_threads = blas_info().get("num_threads", "?")  # what the verify child processes get
    print(f"machine: {machine()}", flush=True)
    rows, fault_rows, fwd = [], [], {}
    for name in MODELS[:1] if args.quick else MODELS:
        path = LIGHT / f"light_{name}.onnx"
        logits, conv_in, conv_w = landmarks(path)
        params, rtol = PLAN[name][0](path), PLAN[name][1]
        t0 = time.perf_counter()
        graph = load_graph(import_onnx(path, ImportOptions(params=params)), limits=Limits(max_elements=10**9))
        t_import = time.perf_counter() - t0
        n_params = sum(graph.inputs[p].value.size for p in graph.parameters)
        fwd[name] = forward_times(path, reps, counts)
        # float64: with the light models' constant weights, activations reach 1e19 in ResNet-50 and
        # float32 rounding alone exceeds the float32 tolerance (the report says "precision")
        # rtol: SqueezeNet's loss is ~5e11 and the network deep; a central difference's error reaches a
        # few 1e-5 of a directional derivative (float64's default rtol would call that a mismatch)
        common = ["--fd", "projection", "--directions", str(k), "--loss", "cotangent", "--loss-output", logits,
                  "--dtype", "float64", "--rtol", rtol]
        ok = run_verify(path, common + ["--params", params])
        rep = ok["report"]
        rows.append([name, f"{len(graph.parameters)} ({n_params / 1e6:.1f} M)", fmt_s(t_import), k, rtol,
                     rep.get("verdict", f"rc {ok['rc']}"), f"{ok['seconds']:.0f} s", f"{ok['rss'] / 2**30:.2f} GiB"])
        for integrity in ("check", "off"):  # off: only the gradient comparison and localization can find it
            bad = run_verify(path, common + ["--params", conv_w, "--fault", f"{conv_in}:scale:1.5",
                                             "--integrity", integrity])
            errors = [f for f in bad["report"].get("findings", []) if f["severity"] == "error"]
            named = f"{errors[0]['node']} ({errors[0]['op']}, {errors[0]['cause']})" if errors else "-"
            failed = [p["name"] for p in bad["report"].get("parameters", []) if not p["passed"]]
            fault_rows.append([name, f"{conv_in}:scale:1.5", integrity, bad["report"].get("verdict", f"rc {bad['rc']}"),
                               ", ".join(failed) or "-", named, f"{bad['seconds']:.0f} s",
                               f"{bad['rss'] / 2**30:.2f} GiB"])
            print(f"{name}: fault run (integrity {integrity}) {bad['rc']} -> {named}", flush=True)
        print(f"{name}: verify {ok['rc']} in {ok['seconds']:.0f} s", flush=True)
    for threads in counts:
        print(f"\n### Forward, engine vs onnxruntime, {threads} thread(s), {reps} interleaved repetitions\n")
        print(f"machine: {next(iter(fwd.values()))[threads][2]}\n")
        print(table(["model", "threads", "engine forward min / median", "onnxruntime min / median",
                     "engine / ort (medians)"],
                    [[name, threads, min_med(eng), min_med(ref), f"{median(eng) / median(ref):.1f}x"]
                     for name, runs in fwd.items() for eng, ref, _ in [runs[threads]]]))
    print(f"\n### Verify (child processes, numpy's default BLAS threads: {default_threads}; one run each)\n")
    print(table(["model", "parameters", "import", "directions", "rtol", "verdict", "verify wall", "peak RSS"], rows))
    print()
    print(table(["model", "fault", "integrity", "verdict", "failed parameters", "first error finding", "wall",
                 "peak RSS"], fault_rows))
    print(f"\nafter the run: {load()}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
