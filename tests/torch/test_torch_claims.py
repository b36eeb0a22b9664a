"""gradcheck_client.torch: torch's own gradients (custom autograd.Functions, hooks, modules) verified as claimed
gradients, each planted bug caught and named, each correct version passing; compared with
torch.autograd.gradcheck on the same cases."""
from __future__ import annotations

import inspect
import re
import threading

import pytest

torch = pytest.importorskip("torch")  # torch is an optional extra of the client (installed in the test venv)

from gradcheck_client.torch import GradcheckError, check, gradcheck, opaque  # noqa: E402
from gradcheck_core.trace_errors import TracerError  # noqa: E402
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
    # the drop-in: torch's checks pass, so ours runs first without the report's memory profile; its failure is
    # checked again with it, the message whole
    with pytest.raises(GradcheckError, match="custom autograd.Function Cube") as failed:
        gradcheck(lambda x: (OFF_1PC.apply(x) * 0.0).sum() + x.sum(), (X.clone().requires_grad_(True),))
    assert "\n  memory: training " in str(failed.value) and "sqrt checkpointing would need" in str(failed.value)


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
    assert report.text.startswith(f"node '{f.node}' was made at "), report.text  # first: not the values screen's line


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
    # the culprit first, below the dtypes header (float32 input): not the values screen's line
    lines = [line for line in report.text.splitlines() if not line.startswith(("dtypes: ", "  in float32: "))]
    assert lines[0].startswith("custom autograd.Function Cube in module 1 (CubeLayer) ("), report.text
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
    # an opaque node is checked in process, the rest of the graph (its outputs as parameters) on the server
    report = check(lambda x: torch.tanh(wavy_wrong(x * 2)).sum(), X, server=server.target)
    assert report.verdict == "fail" and _opaque(report, "gradcheck_tests::wavy_wrong")["verdict"] == "fail"
    assert all(p.status == "ok" for p in report.parameters)


class _KinkedRelu(torch.autograd.Function):
    """relu whose backward gives 2 at 0: outside its one-sided derivatives 0 and 1 -- no convention."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * torch.where(x > 0, 1.0, torch.where(x == 0, 2.0, 0.0)).to(g.dtype)


def test_torchs_conventions_at_kinks_are_judged_as_the_engines_not_failed():
    """torch's relu'(0) = 0 and clamp's 1 at a bound are other subgradients than the engine's: between the
    one-sided derivatives, the kink warning and a pass; a backward outside them fails at the kink."""
    x = torch.tensor([0.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    c = torch.arange(1.0, 5.0, dtype=torch.float64)
    for fn in (lambda x: (torch.relu(x) * c).sum(), lambda x: (torch.clamp(x, -1.0, 0.5) * c).sum()):
        report = check(fn, x)
        assert report.verdict == "pass", report.text
        assert [p.status for p in report.parameters] == ["ok (kink)"]
        [f] = report.findings
        assert (f.cause, f.severity) == ("nondifferentiable_point", "warning")
        assert "exactly at its kink" in f.detail and f.detail.endswith("not a failure")
    report = check(lambda x: (_KinkedRelu.apply(x) * c).sum(), x)
    assert report.verdict == "fail"
    [f] = [f for f in report.findings if f.severity == "error"]
    assert f.cause == "nondifferentiable_point" and "lies outside the one-sided differences" in f.detail
    worst = f.data["worst_element"]
    assert worst["index"] == [0] and worst["engine"] == 2.0  # the claimed value at x[0] = 0
    assert _custom(report, "_KinkedRelu")["verdict"] == "fail"


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
    # the write reaches y through a view of it (capture/inplace.py): y follows the values, so torch's gradient,
    # which missed the write (x's elements 1 and 2 are 3 times torch's there), fails -- as torch's gradcheck does
    missed = check(part_through_data, X)
    assert missed.verdict == "fail" and [f.node for f in missed.findings if f.severity == "error"] == ["x"]
    with pytest.raises(TracerError, match=r"torch op aten::bernoulli_\.float is random \(at .*test_torch_claims"):
        check(lambda x: F.dropout(x, 0.5).sum(), X)  # a re-run would draw another mask
    with pytest.raises(TracerError, match=r"an output of opaque torch op aten::cumsum \(.*\) is written in place"):
        check(lambda x: torch.cumsum(x, 0).mul_(2).sum(), X)
    with pytest.raises(TracerError, match=r"torch op aten::_to_copy made a torch.float32 tensor from traced values"):
        check(lambda x: x.float().sum(), X)  # not an opaque node: its rounding is not the float64 function's
    # a complex intermediate is no constant: taken for one, a correct sin beside it was named the culprit
    with pytest.raises(TracerError, match=r"torch op aten::_fft_r2c made a torch.complex128 tensor from traced "
                                          r"values \(at .*test_torch_claims.py:\d+\): complex intermediates are not "
                                          r"captured"):
        check(lambda x: x.sin().sum() + torch.fft.rfft(x).abs().sum(), X)
    # an op outside the table reading nan (log of X's negatives): named, not "the engine's loss is nan"
    with pytest.raises(TracerError, match=r"^opaque torch op aten::nan_to_num \(.*test_torch_claims.py:\d+\) reads a "
                                          r"traced tensor holding nan or inf"):
        check(lambda x: torch.nan_to_num(x.log()).sum(), X)


def test_a_capture_that_mis_replays_an_op_is_refused_by_torchs_own_loss(monkeypatch):
    """The captured graph must compute torch's loss: an ATen op replayed wrongly (tanh as sin here) would
    verify torch's gradients against another function; the check is refused, naming the function."""
    from gradcheck_client.torch import capture

    monkeypatch.setitem(capture.ATEN, torch.ops.aten.tanh, capture.np.sin)  # keyed by overload packet

    def layer(x):
        return torch.tanh(x * 2.0).sum()

    with pytest.raises(TracerError, match="does not compute layer"):
        check(layer, torch.linspace(0.1, 1.0, 5, dtype=torch.float64))


