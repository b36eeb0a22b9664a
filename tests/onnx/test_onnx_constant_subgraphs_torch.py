"""Float work on constants that ends in integers or in a node only folding computes is folded at import
time, so the integer Cast or ScatterND after it sees a constant: T5's relative-position buckets (float
logs of integer distances, cast back to integers; the legacy exporter writes them out as nodes) and
Swin's shifted-window mask (slice assignments into a zero image, ScatterND with the dynamo exporter).
Tiny versions of both, from plain torch.nn, through both exporters: the loss and every parameter's
gradient equal torch autograd's and the verification says PASS. Also: GatherElements on integer
constants is folded by our own code (ONNX's reference evaluator fails beyond 63 choices)."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
from torch import nn  # noqa: E402

from gradcheck_svc.errors import GraphError  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.ir import FOLDED_CONSTANTS  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.run import run_engine  # noqa: E402
from torch_export import export_onnx  # noqa: E402


def t5_bucket(relative_position, num_buckets=8, max_distance=16):
    """transformers' T5Attention._relative_position_bucket, bidirectional."""
    num_buckets //= 2
    buckets = (relative_position > 0).to(torch.long) * num_buckets
    relative_position = torch.abs(relative_position)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, large)


class T5Attention(nn.Module):
    """One head of T5's self-attention with its learned relative-position bias."""

    def __init__(self, d=4):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.relative_attention_bias = nn.Embedding(8, 1)

    def forward(self, x):
        t = x.shape[1]
        rel = torch.arange(t)[None, :] - torch.arange(t)[:, None]
        bias = self.relative_attention_bias(t5_bucket(rel))[..., 0]  # (t, t)
        scores = self.q(x) @ self.k(x).transpose(1, 2) + bias
        return torch.softmax(scores, -1) @ self.v(x)


class SwinShiftedWindow(nn.Module):
    """Swin's shifted-window attention mask (built in forward from slice assignments) over a 4x4 map with
    2x2 windows and shift 1, added to one head's scores inside each window."""

    def __init__(self, d=3, size=4, window=2, shift=1):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.size, self.window, self.shift = size, window, shift

    def _windows(self, x):  # (1, H, W, C) -> (windows, window*window, C)
        s, w = self.size, self.window
        c = x.shape[-1]
        return x.view(1, s // w, w, s // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)

    def forward(self, x):  # x: (1, H, W, C)
        s, w, sh = self.size, self.window, self.shift
        img = torch.zeros((1, s, s, 1), dtype=x.dtype)
        cnt = 0
        for hs in (slice(0, -w), slice(-w, -sh), slice(-sh, None)):
            for ws in (slice(0, -w), slice(-w, -sh), slice(-sh, None)):
                img[:, hs, ws, :] = cnt
                cnt += 1
        m = self._windows(img)[..., 0]
        mask = m.unsqueeze(1) - m.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        q, k, v = self._windows(torch.roll(x, (-sh, -sh), (1, 2))) .matmul(self.qkv.weight.T).add(self.qkv.bias) \
            .chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(1, 2) + mask, -1)
        return att @ v


def _seeded(model):
    torch.manual_seed(0)
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


MODELS = {"t5_attention": (lambda: _seeded(T5Attention()), (2, 12, 4)),
          "swin_window": (lambda: _seeded(SwinShiftedWindow()), (1, 4, 4, 3))}
CASES = [(m, e) for m in MODELS for e in ("legacy", "dynamo", "dynamo-unoptimized")]


