"""F.cross_entropy and F.nll_loss as the TorchScript exporter writes them (SoftmaxCrossEntropyLoss,
NegativeLogLikelihoodLoss: onnx_import/convert_losses.py): the loss and the gradients equal torch autograd's, for
each reduction, ignore_index, and (N, C) and (N, C, d) inputs; class weights (a buffer: a parameter under the
default --params) get torch's gradient too. ONNX's own node tests of both ops: test_onnx_node_tests.py."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch_export import export_onnx  # noqa: E402

from gradcheck.v1 import service_pb2  # noqa: E402
from gradcheck_svc.request import prepare  # noqa: E402
from gradcheck_svc.verify import VerifyOptions  # noqa: E402
from gradcheck_svc.verify.engine_run import run_engine  # noqa: E402

LOSSES = {
    "cross_entropy": lambda z, t, w: F.cross_entropy(z, t),
    "cross_entropy_sum_ignore": lambda z, t, w: F.cross_entropy(z, t, reduction="sum", ignore_index=1),
    "cross_entropy_mean_ignore": lambda z, t, w: F.cross_entropy(z, t, ignore_index=3),
    "nll_none": lambda z, t, w: F.nll_loss(F.log_softmax(z, 1), t, reduction="none"),
    "class_weights": lambda z, t, w: F.cross_entropy(z, t, weight=w),
}


class Loss(nn.Module):
    def __init__(self, kind: str, spatial: bool):
        super().__init__()
        self.fc, self.kind, self.spatial = nn.Linear(5, 4), kind, spatial
        self.register_buffer("t", torch.tensor([[0, 3, 1], [2, 1, 0]]) if spatial else torch.tensor([0, 3, 1, 2]))
        self.register_buffer("w", torch.tensor([0.5, 1.0, 2.0, 1.5], dtype=torch.float64))

    def forward(self, x):
        z = self.fc(x.reshape(-1, 5))  # (a rank-2 input: Gemm keeps fc.weight's name)
        return LOSSES[self.kind](z.reshape(2, 3, 4).transpose(1, 2) if self.spatial else z, self.t, self.w)


def _case(kind: str, spatial: bool):
    torch.manual_seed(0)
    model = Loss(kind, spatial).double()
    x = torch.randn(*((2, 3, 5) if spatial else (4, 5)), dtype=torch.float64)
    blob = export_onnx(model, (x,), "legacy")
    xname = onnx.load_from_string(blob).graph.input[0].name
    y = model(x)
    c = np.random.default_rng(1).standard_normal(tuple(y.shape))
    request = service_pb2.VerifyRequest(onnx_model=blob, onnx=service_pb2.OnnxImport(
        inputs={xname: onnx.numpy_helper.from_array(x.numpy()).SerializeToString()}, loss="cotangent",
        cotangent=onnx.numpy_helper.from_array(c).SerializeToString()))
    return model, (y * torch.from_numpy(c)).sum(), request


CASES = [(k, False) for k in LOSSES] + [("cross_entropy_mean_ignore", True), ("nll_none", True)]


@pytest.mark.parametrize(("kind", "spatial"), CASES, ids=[f"{k}-{'NCd' if s else 'NC'}" for k, s in CASES])
def test_loss_and_gradients_equal_torchs(kind, spatial):
    model, loss, request = _case(kind, spatial)
    graph, _ = prepare(request)
    assert {"fc.weight", "fc.bias"} <= set(graph.parameters)
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    assert engine.loss == pytest.approx(float(loss), rel=1e-12)
    for name, want in zip(("fc.weight", "fc.bias"), torch.autograd.grad(loss, [model.fc.weight, model.fc.bias])):
        np.testing.assert_allclose(engine.gradients[name], want.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
    assert (kind == "class_weights") == ("w" in graph.parameters)  # the weight buffer: a parameter by default


def test_class_weights_get_the_gradient_of_the_loss_s_definition():
    # torch's nll_loss is not differentiable in its weight: its definition (ONNX's too) written out is
    _, _, request = _case("class_weights", False)
    graph, _ = prepare(request)
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    torch.manual_seed(0)
    model = Loss("class_weights", False).double()
    w = model.w.clone().requires_grad_(True)
    picked = F.log_softmax(model.fc(torch.randn(4, 5, dtype=torch.float64)), 1).gather(1, model.t[:, None])[:, 0]
    c = float(np.random.default_rng(1).standard_normal(()))
    (want,) = torch.autograd.grad(-c * (w[model.t] * picked).sum() / w[model.t].sum(), [w])
    np.testing.assert_allclose(engine.gradients["w"], want.numpy(), rtol=1e-12, atol=1e-14)
