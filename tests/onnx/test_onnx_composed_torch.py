"""The ONNX ops composed at import from registry ops (onnx_import/convert_composed.py), and Asin (the
registry op arcsin under its ONNX name), each in a tiny model exported from torch: the model verifies
(PASS), and the engine's gradient of sum(y * c) w.r.t. the input equals torch autograd's. (ONNX's own
node tests, test_onnx_node_tests.py, check their forward values and attributes.)"""
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

MODELS = {  # the ONNX op under test -> (a function of x using it, x's shape)
    "CumSum": (lambda x: torch.cumsum(x, dim=1) * x, (2, 3, 2)),
    "ReduceL2": (lambda x: torch.nn.functional.normalize(x, dim=1), (2, 3, 2)),
    "ReduceLogSumExp": (lambda x: torch.logsumexp(x, dim=(0, 2), keepdim=True) * x, (2, 3, 2)),
    "ReduceProd": (lambda x: torch.prod(x, dim=1), (2, 3, 2)),
    "Asin": (lambda x: torch.asin(x - 1.0), (2, 3)),  # a registry op (arcsin): here for its ONNX name
    "Celu": (lambda x: torch.nn.functional.celu(x - 1.0, alpha=0.5), (2, 3)),
    "DepthToSpace": (lambda x: torch.nn.functional.pixel_shuffle(x, 2) * x[:, :1, :1, :1], (1, 8, 2, 1)),
}


class Wrap(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def _x(shape):
    return torch.rand(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) + 0.5


@pytest.mark.parametrize("name", MODELS)
def test_engine_gradients_equal_torch_autograd(name):
    f, shape = MODELS[name]
    x = _x(shape)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(Wrap(f), (x,), buf, dynamo=False, opset_version=18, input_names=["x"], output_names=["y"])
    assert name in {n.op_type for n in onnx.load_from_string(buf.getvalue()).graph.node}
    _assert_torch_gradient(buf.getvalue(), f, x)


def test_space_to_depth_gradient_equals_torch_autograd():
    """torch exports pixel_unshuffle as Reshape and Transpose: here a one-node SpaceToDepth (mode DCR, ONNX's
    only mode before opset 25) against the same reshape and permute in torch."""
    from onnx import TensorProto, helper

    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)
    graph = helper.make_graph([node], "s2d", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 2, 2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 8, 1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    def f(x):
        return x.reshape(1, 2, 1, 2, 2, 2).permute(0, 3, 5, 1, 2, 4).reshape(1, 8, 1, 2)
    _assert_torch_gradient(model.SerializeToString(), f, _x((1, 2, 2, 4)))


def _assert_torch_gradient(model: bytes, f, x):
    cotangent = np.random.default_rng(7).standard_normal(tuple(f(x).shape))
    msg = import_onnx(model, ImportOptions(params="inputs", inputs={"x": x.numpy()}, loss="cotangent",
                                           cotangent=cotangent))
    graph = load_graph(msg)
    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    xt = x.clone().requires_grad_()
    (f(xt) * torch.from_numpy(cotangent)).sum().backward()
    np.testing.assert_allclose(engine.gradients["x"], xt.grad.numpy(), rtol=1e-9, atol=1e-12)


def _l2_model():
    """One ReduceL2 over axis 1 of a [3, 4] input (opset 18: axes as an input)."""
    from onnx import TensorProto, helper

    node = helper.make_node("ReduceL2", ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph([node], "l2", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])],
                              initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_reduce_l2_of_an_all_zero_slice_is_a_kink_with_torchs_subgradient():
    """The norm of a zero row (a zero-initialized bias, a padded row) has no derivative; torch's
    vector_norm gives 0 there, and so does the engine: PASS, the kink a note (not the infinite derivative of
    sqrt at 0 the composition had), the symbolic reference's NaN there excused only where finite
    differences agree. A claimed gradient outside the one-sided differences there fails. (One inside them is
    taken as another subgradient, as at any kink: per element, so not held to the norm's unit ball.)"""
    from gradcheck_core.claims import claims_message, with_claims

    x = _x((3, 4)) - 0.5
    x[1] = 0.0
    _assert_torch_gradient(_l2_model(), lambda t: torch.linalg.vector_norm(t, dim=1), x)
    msg = import_onnx(_l2_model(), ImportOptions(params="inputs", inputs={"x": x.numpy()}, loss="sum"))
    report = verify(load_graph(msg), VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    assert [(f.op, f.cause, f.severity) for f in report.findings] == [("norm", "nondifferentiable_point", "warning")]
    xt = x.clone().requires_grad_()
    torch.linalg.vector_norm(xt, dim=1).sum().backward()
    wrong = xt.grad.numpy().copy()
    wrong[1, 2] = 2.0  # outside the one-sided differences there (-1 and 1)
    report = verify(load_graph(with_claims(msg, claims_message({"x": wrong}))), VerifyOptions())
    assert report.verdict == "fail", report.to_text()
    assert report.parameters[0].passed is False
