"""Models whose parameters an exporter ties, transposes or folds (tests/onnx/test_onnx_every_parameter.py): a GPT
with its output head tied to the input embedding, a Swin-style window attention calling F.linear on a
rank-4 input with a relative position bias table, a DETR-style query embedding repeated over the batch; and
the ops of issue 45: a top-2 MoE gating by scatter, CLIP's argmax pooling, nn.EmbeddingBag with offsets; and
recurrent encoders whose weights both exporters stack into an ONNX LSTM's / GRU's W, R, B with the gates reordered.
Tiny, random weights, float64."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class TiedGPT(nn.Module):
    """Embedding plus a learned position embedding, a residual block, the output head tied to the embedding."""

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
    """Window attention as Swin writes it: F.linear on (B, windows, N, C), a relative position bias table."""

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
        qkv = F.linear(x, self.qkv.weight, self.qkv.bias).reshape(b, w, n, 3, self.h, c // self.h)
        qkv = qkv.permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = q @ k.transpose(-1, -2) / math.sqrt(c // self.h)
        bias = self.table[self.index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)
        att = (att + bias).softmax(-1)
        y = (att @ v).transpose(2, 3).reshape(b, w, n, c)
        return F.linear(y, self.proj.weight, self.proj.bias)


class DETRQueries(nn.Module):
    """DETR's object queries: an embedding's weight repeated over the batch, attending to the memory."""

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




class ScatterMoE(nn.Module):
    """Top-2 routing written with scatter: the gate's kept probabilities scattered into zeros at topk's
    indices (`zeros_like(p).scatter(-1, topi, topv)`), renormalized, mixing every expert's output."""

    def __init__(self, d=4, experts=4):
        super().__init__()
        self.router, self.experts = nn.Linear(d, experts), nn.Linear(d, experts * d)
        self.d, self.n = d, experts

    def forward(self, x):  # (T, d)
        p = torch.softmax(self.router(x), -1)
        topv, topi = p.topk(2, dim=-1)
        gates = torch.zeros_like(p).scatter(-1, topi, topv)
        gates = gates / gates.sum(-1, keepdim=True)
        outs = self.experts(x).reshape(x.shape[0], self.n, self.d)
        return (gates.unsqueeze(-1) * outs).sum(1)


class ArgmaxPool(nn.Module):
    """CLIP's text pooling: the hidden state at each sequence's end token (the largest id: argmax)."""

    def __init__(self, vocab=7, d=4):
        super().__init__()
        self.emb, self.proj = nn.Embedding(vocab, d), nn.Linear(d, 3, bias=False)

    def forward(self, ids):
        h = torch.tanh(self.emb(ids))
        pooled = h[torch.arange(h.shape[0]), ids.argmax(dim=-1)]
        return self.proj(pooled)


class GridSampler(nn.Module):
    """A spatial transformer's sampling: an affine grid from a learned theta, F.grid_sample of the input."""

    def __init__(self, mode="bilinear", padding_mode="zeros", align_corners=False):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 0.8, 0.1]]]))
        self.conv = nn.Conv2d(1, 2, 1)
        self.kw = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}

    def forward(self, x):
        grid = F.affine_grid(self.theta.expand(x.shape[0], -1, -1), list(x.shape), align_corners=False)
        return F.grid_sample(self.conv(x), grid * 1.2, **self.kw)


class Bag(nn.Module):
    """nn.EmbeddingBag (mean) with offsets, then a Linear."""

    def __init__(self, vocab=7, d=4):
        super().__init__()
        self.bag, self.fc = nn.EmbeddingBag(vocab, d, mode="mean"), nn.Linear(d, 2)

    def forward(self, ids, offsets):
        return self.fc(self.bag(ids, offsets))


class Seq2Seq(nn.Module):
    """A seq2seq-style encoder: an embedding, a recurrent layer (nn.LSTM or nn.GRU, batch first), a Linear head
    over every step's output."""

    def __init__(self, cls=nn.LSTM, vocab=5, d=2, h=2, **kw):
        super().__init__()
        self.emb, self.rnn = nn.Embedding(vocab, d), cls(d, h, batch_first=True, **kw)
        self.head = nn.Linear(h * (2 if kw.get("bidirectional") else 1), vocab)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])


def scatter_moe():
    return seeded(ScatterMoE, lambda: torch.randn(5, 4, dtype=torch.float64))


def argmax_pool():
    return seeded(ArgmaxPool, lambda: torch.tensor([[1, 5, 3, 6], [2, 6, 0, 4]]))


def grid_sample():
    return seeded(GridSampler, lambda: torch.randn(2, 1, 4, 5, dtype=torch.float64))


def embedding_bag():  # three bags of 3, 2 and 2 ids: the input is (ids, offsets)
    return seeded(Bag, lambda: (torch.tensor([1, 2, 4, 5, 4, 3, 2]), torch.tensor([0, 3, 5])))


def lstm_seq2seq():  # two layers, both directions: weight_ih_l1_reverse and the like
    return seeded(lambda: Seq2Seq(nn.LSTM, num_layers=2, bidirectional=True),
                  lambda: torch.tensor([[1, 4, 3], [2, 0, 4]]))


def gru_seq2seq():
    return seeded(lambda: Seq2Seq(nn.GRU), lambda: torch.tensor([[1, 4, 3], [2, 0, 4]]))


MODELS = {"gpt": gpt, "swin": swin, "detr": detr, "scatter_moe": scatter_moe, "argmax_pool": argmax_pool,
          "embedding_bag": embedding_bag, "lstm_seq2seq": lstm_seq2seq, "gru_seq2seq": gru_seq2seq}