# -- layers: the ATen ops of common layers, replayed as the registry's ops (capture.ATEN) --------------------------
X4 = torch.linspace(-1.9, 2.1, 2 * 3 * 6 * 6, dtype=torch.float64).reshape(2, 3, 6, 6).sin() * 1.7
W4 = torch.linspace(-0.6, 0.7, 4 * 3 * 3 * 3, dtype=torch.float64).reshape(4, 3, 3, 3).cos()
LABELS = torch.tensor([1, 0, 3, 2, 2, 0])
LAYERS = {  # (function, input): torch's own (right) gradients; a mis-replay fails them or is refused
    "layer_norm": (lambda x: F.layer_norm(x, (4,), torch.linspace(0.5, 1.5, 4, dtype=torch.float64),
                                          torch.ones(4, dtype=torch.float64)), X3),
    "layer_norm over two axes, no affine": (lambda x: F.layer_norm(x, (3, 4)), X3),
    "gelu, both forms": (lambda x: F.gelu(x) * F.gelu(x, approximate="tanh"), X3),
    "silu, leaky_relu, elu": (lambda x: F.silu(x) * F.leaky_relu(x, 0.1) + F.elu(x), X3),
    "hardtanh, clamp": (lambda x: F.hardtanh(x * 0.9) + torch.clamp(x, -0.55, 0.8), X3),
    "amax, amin": (lambda x: x.amax(dim=-1) * x.amin(dim=1, keepdim=True).sum(), X3),
    "cat, stack": (lambda x: torch.cat([x, x * 2], dim=0) + torch.stack([x[0], x[1] * 3], dim=-1).sum(-1), X3),
    "logsumexp": (lambda x: torch.logsumexp(x, 1).sum(0) * torch.logsumexp(x, -1, keepdim=True), X3),
    "mse_loss": (lambda x: F.mse_loss(x, torch.full_like(x, 0.3)) + F.mse_loss(x * x, x, reduction="sum"), X3),
    "cross_entropy": (lambda x: F.cross_entropy(x.reshape(6, 4), LABELS), X3),
    "nll_loss of log_softmax": (lambda x: F.nll_loss(F.log_softmax(x.reshape(6, 4), 1), LABELS, reduction="sum"),
                                X3),
    "embedding": (lambda x: F.embedding(LABELS.reshape(2, 3), x.reshape(6, 4)), X3),
    "conv2d": (lambda x: F.conv2d(x, W4, torch.ones(4, dtype=torch.float64), stride=2, padding=1), X4),
    "conv2d, dilated": (lambda x: F.conv2d(x, W4, dilation=2, padding=(1, 2)), X4),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2) + F.max_pool2d(x, 3, stride=1, padding=1)[..., ::2, ::2], X4),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), X4),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_common_layers_are_replayed_as_registry_ops(name):
    fn, x = LAYERS[name]
    report = check(fn, x)
    assert report.verdict == "pass", report.text
    assert report.data["opaque"] == []  # replayed, not cut out: the references differentiate through them


