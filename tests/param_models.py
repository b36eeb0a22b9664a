"""Models whose parameters an exporter ties, transposes or folds (tests/test_onnx_every_parameter.py): a GPT
with its output head tied to the input embedding, a Swin-style window attention calling F.linear on a
rank-4 input with a relative position bias table, a DETR-style query embedding repeated over the batch.
Tiny, random weights, float64."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

class TiedGPT(nn.Module):
    def __init__(self, vocab=7, d=4, n_pos=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(n_pos, d)
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
    def forward(self, ids):
        t = ids.shape[1]
        x = self.emb(ids) + self.pos(torch.arange(t).unsqueeze(0))
        x = x + torch.tanh(self.fc(self.ln(x)))
        return self.head(x)

class SwinAttn(nn.Module):
    def __init__(self, d=4, heads=2, win=2):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.h = heads
        self.table = nn.Parameter(torch.randn((2 * win - 1) ** 2, heads) * 0.1)
        c = torch.stack(torch.meshgrid(torch.arange(win), torch.arange(win), indexing="ij")).flatten(1)
        r = (c[:, :, None] - c[:, None, :]).permute(1, 2, 0) + (win - 1)
        self.register_buffer("index", r[..., 0] * (2 * win - 1) + r[..., 1])
    def forward(self, x):  # (B, nW, N, C)
        b, w, n, c = x.shape
        qkv = F.linear(x, self.qkv.weight, self.qkv.bias).reshape(b, w, n, 3, self.h, c // self.h).permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = q @ k.transpose(-1, -2) / math.sqrt(c // self.h)
        bias = self.table[self.index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)
        att = (att + bias).softmax(-1)
        y = (att @ v).transpose(2, 3).reshape(b, w, n, c)
        return F.linear(y, self.proj.weight, self.proj.bias)

class DETRQueries(nn.Module):
    def __init__(self, q=3, d=4):
        super().__init__()
        self.query_embed = nn.Embedding(q, d)
        self.lin = nn.Linear(d, d)
    def forward(self, mem):  # (B, S, d)
        b = mem.shape[0]
        qe = self.query_embed.weight.unsqueeze(0).repeat(b, 1, 1)
        att = torch.softmax(qe @ mem.transpose(1, 2), -1) @ mem
        return self.lin(att + qe)

def seeded(cls, make_x):
    """The model with trained-like weights (no two elements equal) in float64, and its input."""
    torch.manual_seed(0)
    m = cls()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.double().eval(), make_x()


def gpt():
    return seeded(TiedGPT, lambda: torch.tensor([[1, 5, 3, 6], [2, 2, 0, 4]]))


def swin():
    return seeded(SwinAttn, lambda: torch.randn(2, 2, 4, 4, dtype=torch.float64))


def detr():
    return seeded(DETRQueries, lambda: torch.randn(2, 5, 4, dtype=torch.float64))


MODELS = {"gpt": gpt, "swin": swin, "detr": detr}
