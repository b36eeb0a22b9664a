"""gradcheck_client.torch on the models people write (issue 42, item 4): scaled-dot-product attention on every
CPU backend (masks, causal, dropout 0), nn.MultiheadAttention, nn.LSTM/nn.GRU, in-place writes through views,
a causal -inf mask buffer -- each replayed and PASS on torch's own gradients, each with a planted twin that
fails (a hook scaling one gradient), so the pass is not vacuous; an op random in the run refused by name."""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")  # torch is an optional extra of the client (installed in the test venv)
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from gradcheck_client.torch import check  # noqa: E402
from gradcheck_core.trace_errors import TracerError  # noqa: E402


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _scaled(t, factor):
    """t with its gradient multiplied by factor (a planted backward bug: the values are unchanged)."""
    t.register_hook(lambda g: g * factor)
    return t


class Block(nn.Module):
    """A pre-norm transformer block: causal SDPA over two heads, an MLP."""

    def __init__(self, d=8, heads=2, bug=1.0):
        super().__init__()
        self.heads, self.bug = heads, bug
        self.ln, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln(x)).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.bug != 1.0:
            y = _scaled(y, self.bug)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(x)


class GPT(nn.Module):
    """Attention written by hand with a causal mask buffer of -inf above the diagonal (a constant)."""

    def __init__(self, d=8, t=4):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.register_buffer("mask", torch.triu(torch.full((t, t), float("-inf")), 1))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + self.mask, dim=-1)
        return self.out(att @ v)


class Seq2Seq(nn.Module):
    """An LSTM encoder whose final state starts an LSTM decoder, and a GRU beside it; it returns its output and the
    encoder's state, nested as nn.LSTM returns (output, (h, c))."""

    def __init__(self, n=3, h=4):
        super().__init__()
        self.enc, self.dec = nn.LSTM(n, h, batch_first=True), nn.LSTM(n, h, batch_first=True)
        self.gru, self.head = nn.GRU(n, h, batch_first=True), nn.Linear(2 * h, 2)

    def forward(self, src, tgt):
        _, state = self.enc(src)
        y, _ = self.dec(tgt, state)
        z, _ = self.gru(tgt)
        return self.head(torch.cat([y, z], dim=-1)), state


class SelfAttention(nn.Module):
    def __init__(self, need_weights: bool):
        super().__init__()
        self.att, self.need_weights = nn.MultiheadAttention(8, 2, batch_first=True), need_weights

    def forward(self, x):
        return self.att(x, x, x, need_weights=self.need_weights)[0]


def _model(cls, *args, **kw):
    torch.manual_seed(0)
    return cls(*args, **kw).eval()


def test_transformer_block_with_sdpa_passes_and_its_planted_twin_fails():
    x = torch.randn(1, 4, 8, generator=_gen(1))
    report = check(_model(Block), x)
    assert report.verdict == "pass", report.text
    assert report.data["opaque"] == []  # attention replayed as the registry's ops, not cut out
    twin = check(_model(Block, bug=1.5), x)
    assert twin.verdict == "fail", twin.text


def test_gpt_with_a_causal_minus_inf_buffer_passes_without_allow_nonfinite():
    x = torch.randn(1, 4, 8, generator=_gen(2))
    report = check(_model(GPT), x)
    assert report.verdict == "pass", report.text
    assert {"qkv.weight", "qkv.bias", "out.weight", "out.bias", "x"} <= set(report.data["check"]["parameters"])


def test_a_checked_tensor_holding_inf_is_still_refused_beside_a_minus_inf_mask():
    from gradcheck_svc.errors import GraphError

    mask = torch.triu(torch.full((3, 3), float("-inf")), 1).double()
    w = torch.tensor([1.0, float("inf"), 2.0], dtype=torch.float64)
    with pytest.raises(GraphError, match=r"input 'w': data holds 1 NaN/Inf value\(s\), first inf at index \[1\]"):
        check(lambda x, w: torch.softmax(x + mask, -1).sum() * w.sum(), torch.randn(3, 3, dtype=torch.float64), w)


def test_lstm_seq2seq_passes():
    src, tgt = torch.randn(1, 3, 3, generator=_gen(3)), torch.randn(1, 2, 3, generator=_gen(4))
    report = check(_model(Seq2Seq), src, tgt)
    assert report.verdict == "pass", report.text
    assert report.data["opaque"] == []


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_passes(need_weights):
    report = check(_model(SelfAttention, need_weights), torch.randn(1, 3, 8, generator=_gen(5)))
    assert report.verdict == "pass", report.text


MASKS = {"none": {}, "causal": {"is_causal": True},
         "bool": {"attn_mask": torch.tensor([[True, False, True], [True, True, False], [False, True, True]])},
         "float": {"attn_mask": torch.tensor([[0.0, -1.0, 0.5], [0.2, 0.0, -0.3], [0.1, 0.4, 0.0]])}}


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
@pytest.mark.parametrize("mask", list(MASKS))
def test_sdpa_every_cpu_backend_and_mask(backend, mask):
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=_gen(10 + i)) for i in range(3))

    def attend(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, **MASKS[mask])
    report = check(attend, q, k, v)
    assert report.verdict == "pass", report.text
    assert report.data["opaque"] == []
    twin = check(lambda q, k, v: _scaled(attend(q, k, v), 1.25), q, k, v)
    assert twin.verdict == "fail", twin.text


def test_inplace_writes_through_views_torch_allows_pass():
    def f(x):
        y = x * 1.0
        y[:, 0].mul_(2.0)  # a write into a view changes its base
        row = y[1]  # a view of the base, read after the base is written
        y.add_(torch.sin(x))
        return (row * y).sum() + y[0].exp().sum()
    report = check(f, torch.randn(2, 3, dtype=torch.float64, generator=_gen(20)))
    assert report.verdict == "pass", report.text


@pytest.mark.parametrize("bug", [1.0, 1.5])
def test_slice_assignment_into_a_constant_and_masked_fill_replay(bug):
    def f(x):
        out = torch.zeros(2, 4, dtype=torch.float64)
        out[:, 1:] = torch.sin(x)  # copy_ of traced values into a view of a constant
        out[:, 0] = x[:, 0] * 2
        out.masked_fill_(out > 0.5, 0.25)
        if bug != 1.0:
            out.register_hook(lambda g: g * bug)
        return (out ** 2).sum() + out.prod()
    report = check(f, torch.randn(2, 3, dtype=torch.float64, generator=_gen(21)))
    assert report.verdict == ("pass" if bug == 1.0 else "fail"), report.text


def test_an_op_random_in_the_run_is_refused_naming_op_module_and_line():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    with pytest.raises(TracerError) as info:
        check(model, torch.randn(2, 4, generator=_gen(30)))
    assert re.search(r"torch op aten::(native_dropout|bernoulli_)\S* is random \(at module 1 \(Dropout\), .*\.py:\d+\)",
                     str(info.value)), str(info.value)
    assert check(model.eval(), torch.randn(2, 4, generator=_gen(30))).verdict == "pass"  # eval: no randomness