def test_a_module_of_layer_norm_linear_gelu_and_a_custom_function_passes_and_its_bug_is_named():
    class Block(torch.nn.Module):
        def __init__(self, cube):
            super().__init__()
            self.norm, self.linear, self.cube = torch.nn.LayerNorm(4), torch.nn.Linear(4, 3), cube

        def forward(self, x):
            return self.cube.apply(F.gelu(self.linear(self.norm(x))))
    torch.manual_seed(0)
    report = check(Block(RIGHT), torch.randn(2, 4))
    assert report.verdict == "pass", report.text
    assert {p.name for p in report.parameters} == {"x", "norm.weight", "norm.bias", "linear.weight", "linear.bias"}
    assert report.data["opaque"] == [] and _custom(report, "Cube")["verdict"] == "pass"
    torch.manual_seed(0)
    report = check(Block(OFF_1PC), torch.randn(2, 4))
    assert report.verdict == "fail" and _custom(report, "Cube")["verdict"] == "fail"


# -- opaque nodes: what the capture cannot replay, checked on its own (opaque.py) -----------------------------------
def _opaque(report, op):
    [entry] = [e for e in report.data["opaque"] if e["op"] == op]
    return entry


def _line_of(fn, offset: int) -> str:
    return f"test_torch_claims.py:{inspect.getsourcelines(fn)[1] + offset}"


def test_an_aten_op_outside_the_table_is_an_opaque_node_checked_by_differences():
    def cumulative(x):
        return torch.sin(torch.cumsum(torch.tanh(x), 0)).sum()
    report = check(cumulative, X)
    assert report.verdict == "pass", report.text
    entry = _opaque(report, "aten::cumsum")
    assert entry["verdict"] == "pass" and entry["kind"] == "torch op" and entry["elements"] == 5
    assert entry["source"].endswith(_line_of(cumulative, 1))
    assert "central differences" in entry["checked"]
    # its output is a parameter of the graph, checked by the references against torch's adjoint there
    assert {p.name: p.status for p in report.parameters} == {"x": "ok", entry["parameters"][0]: "ok"}
    assert f"opaque torch op aten::cumsum ({entry['source']}): PASS" in report.text


def _doubled_after(x):
    y = torch.cumsum(torch.tanh(x), 0)
    y.register_hook(lambda g: g * 2)  # torch's adjoint at the opaque node's output is doubled
    return torch.sin(y).sum()


def _doubled_before(x):
    h = torch.tanh(x)
    h.register_hook(lambda g: g * 2)  # the gradient handed back through the opaque node is doubled
    return torch.sin(torch.cumsum(h, 0)).sum()


@pytest.mark.parametrize("fn, culprit", [(_doubled_after, "opaque"), (_doubled_before, "x")])
def test_a_wrong_gradient_on_either_side_of_an_opaque_node_is_still_caught(fn, culprit):
    report = check(fn, X)
    assert report.verdict == "fail"
    assert _opaque(report, "aten::cumsum")["verdict"] == "pass"  # the op itself is right
    failed = [p.name for p in report.parameters if p.status == "FAIL"]
    assert len(failed) == 1 and failed[0].startswith(culprit)


@torch.library.custom_op("gradcheck_tests::wavy", mutates_args=())
def wavy(x: torch.Tensor) -> torch.Tensor:  # a custom op (a C++/CUDA/Triton kernel would register the same way)
    return x * 3.0 + torch.sin(x)


@torch.library.custom_op("gradcheck_tests::wavy_wrong", mutates_args=())
def wavy_wrong(x: torch.Tensor) -> torch.Tensor:
    return x * 3.0 + torch.sin(x)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _wavy_backward(ctx, g):
    x, = ctx.saved_tensors
    return g * (3.0 + torch.cos(x))


def _wavy_wrong_backward(ctx, g):
    x, = ctx.saved_tensors
    return g * (3.0 + torch.cos(x)) * torch.where(x < 0, 1.01, 1.0)  # 1% off for negative inputs


