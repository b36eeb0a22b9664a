"""A 2-layer BERT-style encoder, hand-built from torch.nn as transformers' BertModel is (nothing is
downloaded, transformers is not needed): word, position and token-type embeddings (position ids and
the default token types are buffers; the default token types are gathered with the position ids, as
transformers does, an integer GatherElements of 80 choices folded at import time: ONNX's reference
evaluator fails beyond 63: np.choose), an attention mask
turned into a large negative additive mask, two post-LayerNorm encoder layers of 2 heads, a tanh
pooler. Through both exporters (dynamo with and without its optimizer), with and without explicit
token types: imports, its loss and the gradient of every torch parameter the ONNX model holds under
its own name equal torch autograd's, and the verification says PASS."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
from torch import nn  # noqa: E402

from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.run import run_engine  # noqa: E402
from torch_export import export_onnx  # noqa: E402

D, HEADS, VOCAB, MAX_POS, SEQ, BATCH = 8, 2, 20, 80, 5, 2


class Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, D)
        self.position_embeddings = nn.Embedding(MAX_POS, D)
        self.token_type_embeddings = nn.Embedding(2, D)
        self.LayerNorm = nn.LayerNorm(D, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(MAX_POS).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros((1, MAX_POS), dtype=torch.long), persistent=False)

    def forward(self, input_ids, token_type_ids=None):
        b, t = input_ids.shape
        position_ids = self.position_ids[:, :t]
        if token_type_ids is None:  # transformers' BertEmbeddings: the buffer gathered at the position ids
            buffered = self.token_type_ids.expand(b, -1)
            token_type_ids = torch.gather(buffered, dim=1, index=position_ids.expand(b, -1))
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x + self.position_embeddings(position_ids))


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def _heads(self, x):
        b, t, _ = x.shape
        return x.view(b, t, HEADS, D // HEADS).transpose(1, 2)

    def forward(self, x, additive_mask):
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // HEADS) + additive_mask
        ctx = torch.softmax(scores, dim=-1) @ v
        return ctx.transpose(1, 2).reshape(x.shape)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = SelfAttention()
        self.attention_output = nn.Linear(D, D)
        self.attention_norm = nn.LayerNorm(D, eps=1e-12)
        self.intermediate = nn.Linear(D, 2 * D)
        self.output = nn.Linear(2 * D, D)
        self.output_norm = nn.LayerNorm(D, eps=1e-12)

    def forward(self, x, additive_mask):
        x = self.attention_norm(x + self.attention_output(self.attention(x, additive_mask)))
        return self.output_norm(x + self.output(nn.functional.gelu(self.intermediate(x))))


class TinyBert(nn.Module):
    def __init__(self, explicit_token_types: bool):
        super().__init__()
        self.embeddings = Embeddings()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.pooler = nn.Linear(D, D)
        self.explicit = explicit_token_types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        x = self.embeddings(input_ids, token_type_ids if self.explicit else None)
        mask = attention_mask[:, None, None, :].to(x.dtype)
        # transformers' extended attention mask, with float32's minimum (what a float32 BERT uses; the dynamo
        # exporter writes finfo(float64).min as a float32 constant, -inf, and 0 * -inf is NaN)
        additive = (1.0 - mask) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, additive)
        return torch.cat([x.reshape(x.shape[0], -1), torch.tanh(self.pooler(x[:, 0]))], dim=1)


def _model_and_inputs(explicit: bool):
    torch.manual_seed(0)
    model = TinyBert(explicit).double().eval()
    with torch.no_grad():  # trained-like: no two parameters equal (exporters merge equal initializers)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, 3:] = 0  # the second sequence is padded
    types = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    return model, (ids, mask, types) if explicit else (ids, mask)


CASES = [(e, explicit) for e in ("legacy", "dynamo", "dynamo-unoptimized") for explicit in (False, True)]


@pytest.mark.parametrize(("exporter", "explicit"), CASES,
                         ids=[f"{e}-{'token_types' if x else 'default_types'}" for e, x in CASES])
def test_bert_encoder_gradients_equal_torch(exporter, explicit):
    import onnx

    model, args = _model_and_inputs(explicit)
    blob = export_onnx(model, args, exporter, key=(__name__, explicit))  # seeded: one dynamo export for both
    m = onnx.load_from_string(blob)
    inits = {t.name for t in m.graph.initializer}
    names = [vi.name for vi in m.graph.input if vi.name not in inits]
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    y = model(*args)
    c = np.random.default_rng(1).standard_normal(tuple(y.shape))
    graph = load_graph(import_onnx(blob, ImportOptions(inputs=feeds, loss="cotangent", cotangent=c)))

    loss = (model(*args) * torch.from_numpy(c)).sum()
    params = dict(model.named_parameters())
    want = dict(zip(params, (g.numpy() for g in torch.autograd.grad(loss, list(params.values())))))
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    assert engine.loss == pytest.approx(float(loss.detach()), rel=1e-10)
    # a torch parameter the model holds under its own name, shape and value: its gradient is torch's
    compared = [n for n in want if n in graph.inputs
                and np.array_equal(graph.inputs[n].value, params[n].detach().numpy())]
    assert {"embeddings.word_embeddings.weight", "embeddings.token_type_embeddings.weight",
            "embeddings.LayerNorm.weight", "layers.1.output_norm.bias"} <= set(compared), compared
    # the key biases' gradients are 0 in exact arithmetic (softmax ignores a shift of a row): rounding
    # noise on both sides, measured against the gradients' overall scale
    scale = max(np.abs(g).max() for g in want.values())
    for n in compared:
        np.testing.assert_allclose(engine.gradients[n], want[n], rtol=1e-10, atol=1e-12 * scale,
                                   err_msg=f"{exporter}: {n}")
    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    # every torch parameter is checked under its name or one of source_names, or the report says it is not
    named = set(graph.inputs) | {s.name for i in graph.inputs.values() for s in i.source_names}
    unchecked = " ".join(w for w in report.warnings if w.startswith("not checked"))
    for n in params:
        assert n in named or n in unchecked, f"{exporter}: {n} neither checked nor reported"
        assert not (n in named and n in unchecked), f"{exporter}: {n} checked and reported unchecked"
    if exporter == "dynamo":  # the optimizer folds the position embeddings at the constant position ids
        assert "embeddings.position_embeddings.weight" in unchecked and "optimize=False" in unchecked
    if exporter == "dynamo-unoptimized":
        assert not unchecked  # optimize=False keeps every parameter
