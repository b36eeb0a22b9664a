"""A GPT-2-like and a LLaMA-like block in plain torch (no transformers package): what the two exporters
make of today's decoder idioms -- learned position embeddings of an arange, a causal mask of
finfo.min (GPT-2) or -inf (LLaMA's triu, and scaled_dot_product_attention(is_causal=True)), rotary
embeddings (cos/sin of positions times a buffer of inverse frequencies), RMSNorm, SwiGLU, tied
input and output embeddings."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class GPT2Block(nn.Module):
    def __init__(self, vocab=11, n_pos=8, d=8, heads=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_pos, d)
        self.ln_1, self.ln_2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = heads

    def _heads(self, z, b, t):
        return z.view(b, t, self.h, -1).transpose(1, 2)

    def forward(self, ids):
        b, t = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(t, dtype=torch.long).unsqueeze(0))
        q, k, v = (self._heads(z, b, t) for z in self.c_attn(self.ln_1(x)).split(x.shape[-1], dim=2))
        att = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        att = att.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), torch.finfo(att.dtype).min)
        x = x + self.c_proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))
        x = x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))
        return self.ln_f(x) @ self.wte.weight.T  # tied output embedding


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, vocab=11, d=8, heads=2, sdpa=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(d, 16, bias=False), nn.Linear(d, 16, bias=False), \
            nn.Linear(16, d, bias=False)
        hd = d // heads
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, hd, 2).double() / hd)), persistent=False)
        self.h, self.sdpa = heads, sdpa

    def forward(self, ids):
        b, t = ids.shape
        x = self.embed(ids)
        h = self.norm1(x)
        q, k, v = (z.view(b, t, self.h, -1).transpose(1, 2) for z in (self.q(h), self.k(h), self.v(h)))
        freqs = torch.outer(torch.arange(t, dtype=x.dtype), self.inv_freq.to(x.dtype))
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            y = (att + torch.triu(torch.full((t, t), float("-inf"), dtype=x.dtype), 1)).softmax(-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(F.silu(self.gate(self.norm2(x))) * self.up(self.norm2(x)))


BLOCKS = {"gpt2": GPT2Block, "llama": LlamaBlock, "llama_eager": lambda: LlamaBlock(sdpa=False)}


def block(name: str):
    torch.manual_seed(0)
    return BLOCKS[name]().double().eval(), torch.tensor([[1, 5, 3, 7], [2, 2, 9, 0]])
