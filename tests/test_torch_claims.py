"""gradcheck_client.torch: torch's own gradients (custom autograd.Functions, hooks, modules) verified as claimed
gradients, each planted bug caught and named, each correct version passing; compared with
torch.autograd.gradcheck on the same cases."""
from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")  # torch is an optional extra of the client (installed in the test venv)

from gradcheck_client.torch import GradcheckError, check, gradcheck  # noqa: E402
from gradcheck_client.trace_errors import TracerError  # noqa: E402
from grpc_helpers import module_server  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def cube_function(grad_rule):
    """A custom autograd.Function y = x**3 whose backward is grad_rule(x, g)."""
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return grad_rule(x, g)
    return Cube


RIGHT = cube_function(lambda x, g: g * 3 * x * x)
OFF_1PC = cube_function(lambda x, g: g * 3 * x * x * 1.01)


def _one_element(x, g):
    out = g * 3 * x * x
    out[2] += 0.1
    return out


ONE_ELEMENT = cube_function(_one_element)
NEGATIVES = cube_function(lambda x, g: g * 3 * x * x.abs())  # right for x >= 0 only
X = torch.tensor([0.7, -1.3, 0.4, -0.2, 1.1], dtype=torch.float64)


def through(cls):
    return lambda x: torch.sin(cls.apply(torch.tanh(x))).sum()


def _custom(report, cls_name):
    [entry] = [c for c in report.data["custom_functions"] if c["function"] == cls_name]
    return entry


def test_a_correct_custom_function_passes():
    report = check(through(RIGHT), X)
    assert report.verdict == "pass", report.text
    assert report.data["subject"] == "claimed"
    assert _custom(report, "Cube")["verdict"] == "pass"


@pytest.mark.parametrize("cls, index", [(OFF_1PC, None), (ONE_ELEMENT, 2), (NEGATIVES, None)])
def test_a_wrong_custom_backward_is_caught_and_named_by_class_and_line(cls, index):
    report = check(through(cls), X)
    assert report.verdict == "fail"
    assert [p.status for p in report.parameters] == ["FAIL"]
    entry = _custom(report, "Cube")
    assert entry["verdict"] == "fail"
    line = inspect.getsourcelines(cls.backward)[1]
    assert entry["source"].endswith(f"test_torch_claims.py:{line}")
    assert "its backward disagrees with the derivative of its forward" in entry["detail"]
    assert f"custom autograd.Function Cube ({entry['source']})" in report.text
    if index is not None:
        assert f"(worst [{index}]: claimed" in entry["detail"]
    if cls is NEGATIVES:  # only for negative inputs: on positive ones it is right
        assert check(through(cls), X.abs()).verdict == "pass"


def test_a_wrong_backward_fails_even_where_its_gradient_is_multiplied_away():
    report = check(lambda x: (OFF_1PC.apply(x) * 0.0).sum() + x.sum(), X)
    assert [p.status for p in report.parameters] == ["ok"]  # this call's gradients do not show it
    assert report.verdict == "fail" and _custom(report, "Cube")["verdict"] == "fail"


def test_a_hook_that_scales_a_gradient_is_caught_at_the_value_it_scales():
    def hooked(x):
        h = torch.tanh(x)
        h.register_hook(lambda g: g * 2)
        return (h * h).sum()
    report = check(hooked, X)
    assert report.verdict == "fail"
    [f] = [f for f in report.findings if f.severity == "error"]
    assert f.cause == "rule_error" and "the claimed gradient reaching 'tanh_1'" in f.detail
    line = inspect.getsourcelines(hooked)[1] + 3  # (h * h): the consumer whose input adjoint the hook doubled
    assert report.data["sources"][f.node].endswith(f"test_torch_claims.py:{line}")
    assert f"node '{f.node}' was made at " in report.text


def test_a_module_with_one_custom_layer_names_that_layer():
    class CubeLayer(torch.nn.Module):
        def forward(self, x):
            return OFF_1PC.apply(x)
    torch.manual_seed(0)
    right = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    assert check(right, torch.randn(2, 4)).verdict == "pass"
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), CubeLayer(), torch.nn.Linear(3, 2))
    report = check(model, torch.randn(2, 4))
    assert report.verdict == "fail"
    assert {p.name for p in report.parameters} == {"input", "0.weight", "0.bias", "2.weight", "2.bias"}
    assert [(c["function"], c["module"]) for c in report.data["custom_functions"] if c["verdict"] == "fail"] == \
        [("Cube", "module 1 (CubeLayer)")]
    assert "custom autograd.Function Cube in module 1 (CubeLayer) (" in report.text
    assert {p.name: p.status for p in report.parameters}["2.weight"] == "ok"  # after the layer: right


def test_the_gradcheck_drop_in_and_torch_gradcheck_on_the_same_bug():
    x = X.clone().requires_grad_(True)
    assert gradcheck(through(RIGHT), (x,)) is True
    with pytest.raises(GradcheckError, match="custom autograd.Function Cube"):
        gradcheck(through(OFF_1PC), (x,))
    assert gradcheck(through(OFF_1PC), (x,), raise_exception=False) is False
    from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

    with pytest.raises(TorchGradcheckError, match="Jacobian mismatch"):  # torch's own: which output and input
        torch.autograd.gradcheck(through(OFF_1PC), (x,))