@pytest.mark.parametrize(("name", "exporter"), CASES, ids=[f"{m}-{e}" for m, e in CASES])
def test_constant_subgraphs_fold_and_gradients_equal_torch(name, exporter):
    import onnx

    build, shape = MODELS[name]
    model = build()
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=torch.float64)
    blob = export_onnx(model, (x,), exporter, key=(__name__, name))  # seeded: one dynamo export for both
    m = onnx.load_from_string(blob)
    inits = {t.name for t in m.graph.initializer}
    (xname,) = [vi.name for vi in m.graph.input if vi.name not in inits]
    c = np.random.default_rng(1).standard_normal(tuple(model(x).shape))
    graph = load_graph(import_onnx(blob, ImportOptions(params=f"weights,{xname}", inputs={xname: x.numpy()},
                                                       loss="cotangent", cotangent=c)))
    # T5's bias table and Swin's shifted-window mask (masked_fill with -100: two values) are folded constants of
    # the model, not of a parameter still read: no folded-expression warning
    assert not [n for n in graph.notes if n.startswith(FOLDED_CONSTANTS)], graph.notes
    xt = x.clone().requires_grad_(True)
    loss = (model(xt) * torch.from_numpy(c)).sum()
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [xt] + list(params.values()))
    want = {xname: grads[0].numpy()} | {n: g.numpy() for n, g in zip(params, grads[1:])}
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    assert engine.loss == pytest.approx(float(loss.detach()), rel=1e-10)
    values = {n: p.detach().numpy() for n, p in params.items()} | {xname: x.numpy()}
    compared = [n for n in want if n in graph.inputs and np.array_equal(graph.inputs[n].value, values[n])]
    assert xname in compared
    scale = max(np.abs(g).max() for g in want.values())
    for n in compared:
        np.testing.assert_allclose(engine.gradients[n], want[n], rtol=1e-10, atol=1e-12 * scale, err_msg=n)
    assert verify(graph, VerifyOptions()).verdict == "pass"


def _gather_model(data, indices, axis):
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("GatherElements", ["d", "i"], ["g"], axis=axis)
    cast = helper.make_node("Cast", ["g"], ["gf"], to=TensorProto.DOUBLE)
    mul = helper.make_node("Mul", ["gf", "w"], ["y"])
    graph = helper.make_graph([node, cast, mul], "gather", [helper.make_tensor_value_info("w", TensorProto.DOUBLE,
                                                                                          list(indices.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, list(indices.shape))],
                              initializer=[numpy_helper.from_array(data, "d"), numpy_helper.from_array(indices, "i")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_integer_gather_elements_on_constants_is_folded_by_our_code():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 1000, size=(3, 512)).astype(np.int64)
    indices = rng.integers(-512, 512, size=(3, 7)).astype(np.int64)
    graph = load_graph(import_onnx(_gather_model(data, indices, 1), ImportOptions(params="w")))
    folded = next(v.value for n, v in graph.inputs.items() if n not in ("w",) and np.shape(v.value) == (3, 7))
    want = np.array([[data[r, i] for i in row] for r, row in enumerate(indices)])  # ONNX's definition, by hand
    np.testing.assert_array_equal(folded, want)


def test_integer_gather_elements_out_of_range_is_one_line():
    data = np.arange(100, dtype=np.int64).reshape(1, 100)
    with pytest.raises(GraphError, match=r"GatherElements node .*out of range \[-100, 99\]") as err:
        import_onnx(_gather_model(data, np.array([[3, 100]], dtype=np.int64), 1), ImportOptions(params="w"))
    assert "\n" not in str(err.value)


class MaskedAttention(nn.Module):
    """GPT-2-style attention with an additive causal mask held as a buffer: float32's minimum above the
    diagonal (what the dynamo exporter folds a causal mask into), an initializer of the export."""

    def __init__(self, d=4, t=3):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.register_buffer("causal", torch.full((t, t), torch.finfo(torch.float32).min).triu(1))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(1, 2) + self.causal, -1) @ v


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_an_additive_mask_initializer_is_a_constant_by_default(exporter):
    import onnx
    from onnx import numpy_helper

    model = _seeded(MaskedAttention())
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    blob = export_onnx(model, (x,), exporter)
    masks = [t.name for t in onnx.load_from_string(blob).graph.initializer
             if numpy_helper.to_array(t).dtype.kind == "f" and np.abs(numpy_helper.to_array(t)).max() > 1e38]
    assert masks  # the export holds the mask as an initializer
    graph = load_graph(import_onnx(blob))
    assert not set(masks) & set(graph.parameters) and graph.parameters
    assert verify(graph, VerifyOptions()).verdict == "pass"
    named = load_graph(import_onnx(blob, ImportOptions(params=f"weights,{masks[0]}")))
    assert masks[0] in named.parameters  # asked for by name, it is a parameter like any other
