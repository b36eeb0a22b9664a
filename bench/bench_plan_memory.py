"""ResNet-50 (ONNX's light_resnet50.onnx) planned for three budgets with Adam (plan-memory from
shapes), one budget checked against a real checkpointed gradient run, and what PyTorch needs for
the same network built from plain torch.nn, counted with the same accounting on CPU (issue 26).

    PYTHONPATH=.:clients/python python bench/bench_plan_memory.py [--no-run] [--no-torch]

Same accounting on the torch side: activations = the distinct storages autograd saves for backward
(torch.autograd.graph.saved_tensors_hooks, parameters and the input left out), the most held at
once being at the end of the forward; gradients = the parameters' .grad; optimizer = Adam's
exp_avg and exp_avg_sq after one step -- what torch.cuda.max_memory_allocated would add up to for
these tensors on a GPU (its allocator rounding and cuDNN workspaces aside).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "engine"))  # test_memory_plan_dag

MB = 1e6
BUDGETS = (60_000_000, 40_000_000, 25_000_000)


def ours(run: bool) -> None:
    from test_memory_plan_dag import _resnet50

    from gradcheck_svc.verify.memory_plan import plan_memory

    graph = _resnet50()
    t0 = time.perf_counter()
    plain = plan_memory(graph, dtype="float32", optimizer="adam", shapes_only=True)
    print(f"gradcheck plan-memory (shapes only, {time.perf_counter() - t0:.2f} s): params "
          f"{plain['parameters_bytes'] / MB:.1f} MB, grads {plain['gradients_bytes'] / MB:.1f}, adam "
          f"{plain['optimizer_bytes'] / MB:.1f}, activations {plain['activations_peak_bytes'] / MB:.1f}, "
          f"formula {plain['formula_training_bytes'] / MB:.1f} MB")
    for budget in BUDGETS:
        t0 = time.perf_counter()
        p = plan_memory(graph, dtype="float32", optimizer="adam", budget=budget, shapes_only=True)
        print(f"  budget {budget / MB:.0f} MB: predicted activations "
              f"{p['checkpoint_predicted_activations_peak_bytes'] / MB:.2f} MB, {p['checkpoint_segments']} segments, "
              f"kept {len(p['checkpoint_kept'])}, {p['checkpoint_recomputed_steps']} of {p['steps']} steps recomputed,"
              f" formula {p['checkpoint_formula_training_bytes'] / MB:.1f} MB ({p['checkpoint_budget_method']}; "
              f"{time.perf_counter() - t0:.2f} s)")
    if run:
        from gradcheck_svc.verify import VerifyOptions
        from gradcheck_svc.verify.engine_run import run_engine

        sqrt_peak = run_engine(graph, VerifyOptions(checkpoint="sqrt"), "float32").memory[
            "checkpoint_activations_peak_bytes"]
        for policy in ("sqrt", *(f"budget:{b}" for b in BUDGETS[:2]), f"budget:{sqrt_peak}"):
            t0 = time.perf_counter()
            m = run_engine(graph, VerifyOptions(checkpoint=policy, optimizer="adam"), "float32").memory
            predicted = m.get("checkpoint_predicted_activations_peak_bytes")
            print(f"  verify --checkpoint {policy}: measured activations "
                  f"{m['checkpoint_activations_peak_bytes'] / MB:.2f} MB"
                  + (f" (predicted {predicted / MB:.2f})" if predicted else "")
                  + f", op evaluations {m['checkpoint_op_evaluations']} (plain {m['op_evaluations']}), gradients "
                  f"equal {m['checkpoint_gradients_equal']}, training {m['checkpoint_training_peak_bytes'] / MB:.1f} MB"
                  f" ({time.perf_counter() - t0:.1f} s)")


def torch_resnet50():
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

        def forward(self, x):
            h = self.relu(self.bn1(self.conv1(x)))
            h = self.relu(self.bn2(self.conv2(h)))
            h = self.bn3(self.conv3(h))
            return self.relu(h + (self.down(x) if self.down is not None else x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for k in range(blocks):
            layers.append(Bottleneck(cin, width, stride if k == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000), nn.Softmax(dim=1)]
    torch.manual_seed(0)
    return nn.Sequential(*layers)


def theirs() -> None:
    import torch

    model = torch_resnet50()
    x = torch.rand(1, 3, 224, 224)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    sizes: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            sizes[s.data_ptr()] = s.nbytes()
        return t

    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).sum()
    activations = sum(sizes.values())
    loss.backward()
    opt = torch.optim.Adam(model.parameters())
    opt.step()
    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    g_bytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    o_bytes = sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
                  if k in ("exp_avg", "exp_avg_sq"))
    print(f"torch {torch.__version__} (plain torch.nn ResNet-50, train mode, CPU, {time.perf_counter() - t0:.1f} s): "
          f"params {p_bytes / MB:.1f} MB, grads {g_bytes / MB:.1f}, adam {o_bytes / MB:.1f}, saved activations "
          f"{activations / MB:.1f} MB ({len(sizes)} storages), formula "
          f"{(x.nbytes + p_bytes + g_bytes + o_bytes + activations) / MB:.1f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true", help="skip the checkpointed gradient runs (slow)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run (plans only: --no-run --no-torch): bench/run_all.py --quick")
    args = ap.parse_args()
    if args.quick:
        args.no_run = args.no_torch = True
    ours(not args.no_run)
    if not args.no_torch:
        theirs()


if __name__ == "__main__":
    main()
