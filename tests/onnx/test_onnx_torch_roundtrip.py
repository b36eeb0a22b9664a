"""Round trip from PyTorch: a small CNN and a small MLP exported with
torch.onnx.export (the TorchScript exporter, dynamo=False: offline, no
onnxscript), imported, verified by gradcheck, and the engine's gradients
compared with PyTorch's autograd on the same weights and input."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

from onnx_helpers import onnx  # noqa: F401  (skips the module without the extra)

from gradcheck_svc.graph import load_graph
from gradcheck_svc.onnx_import import import_onnx
from gradcheck_svc.onnx_import.importer import ImportOptions
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.run import run_engine

torch = pytest.importorskip("torch")
nn = torch.nn


def small_cnn():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6),  # depthwise, strided
        nn.Conv2d(6, 4, 1), nn.PReLU(4), nn.AvgPool2d(2, count_include_pad=False),
        nn.Dropout(0.3), nn.Flatten(), nn.Linear(4, 5), nn.Softmax(dim=1))
    with torch.no_grad():  # non-trivial running statistics
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].running_var.uniform_(0.5, 2.0)
    return m.eval(), torch.rand(1, 3, 8, 8)


def small_mlp():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(7, 16), nn.Tanh(), nn.Linear(16, 8), nn.Sigmoid(), nn.Linear(8, 3),
                      nn.LogSoftmax(dim=-1))
    return m.eval(), torch.randn(4, 7)


def instance_norm():
    """InstanceNormalization (style transfer's normalization), composed from registry ops on import."""
    torch.manual_seed(2)
    # no bias before the norm: it subtracts every per-channel constant (a zero gradient, float32 noise in torch)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.InstanceNorm2d(4, affine=True), nn.ReLU(),
                      nn.Conv2d(4, 2, 1))
    with torch.no_grad():
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-0.5, 0.5)
    return m.eval(), torch.rand(2, 3, 6, 6)


def decoder():
    """Transposed convolutions (a decoder's upsampling): strided, output_padding, grouped, dilated."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1), nn.Tanh(),
                      nn.ConvTranspose2d(6, 4, 2, groups=2, dilation=2), nn.ReLU(),
                      nn.Conv2d(4, 2, 3))
    return m.eval(), torch.rand(2, 4, 3, 3)


def export(model, x) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (x,), f, dynamo=False, do_constant_folding=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    return f.getvalue()


@pytest.mark.parametrize("build", [small_cnn, small_mlp, instance_norm, decoder],
                         ids=["cnn", "mlp", "instance_norm", "decoder"])
def test_engine_gradients_equal_torch_autograd(build):
    model, x = build()
    cotangent = np.random.default_rng(7).standard_normal(tuple(model(x).shape))
    msg = import_onnx(export(model, x), ImportOptions(
        params="initializers", inputs={"x": x.numpy()}, loss="cotangent", cotangent=cotangent))
    graph = load_graph(msg)
    # torch's side: the same loss, sum(y * c), on the same weights
    model.zero_grad()
    (model(x) * torch.from_numpy(cotangent).float()).sum().backward()
    expected = {name: p.grad.double().numpy() for name, p in model.named_parameters()}
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    # every torch parameter is an initializer, hence a gradcheck parameter (BatchNorm's running
    # statistics are initializers too: their gradients are checked by test_imported_models_verify)
    assert set(expected) <= set(graph.parameters), (graph.parameters, list(expected))
    for name, want in expected.items():
        got = engine.gradients[name]
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6, err_msg=name)  # torch ran in float32


@pytest.mark.parametrize("build", [small_cnn, small_mlp, instance_norm, decoder],
                         ids=["cnn", "mlp", "instance_norm", "decoder"])
def test_imported_models_verify(build):
    model, x = build()
    msg = import_onnx(export(model, x), ImportOptions(params="initializers,inputs", loss="cotangent"))
    report = verify(load_graph(msg), VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    assert {p.name for p in report.parameters} >= {"x"} | {n for n, _ in model.named_parameters()}
