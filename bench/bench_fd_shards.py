"""One model's finite differences split over processes (verify/fd_shards.py): 1, 2 and 4 shards, each index run as
an Indexed Job runs it (JOB_COMPLETION_INDEX), then the merge, against one `verify` process.

Models (--model):
  chain_256  examples/graphs/chain_256.json (512 tensors: the joint screen takes 505, 16 directions and a second
             pass of 8; the 7 cheapest in full)
  resnet     ResNet-18's layout from plain torch.nn (torchvision is not installed): a 3x3 stem, four stages of two
             basic blocks (3x3 conv, BatchNorm, ReLU, 3x3 conv, BatchNorm, the shortcut -- a strided 1x1 conv +
             BatchNorm where the shape changes), global average pooling and a linear head; widths --widths
             (ResNet-18's are 64,128,256,512), input 1x3xSxS (--size), float64, random weights; exported by
             torch.onnx.export (the TorchScript exporter, BatchNorm folded into the convs) and verified as
             `gradcheck-svc verify MODEL.onnx` verifies it (every weight a parameter, the loss the sum of the logits)

Each layout, every process with one BLAS thread, one process at a time (the shards one after another, as N
idle 1-CPU pods would run them side by side):
  single   gradcheck-svc verify MODEL --format json
  shard i  gradcheck-svc verify MODEL --fd-shard-count N --fd-out DIR   (JOB_COMPLETION_INDEX=i)
  merge    gradcheck-svc verify MODEL --fd-from DIR --format json
The estimated parallel wall of N pods is the slowest shard plus the merge (the critical path; the table gives it as a
fraction of the single process: issue 47's goal is 0.4x at 4 shards). Measured per process in CPU seconds
(a 1-CPU pod's wall time: on a shared machine a process's wall time measures the other load as much as the
process) and in wall seconds; the layouts interleaved within every round, their order rotating
(harness.interleaved), min and median over --rounds. Each merged report is compared with the single one, every
field but the timings.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_fd_shards.py --model chain_256 --rounds 5
    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_fd_shards.py --model resnet [--widths 16,32,64,128] \
        [--size 32] [--fd MODE] [--shards 1,2,4] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, machine, median  # noqa: E402


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNet18(nn.Module):
    def __init__(self, widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [Basic(cin, w, 1 if i == 0 else 2), Basic(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def export(path: Path, widths, size: int) -> int:
    torch.manual_seed(0)
    model = ResNet18(widths)
    for m in model.modules():  # trained-like BatchNorm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    model = model.eval().double()
    torch.onnx.export(model, (torch.rand(1, 3, size, size, dtype=torch.float64),), str(path), dynamo=False)
    return sum(p.numel() for p in model.parameters())


def _children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


# the children's compiled bytecode, kept across runs as an installed image keeps it (a shell with
# PYTHONDONTWRITEBYTECODE=1 would otherwise charge every process the compilation of every module: 0.6 s)
PYCACHE = Path(tempfile.gettempdir()) / "gradcheck-bench-pycache"


def run(args, env_index=None) -> tuple[float, float, subprocess.CompletedProcess]:
    """(CPU seconds, wall seconds, the result) of one verify process with one BLAS thread, as a 1-CPU pod runs it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPYCACHEPREFIX=str(PYCACHE))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if env_index is not None:
        env["JOB_COMPLETION_INDEX"] = str(env_index)
    t0, w0 = _children_cpu(), time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gradcheck_svc.cli", "verify", *args], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    seconds, wall = _children_cpu() - t0, time.perf_counter() - w0
    if r.returncode not in (0, 1):
        sys.exit(f"verify {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return seconds, wall, r


def without_timings(report: dict) -> dict:
    report = dict(report)
    report.pop("timings")
    if isinstance(report.get("symbolic"), dict):
        report["symbolic"] = {k: v for k, v in report["symbolic"].items() if k != "seconds"}
    return report


def layouts(model: str, opts: list, counts: list, tmp: Path, single: dict, results: dict) -> dict:
    """name -> a function running that layout once, appending (critical path CPU s, wall s, shards' CPU s,
    merge CPU s, report equal) to results[name]."""
    def one():
        cpu, wall, r = run([model, *opts, "--format", "json"])
        single.setdefault("report", json.loads(r.stdout))
        results["single"].append((cpu, wall, [cpu], 0.0, True))

    def split(count):
        def go():
            out = tmp / f"fd-{count}"
            shutil.rmtree(out, ignore_errors=True)
            shards = []
            for i in range(count):
                # pods started together each decode the graph (none finds it kept yet): so does every shard here;
                # the merge reads the one the last shard kept (verify/fd_graph.py)
                for kept in out.glob("fd-graph-*"):
                    kept.unlink()
                shards.append(run([model, *opts, "--fd-shard-count", str(count), "--fd-out", str(out)], i))
            cpu_m, wall_m, r = run([model, *opts, "--fd-from", str(out), "--format", "json"])
            equal = "report" in single and without_timings(json.loads(r.stdout)) == without_timings(single["report"])
            results[f"{count} shards"].append((max(c for c, _, _ in shards) + cpu_m, max(w for _, w, _ in shards) + wall_m,
                                               [c for c, _, _ in shards], cpu_m, equal))
        return go
    def idle():  # a shard with nothing to evaluate (index 999 of 1000): the fixed cost every process pays
        shutil.rmtree(tmp / "idle", ignore_errors=True)  # its graph decoded, as a pod's first try decodes it
        cpu, wall, _ = run([model, *opts, "--fd-shard-count", "1000", "--fd-out", str(tmp / "idle")], 999)
        results["idle shard"].append((cpu, wall, [cpu], 0.0, True))
    cases = {"single": one, "idle shard": idle}
    for c in counts:
        cases[f"{c} shards"] = split(c)
    for name in cases:
        results[name] = []
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("chain_256", "resnet"), default="resnet")
    ap.add_argument("--widths", default="16,32,64,128")
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fd", default=None, help="verify's --fd for every run (default: its own, auto)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run (chain_256, 1 and 2 shards, 1 round): bench/run_all.py --quick")
    a = ap.parse_args()
    if a.quick:
        a.model, a.shards, a.rounds = "chain_256", "1,2", 1
    # the model's bytes and its values are over the service's default limits at full width: raised, as the
    # error messages say
    # and the single process's time limit is a split's (3600 s): on a loaded machine 64x64 runs past the 120 s default
    opts = ["--max-message-bytes", "1000000000", "--max-elements", "100000000", "--max-request-seconds", "3600",
            *([] if a.fd is None else ["--fd", a.fd])]
    counts = [int(c) for c in a.shards.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if a.model == "chain_256":
            model, what = str(ROOT / "examples" / "graphs" / "chain_256.json"), "chain_256"
        else:
            widths = tuple(int(w) for w in a.widths.split(","))
            model = str(tmp / "resnet18.onnx")
            n = export(Path(model), widths, a.size)
            what = f"ResNet-18 layout, widths {widths}, input 1x3x{a.size}x{a.size}, {n:,} weights"
        single, results = {}, {}
        cases = layouts(model, opts, counts, tmp, single, results)
        cases["single"]()  # the reference report first (and a warm page cache), not timed
        results["single"].clear()
        interleaved(cases, a.rounds, warmup=0)
        report = single["report"]
        by = {}
        for p in report["parameters"]:
            by[p["fd_checked_by"]] = by.get(p["fd_checked_by"], 0) + 1
        print(f"machine: {machine()}; each verify process with one BLAS thread")
        print(f"{what} (--fd {a.fd or 'auto'}): {len(report['parameters'])} tensors (checked by: {by}); "
              f"verdict {report['verdict']}; single process's FD phase {report['timings']['finite_differences_s']:.2f} s "
              f"of {report['timings']['total_s']:.2f} s in-process; {a.rounds} rounds")
        print()
        base = median([r[0] for r in results["single"]])
        print("| layout | slowest shard + merge, CPU s (min / median) | the same, wall s (min / median) "
              "| slowest shard (median, CPU s) | merge (median, CPU s) | that / single (medians, CPU) | report equal |")
        print("|---|---|---|---|---|---|---|")
        fixed = median([r[0] for r in results["idle shard"]])
        for name, rows in results.items():
            if name == "idle shard":
                continue
            crit, wall = [r[0] for r in rows], [r[1] for r in rows]
            slow, merge = median([max(r[2]) for r in rows]), median([r[3] for r in rows])
            equal = "—" if name == "single" else ("yes" if all(r[4] for r in rows) else "NO")
            print(f"| {name} | {min(crit):.2f} / {median(crit):.2f} | {min(wall):.2f} / {median(wall):.2f} | "
                  f"{slow:.2f} ({slow - fixed:+.2f}) | {merge:.2f} | {median(crit) / base:.2f}x | {equal} |")
        idle = [r[0] for r in results["idle shard"]]
        print(f"\nA shard with nothing to evaluate (index 999 of 1000: start-up, import, engine, FD plan), CPU s: "
              f"{min(idle):.2f} / {median(idle):.2f} (min / median); in parentheses, each slowest shard's median "
              "less that: its share of the finite differences.")


if __name__ == "__main__":
    main()