torch.library.register_autograd("gradcheck_tests::wavy", _wavy_backward, setup_context=_save_input)
torch.library.register_autograd("gradcheck_tests::wavy_wrong", _wavy_wrong_backward, setup_context=_save_input)


def test_a_custom_op_with_a_wrong_registered_backward_is_caught_as_an_opaque_node_naming_it():
    def layer(x, op):
        return torch.tanh(op(x * 2)).sum()
    right = check(layer, X, wavy, wrt="x")
    assert right.verdict == "pass", right.text
    assert _opaque(right, "gradcheck_tests::wavy")["verdict"] == "pass"
    report = check(layer, X, wavy_wrong, wrt="x")
    assert report.verdict == "fail"
    entry = _opaque(report, "gradcheck_tests::wavy_wrong")
    assert entry["verdict"] == "fail" and entry["source"].endswith(_line_of(layer, 1))
    worst = re.search(r"its backward disagrees with the derivative of its forward: input 0 \(worst \[(\d)\]",
                      entry["detail"])
    assert worst and X[int(worst.group(1))] < 0  # wrong only for negative inputs: the worst element is one
    assert report.text.startswith("verdict FAIL (the captured graph's own verdict below is PASS)")
    assert f"opaque torch op gradcheck_tests::wavy_wrong ({entry['source']}): FAIL" in report.text


@torch.library.custom_op("gradcheck_tests::ramp", mutates_args=())
def ramp(x: torch.Tensor) -> torch.Tensor:  # 2 max(x, 0): a kink at 0
    return torch.clamp(x, min=0.0) * 2


@torch.library.custom_op("gradcheck_tests::ramp_wrong_at_0", mutates_args=())
def ramp_wrong_at_0(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x, min=0.0) * 2


torch.library.register_autograd("gradcheck_tests::ramp", lambda ctx, g: g * 2 * (ctx.saved_tensors[0] > 0),
                                setup_context=_save_input)
torch.library.register_autograd(  # 3 at the kink: outside [0, 2], the one-sided derivatives there
    "gradcheck_tests::ramp_wrong_at_0", lambda ctx, g: g * torch.where(ctx.saved_tensors[0] == 0, 3.0,
                                                                       2.0 * (ctx.saved_tensors[0] > 0)),
    setup_context=_save_input)


def test_at_a_kink_an_opaque_nodes_value_must_lie_between_the_one_sided_derivatives():
    x = torch.tensor([0.7, -1.3, 0.0, -0.2, 1.1, 1e-8], dtype=torch.float64)  # 0 and 1e-8: a kink within the step
    report = check(lambda x: torch.sin(ramp(x)).sum(), x)
    assert report.verdict == "pass", report.text
    assert "2 at a kink, where torch's value lies between the one-sided derivatives" in \
        _opaque(report, "gradcheck_tests::ramp")["detail"]
    entry = _opaque(check(lambda x: torch.sin(ramp_wrong_at_0(x)).sum(), x), "gradcheck_tests::ramp_wrong_at_0")
    assert entry["verdict"] == "fail" and "(worst [2]: torch's VJP 3, differences 2 +- " in entry["detail"]


def test_an_op_reading_one_triangle_of_a_symmetric_input_is_differenced_symmetrically():
    """eigh reads the lower triangle; torch's VJP is the symmetric matrix's. Element by element, a correct eigh was
    failed (an upper step changes nothing); along E_ij + E_ji it passes, and a wrong VJP still fails."""
    a = torch.tensor([[0.9, -0.3, 0.5], [0.2, 1.4, -0.6], [0.1, 0.7, -1.2]], dtype=torch.float64)
    report = check(lambda a: torch.linalg.eigvalsh(a + a.T), a)
    assert report.verdict == "pass" and _opaque(report, "aten::_linalg_eigh")["verdict"] == "pass", report.text
    s, c = a + a.T, torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    node = opaque.Opaque("aten::_linalg_eigh", "torch op", "", "", lambda ts: [torch.linalg.eigvalsh(ts[0])], [s], [])
    right = opaque.vjp(node, [c])
    assert opaque.local_check(node, [c], right)["verdict"] == "pass"
    assert opaque.local_check(node, [c], [right[0] * 1.01])["verdict"] == "fail"


