"""One model's finite differences split over processes (verify/fd_shards.py): a ResNet-18-like model on 1, 2 and 4
shards, each index run as an Indexed Job runs it (JOB_COMPLETION_INDEX), then the merge.

The model: ResNet-18's layout from plain torch.nn (torchvision is not installed): a 3x3 stem, four stages of two
basic blocks (3x3 conv, BatchNorm, ReLU, 3x3 conv, BatchNorm, the shortcut -- a strided 1x1 conv + BatchNorm where
the shape changes), global average pooling and a linear head; widths --widths (ResNet-18's are 64,128,256,512;
the default here is a quarter, so that it runs in minutes on a small machine), input 1x3xSxS, float64, random
weights; exported by torch.onnx.export (the TorchScript exporter, BatchNorm folded into the convs) and verified as
`gradcheck-svc verify MODEL.onnx` verifies it (every weight a parameter, the loss the sum of the logits).

Timed, each as its own process, one at a time, in CPU seconds with one BLAS thread (what a 1-CPU pod's wall time
would be; on a shared machine wall times measure the other load as much as these processes):
  single   gradcheck-svc verify MODEL.onnx --format json
  shard i  gradcheck-svc verify MODEL.onnx --fd-shard-count N --fd-out DIR   (JOB_COMPLETION_INDEX=i)
  merge    gradcheck-svc verify MODEL.onnx --fd-from DIR --format json
The critical path of N pods is the slowest shard plus the merge. Each merged report is compared with the
single one, every field but the timings.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_fd_shards.py [--widths 64,128,256,512] [--size 32] \
        [--fd MODE] [--shards 1,2,4]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine  # noqa: E402


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


def run(args, env_index=None) -> tuple[float, subprocess.CompletedProcess]:
    """(CPU seconds of the process, its result): one BLAS thread, as a 1-CPU pod runs it. CPU time rather than
    wall time: on a shared machine the wall time measures the other load as much as this process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if env_index is not None:
        env["JOB_COMPLETION_INDEX"] = str(env_index)
    t0 = _children_cpu()
    r = subprocess.run([sys.executable, "-m", "gradcheck_svc.cli", "verify", *args], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    seconds = _children_cpu() - t0
    if r.returncode not in (0, 1):
        sys.exit(f"verify {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return seconds, r


def without_timings(report: dict) -> dict:
    report = dict(report)
    report.pop("timings")
    if isinstance(report.get("symbolic"), dict):
        report["symbolic"] = {k: v for k, v in report["symbolic"].items() if k != "seconds"}
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="16,32,64,128")
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--fd", default=None, help="verify's --fd for every run (default: its own, auto)")
    a = ap.parse_args()
    # the model's bytes and its values are over the service's default limits at full width: raised, as the
    # error messages say
    opts = ["--max-message-bytes", "1000000000", "--max-elements", "100000000",
            *([] if a.fd is None else ["--fd", a.fd])]
    widths = tuple(int(w) for w in a.widths.split(","))
    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "resnet18.onnx"
        n = export(model, widths, a.size)
        t_single, r = run([str(model), *opts, "--format", "json"])
        single = json.loads(r.stdout)
        by = {}
        for p in single["parameters"]:
            by[p["fd_checked_by"]] = by.get(p["fd_checked_by"], 0) + 1
        print(f"ResNet-18 layout (--fd {a.fd or 'auto'}), widths {widths}, input 1x3x{a.size}x{a.size}, {n:,} weights "
              f"in {len(single['parameters'])} tensors (checked by: {by}); verdict {single['verdict']}")
        print(f"single process: {t_single:.1f} CPU s")
        print()
        print("| shards | slowest shard | all shards (sum) | merge | slowest shard + merge | single / that "
              "| report equal |")
        print("|---|---|---|---|---|---|---|")
        for count in (int(c) for c in a.shards.split(",")):
            out = Path(tmp) / f"fd-{count}"
            times = [run([str(model), *opts, "--fd-shard-count", str(count), "--fd-out", str(out)], i)[0]
                     for i in range(count)]
            t_merge, r = run([str(model), *opts, "--fd-from", str(out), "--format", "json"])
            equal = without_timings(json.loads(r.stdout)) == without_timings(single)
            path = max(times) + t_merge
            print(f"| {count} | {max(times):.1f} s | {sum(times):.1f} s | {t_merge:.1f} s | {path:.1f} s | "
                  f"{t_single / path:.2f}x | {'yes' if equal else 'NO'} |")


if __name__ == "__main__":
    main()