F = torch.nn.functional
X3 = torch.linspace(-1.7, 1.3, 24, dtype=torch.float64).reshape(2, 3, 4)
W45 = torch.linspace(-0.5, 0.8, 20, dtype=torch.float64).reshape(4, 5)
STANDARD = {  # torch's own (right) gradients through each captured op: a capture error would fail them
    "softmax": lambda x: F.softmax(x, dim=-1) * F.log_softmax(x, dim=1),
    "reductions": lambda x: x.mean(dim=(0, 2), keepdim=True) * x.sum(1, keepdim=True),
    "relu, sigmoid, where": lambda x: torch.relu(x) * torch.sigmoid(x) + torch.where(x > 0, x, -0.5 * x),
    "slices, expand": lambda x: x[:, :1, :].expand(2, 3, 4) * x + x[1, 2],
    "layout": lambda x: x.permute(2, 0, 1).transpose(0, 1).unsqueeze(1).squeeze(1).reshape(6, 4),
    "matmul, linear": lambda x: F.linear(x @ W45, W45, torch.ones(4, dtype=torch.float64)),
    "a hand-written layer norm": lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        x.var(-1, keepdim=True, unbiased=False) + 1e-5),
}


@pytest.mark.parametrize("name", list(STANDARD))
def test_standard_ops_are_captured_faithfully(name):
    report = check(STANDARD[name], X3)
    assert report.verdict == "pass", report.text
    assert report.data["custom_functions"] == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_torch_runs_on_the_tensors_device_and_the_references_on_the_host():
    x = X.cuda()
    assert check(through(RIGHT), x).verdict == "pass"
    report = check(through(ONE_ELEMENT), x)
    assert report.verdict == "fail" and _custom(report, "Cube")["verdict"] == "fail"


def test_through_a_server(server):
    report = check(through(ONE_ELEMENT), X, server=server.target)
    assert report.verdict == "fail" and _custom(report, "Cube")["verdict"] == "fail"


def test_in_place_ops_are_replayed_and_a_stale_saved_value_is_caught():
    def inplace(x):
        h = x * 2
        h.add_(1)  # replayed out of place: h names the new value
        return (h * h).sum()
    assert check(inplace, X).verdict == "pass"

    class KeepsInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h):
            ctx.h = h  # not ctx.save_for_backward: torch's version counter never sees the write below
            return h * h

        @staticmethod
        def backward(ctx, g):
            return g * 2 * ctx.h

    def stale(x):
        h = x + 1
        y = KeepsInput.apply(h)
        h.mul_(3)  # the backward reads 3h, not h
        return (y + h).sum()
    report = check(stale, X)
    assert report.verdict == "fail"
    [f] = [f for f in report.findings if f.severity == "error"]
    assert f.node == "x" and "its claimed gradient disagrees" in f.detail
    # on its own the Function is right: what is wrong is the value its backward reads
    assert _custom(report, "KeepsInput")["verdict"] == "pass"


def test_an_in_place_write_through_data_that_autograd_misses_is_caught():
    def through_data(x):
        y = x * 2
        y.data.mul_(3)  # the value is now 6x; torch's version counter does not see it
        return (y * y).sum()
    report = check(through_data, X)
    assert report.verdict == "fail"
    [p] = report.parameters
    # torch differentiated (2x)^2 with y = 6x plugged in: 24x; the function computed is (6x)^2: 72x
    assert p.data["gradient"] == pytest.approx((24 * X).tolist(), rel=1e-12)
    assert p.reference == pytest.approx((72 * X).numpy(), rel=1e-9)


def test_what_cannot_be_captured_is_refused_naming_the_op():
    def part_through_data(x):
        y = x * 2
        y[1:3].data.mul_(3)
        return (y * y).sum()
    # the write reaches y through a view: y's later read is what cannot be replayed
    with pytest.raises(TracerError, match=r"a tensor is read after an in-place op changed its memory through another"):
        check(part_through_data, X)
    with pytest.raises(TracerError, match=r"torch op aten::cumsum cannot be traced"):
        check(lambda x: torch.cumsum(x, 0).sum(), X)


def test_a_capture_that_mis_replays_an_op_is_refused_by_torchs_own_loss(monkeypatch):
    """The captured graph must compute torch's loss: an ATen op replayed wrongly (tanh as sin here) would
    verify torch's gradients against another function; the check is refused, naming the function."""
    from gradcheck_client.torch import capture

    monkeypatch.setitem(capture.ATEN, torch.ops.aten.tanh, capture.np.sin)  # keyed by overload packet

    def layer(x):
        return torch.tanh(x * 2.0).sum()

    with pytest.raises(TracerError, match="does not compute layer"):
        check(layer, torch.linspace(0.1, 1.0, 5, dtype=torch.float64))