def test_an_op_reading_one_triangle_of_its_factor_is_compared_on_that_triangle_only():
    """cholesky_solve reads L's lower triangle; torch's VJP in the upper one is a convention (L L^T's full-matrix
    gradient), where the differences are 0: a correct cholesky_solve was failed there. Compared on the lower
    triangle it passes (as torch's gradcheck of the same function), a wrong VJP there still fails, and a leaf L
    whose upper triangle the function never reads still fails as in torch (torch's gradient there is not 0)."""
    b = torch.tensor([[0.4, -1.0], [0.3, 0.8], [-0.5, 0.2]], dtype=torch.float64)
    low = torch.tensor([[1.5, 0.0, 0.0], [0.3, 1.2, 0.0], [-0.4, 0.6, 1.1]], dtype=torch.float64)
    solve = (lambda L, B: torch.cholesky_solve(B, L.tril()))
    assert torch.autograd.gradcheck(solve, (low.clone().requires_grad_(), b.clone().requires_grad_()))
    report = check(solve, low, b)
    assert report.verdict == "pass" and _opaque(report, "aten::cholesky_solve")["verdict"] == "pass", report.text
    leaf = check(lambda L, B: torch.cholesky_solve(B, L), low, b)
    assert leaf.verdict == "fail" and leaf.data["check"]["function_values"]["verdict"] == "fail", leaf.text
    c = torch.tensor([[1.0, -2.0], [0.5, 0.3], [-0.7, 1.2]], dtype=torch.float64)
    node = opaque.Opaque("aten::cholesky_solve", "torch op", "", "", lambda ts: [torch.cholesky_solve(*ts)],
                         [b, low], [], unread=opaque._unread("aten::cholesky_solve", (b, low), {}, [0, 1]))
    right = opaque.vjp(node, [c])
    assert opaque.local_check(node, [c], right)["verdict"] == "pass"
    off = right[1].clone()
    off[2, 1] *= 1.01  # an element of the lower triangle, which the op reads
    assert opaque.local_check(node, [c], [right[0], off])["verdict"] == "fail"


def test_opaque_nodes_checked_here_and_the_graph_on_a_server_make_one_verdict_that_says_where(server):
    """A server cannot run the user's Python: an opaque node's differences are taken in process, the captured
    graph (its outputs as parameters) is verified on the server, and the report merges both into one verdict,
    saying where each part was checked."""
    def hooked(x):  # a hook after the opaque op doubles the gradient reaching h * h: the server's part fails
        h = torch.tanh(wavy(x * 2))
        h.register_hook(lambda g: g * 2)
        return (h * h).sum()
    cases = {"both right": (lambda x: torch.tanh(wavy(x * 2)).sum(), "wavy", "pass", "pass"),
             "the opaque node wrong": (lambda x: torch.tanh(wavy_wrong(x * 2)).sum(), "wavy_wrong", "fail", "pass"),
             "the graph wrong": (hooked, "wavy", "pass", "fail")}
    for what, (fn, op, opaque_verdict, graph_verdict) in cases.items():
        here = check(fn, X)
        there = check(fn, X, server=server.target)
        assert here.data["checked"] == {"graph": "in process", "opaque": "in process"}
        assert there.data["checked"] == {"graph": f"on server {server.target}", "opaque": "in process"}
        assert (f"checked: the captured graph on server {server.target}; 1 opaque node(s) in this process (the "
                "server cannot run their Python); one verdict for both") in there.text.splitlines()[:2]  # (a merged
        # verdict other than the captured graph's is the line before)
        for report in (here, there):
            entry = _opaque(report, f"gradcheck_tests::{op}")
            assert entry["verdict"] == opaque_verdict and entry["checked"].startswith("in process"), what
            graph_ok = all(p.status == "ok" for p in report.parameters) and \
                not any(f.severity == "error" for f in report.findings)
            assert graph_ok == (graph_verdict == "pass"), (what, report.text)
            expected = "pass" if opaque_verdict == graph_verdict == "pass" else "fail"
            assert report.verdict == report.data["verdict"] == expected, (what, report.text)


