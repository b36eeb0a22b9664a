"""The ONNX ops composed at import from registry ops (onnx_import/convert_composed.py), exported from
torch: the engine's gradient of sum(y * c) w.r.t. the input equals torch autograd's. One tiny model per
op, all exported once per module (ONNX's own node tests check their forward values and attributes)."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from onnx_helpers import onnx  # noqa: F401  (skips the module without the extra)

from gradcheck_svc.graph import load_graph
from gradcheck_svc.onnx_import import import_onnx
from gradcheck_svc.onnx_import.importer import ImportOptions
from gradcheck_svc.verify import VerifyOptions
from gradcheck_svc.verify.run import run_engine

torch = pytest.importorskip("torch")

MODELS = {  # the ONNX op under test -> (a function of x using it, x's shape)
    "CumSum": (lambda x: torch.cumsum(x, dim=1) * x, (2, 3, 2)),
    "ReduceL2": (lambda x: torch.nn.functional.normalize(x, dim=1), (2, 3, 2)),
    "ReduceLogSumExp": (lambda x: torch.logsumexp(x, dim=(0, 2), keepdim=True) * x, (2, 3, 2)),
    "ReduceProd": (lambda x: torch.prod(x, dim=1), (2, 3, 2)),
}


class Wrap(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


@pytest.mark.parametrize("name", MODELS)
def test_engine_gradients_equal_torch_autograd(name):
    f, shape = MODELS[name]
    x = torch.rand(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) + 0.5
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(Wrap(f), (x,), buf, dynamo=False, opset_version=18, input_names=["x"], output_names=["y"])
    assert name in {n.op_type for n in onnx.load_from_string(buf.getvalue()).graph.node}
    cotangent = np.random.default_rng(7).standard_normal(tuple(f(x).shape))
    msg = import_onnx(buf.getvalue(), ImportOptions(params="inputs", inputs={"x": x.numpy()}, loss="cotangent",
                                                    cotangent=cotangent))
    engine = run_engine(load_graph(msg), VerifyOptions(dtype="float64"), "float64")
    xt = x.clone().requires_grad_()
    (f(xt) * torch.from_numpy(cotangent)).sum().backward()
    np.testing.assert_allclose(engine.gradients["x"], xt.grad.numpy(), rtol=1e-9, atol=1e-12)
