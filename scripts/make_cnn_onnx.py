"""Writes examples/onnx/cnn.onnx: a tiny CNN (conv, relu, pool, linear; ~300 parameters) that docs/service.md's
ONNX snippet sends to a server. Seeded and exported with the TorchScript exporter so the file is reproducible;
committed so the docs' snippet runs without torch. Run: python scripts/make_cnn_onnx.py"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "examples" / "onnx" / "cnn.onnx"


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


def main() -> None:
    torch.manual_seed(0)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(TinyCNN().eval(), (torch.randn(2, 1, 8, 8),), str(OUT), dynamo=False,
                      input_names=["image"], output_names=["logits"])
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