def test_a_module_with_a_custom_op_layer_names_the_op_and_the_layer():
    class WavyLayer(torch.nn.Module):
        def __init__(self, op: str):
            super().__init__()
            self.op = op

        def forward(self, x):
            return getattr(torch.ops.gradcheck_tests, self.op)(x - x.mean())  # some negative: wavy_wrong's bug
    for op, verdict in (("wavy", "pass"), ("wavy_wrong", "fail")):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), WavyLayer(op), torch.nn.Linear(3, 2))
        report = check(model, torch.randn(2, 4))
        assert report.verdict == verdict, report.text
        [entry] = report.data["opaque"]
        assert entry["op"] == f"gradcheck_tests::{op}" and entry["verdict"] == verdict
        assert entry["module"] == "module 1 (WavyLayer)" and entry["source"].startswith("module 1 (WavyLayer), ")
        assert {p.name: p.status for p in report.parameters}["2.weight"] == "ok"  # after the layer: right
    holder = WavyLayer("wavy")
    holder.fn = wavy  # the op object itself (copy.deepcopy cannot copy it): the module is run, not copied
    assert check(holder, torch.randn(2, 4)).verdict == "pass"


def cumulative_function(scale):
    """A custom Function whose forward calls an op outside the table (cumsum): the whole call is opaque."""
    class Cumulative(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.cumsum(x, 0) * 2

        @staticmethod
        def backward(ctx, g):
            return torch.flip(torch.cumsum(torch.flip(g, [0]), 0), [0]) * 2 * scale
    return Cumulative


def test_a_custom_function_calling_an_op_outside_the_table_is_opaque_named_by_class_and_line():
    right = check(lambda x: torch.sin(cumulative_function(1.0).apply(torch.tanh(x))).sum(), X)
    assert right.verdict == "pass", right.text
    cls = cumulative_function(1.01)
    report = check(lambda x: torch.sin(cls.apply(torch.tanh(x))).sum(), X)
    assert report.verdict == "fail"
    entry = _opaque(report, "Cumulative")
    assert entry["kind"] == "autograd.Function" and entry["verdict"] == "fail"
    assert entry["source"].endswith(f"test_torch_claims.py:{inspect.getsourcelines(cls.backward)[1]}")
    assert entry["reason"] == "its forward calls aten::cumsum, which the capture does not replay"
    assert report.data["custom_functions"] == []  # checked as the opaque node, not traced


def test_an_opaque_node_too_large_to_check_in_process_leaves_the_report_undecided(monkeypatch):
    # the limit lowered from 4096 (opaque.py reads it at each check): the same comparison one element over
    # it, without finite differences over 4097 elements twice (~15 s of this file's time)
    monkeypatch.setattr(opaque, "MAX_ELEMENTS", 64)
    # small values: the cumsum stays O(1), so the rest of the graph's differences decide it (a cumsum of
    # magnitude 1000 would leave its own elements undecided by truncation, a different undecided)
    big = torch.linspace(-1.0, 1.0, opaque.MAX_ELEMENTS + 1, dtype=torch.float64) * 1e-3
    report = check(lambda x: torch.sin(torch.cumsum(x, 0)).sum(), big)
    entry = _opaque(report, "aten::cumsum")
    assert entry["verdict"] == "undecided" and "65 input elements, over the in-process limit of 64" in entry["detail"]
    assert report.verdict == "undecided" and not report.passed  # the rest of the graph passed: never "pass"
    with pytest.raises(GradcheckError, match="UNDECIDED"):
        gradcheck(lambda x: torch.sin(torch.cumsum(x, 0)).sum(), (big.requires_grad_(True),))


def test_float32_inputs_are_checked_in_float64_and_the_report_says_so():
    report = check(through(RIGHT), X.float())
    assert report.verdict == "pass" and report.data["check"]["upcast"] == ["x"]
    model = torch.nn.Linear(4, 3)  # float32 parameters
    assert check(model, torch.randn(2, 4)).data["check"]["upcast"] == ["input", "weight", "bias"]


def test_an_op_whose_arguments_its_entry_declines_is_an_opaque_node():
    x = X4[:1, :, :3, :3]  # (a 2x3x4x4 x proved the same in 25 times the time)
    weight = torch.linspace(-1.0, 1.0, 3 * 2 * 3 * 3, dtype=torch.float64).reshape(3, 2, 3, 3)
    report = check(lambda x, w: torch.tanh(F.conv_transpose2d(x, w)), x, weight)
    assert report.verdict == "pass", report.text
    entry = _opaque(report, "aten::convolution")
    assert entry["verdict"] == "pass" and entry["elements"] == x.numel() + weight.numel()
    assert entry["reason"] == "its arguments are outside the capture's entry (a transposed convolution is not replayed)"


def test_a_gradient_convention_is_refused_not_failed():
    weight = torch.linspace(-1.0, 1.0, 15, dtype=torch.float64).reshape(5, 3)
    with pytest.raises(TracerError, match="padding_idx or scale_grad_by_freq: torch's gradient there is a convention"):
        check(lambda w: F.embedding(LABELS[:3], w, padding_idx=0).sum(), weight)


def test_a_check_from_another_thread_meanwhile_is_refused_and_its_functions_are_not_recorded():
    running, go, seen = threading.Event(), threading.Event(), {}

    def waits(x):
        running.set()
        go.wait(timeout=600)  # released by the main thread below; the timeout only bounds a broken run
        return torch.tanh(x).sum()

    def first():
        seen["report"] = check(waits, X)
    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert running.wait(timeout=600)
        with pytest.raises(TracerError, match="already running in this process"):
            check(lambda x: x.sum(), X)
        RIGHT.apply(X.clone().requires_grad_(True))  # this thread's Function call: not the running check's
    finally:
        go.set()
        thread.join()
    assert seen["report"].verdict == "pass" and seen["report"].data["custom_functions"] == []


def test_a_check_inside_a_check_is_refused():
    def checks_itself(x):
        check(lambda y: y.sum(), x)
        return x.sum()
    with pytest.raises(TracerError, match="already running in this process"):
        check(checks_itself, X)
    assert check(lambda x: x.sum(), X).verdict == "pass"  # the lock was released


def test_torchs_own_errors_are_one_line_naming_the_op_and_the_module():
    with pytest.raises(TracerError, match=r"^torch op aten::addmm raised \(at module 0 \(Linear\), .*\): mat1 and "
                                          r"mat2 shapes cannot be multiplied \(2x5 and 4x3\)$"):
        check(torch.nn.Sequential(torch.nn.Linear(4, 3)), torch.ones(2, 5))

    def writes_a_leaf(x):
        return x.mul_(2).sum()  # autograd's own check, before any op runs
    with pytest.raises(TracerError, match=r"^torch raised while running writes_a_leaf \(at .*test_torch_claims.py:"
                                          rf"{inspect.getsourcelines(writes_a_leaf)[1] + 1}\): a leaf Variable that "
                                          r"requires grad is being used in an in-place operation\.$"):
        check(writes_a_leaf, X)


def test_the_drop_in_takes_torchs_keywords_and_tuple_outputs():
    x = X.clone().requires_grad_(True)
    assert gradcheck(lambda x: (torch.tanh(x), x * 2), (x,), eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=0.0,
                     check_undefined_grad=True, check_batched_grad=False, fast_mode=True) is True
    with pytest.raises(GradcheckError, match="custom autograd.Function Cube"):
        gradcheck(lambda x: (x.sum(), through(OFF_1PC)(x)), x)
    with pytest.raises(TypeError, match="fast_mod"):
        gradcheck(through(RIGHT), (x,), fast_mod=True)
    with pytest.raises(GradcheckError, match="^not checked: torch op aten::bernoulli_.float is random"):
        gradcheck(lambda x: F.dropout(x, 0.5), (x,))  # a refusal is never a pass
    assert issubclass(GradcheckError, RuntimeError)


def test_beyond_the_symbolic_budget_a_module_is_checked_by_differences_and_a_doubled_gradient_still_fails():
    """check.SYMBOLIC_BUDGET: a module over it is verified against the complex-step differences, the report's
    warning saying the symbolic oracle was skipped -- and a parameter hook doubling one gradient still fails
    (its finding, judged along random directions, once crashed the in-process proto report: report_proto).
    ~1.5 s: the module must exceed the budget (256 elements), and the failing check runs the diagnosis."""
    generator = torch.Generator().manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)).double()
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)
    x = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    report = check(mlp, x)
    assert report.verdict == "pass"
    assert any(w.startswith("symbolic oracle skipped: graph has") and "budget is 256" in w
               for w in report.data["warnings"]), report.data["warnings"]
    handle = mlp[2].weight.register_hook(lambda g: g * 2)
    try:
        assert check(mlp, x).verdict == "fail"
    finally:
        handle.remove()
    small = torch.tensor([0.3, -0.7], dtype=torch.float64)
    assert check(torch.tanh, small).data["symbolic"]["status"] == "ok"  # within the budget: exact references
    assert check(torch.tanh, small, symbolic_budget=1).data["symbolic"]["status"] == "skipped"  # the caller's own
