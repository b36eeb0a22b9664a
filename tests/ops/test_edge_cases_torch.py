"""Op edge cases as NumPy and PyTorch define them (issue 17), each against torch in the test:
zero-size axes in softmax/log_softmax/logsumexp and the reductions, take_along_axis
broadcasting a size-1 input dim, NaN/Inf inputs of maximum/minimum/clip named at the op that
first sees them, the symbolic oracle on zero-size and non-finite inputs, and no NumPy
RuntimeWarning on stderr."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.errors import GraphError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.symbolic import SymbolicOptions, symbolic_gradients
from gradcheck_svc.verify import verify


def engine(graph, node: str):
    """(value of node, gradient of every parameter) from our engine, float64."""
    program = Program(graph, np.float64)
    values = forward(program, NUMPY, prepare_feeds(program, NUMPY), grad=False, keep_values=True).values
    grads = backward(forward(program, NUMPY, prepare_feeds(program, NUMPY)))
    return np.asarray(values[node]), {p: np.asarray(g) for p, g in grads.items()}


def exp_sum_graph(op: str, x: np.ndarray, **attrs):
    """L = sum(exp(op(x))): finite even where op gives -inf (logsumexp of nothing)."""
    b = GraphBuilder(op)
    y = b.node(op, b.input("x", x, True), name="y", **attrs)
    b.output(b.node("sum", b.node("exp", y, name="e"), name="L"))
    return load_graph(b.build())


TORCH = {
    "softmax": lambda t, axis, **_: torch.softmax(t, dim=axis),
    "log_softmax": lambda t, axis, **_: torch.log_softmax(t, dim=axis),
    "logsumexp": lambda t, axis, keepdims=False: torch.logsumexp(t, dim=axis, keepdim=keepdims),
    "sum": lambda t, axis, keepdims=False: torch.sum(t, dim=axis, keepdim=keepdims),
}


@pytest.mark.parametrize("shape,axis", [((3, 0), -1), ((0, 4), 0), ((2, 0, 3), 1), ((0, 3), -1)])
@pytest.mark.parametrize("op,attrs", [("softmax", {}), ("log_softmax", {}), ("logsumexp", {}),
                                      ("logsumexp", {"keepdims": True}), ("sum", {}), ("sum", {"keepdims": True})])
def test_zero_size_axes_match_torch(op, attrs, shape, axis):
    x = np.zeros(shape)
    graph = exp_sum_graph(op, x, axis=axis, **attrs)
    value, grads = engine(graph, "y")
    t = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    ty = TORCH[op](t, axis, **attrs)
    torch.exp(ty).sum().backward()
    assert value.shape == tuple(ty.shape)
    np.testing.assert_array_equal(value, ty.detach().numpy())  # logsumexp over nothing: -inf, as torch
    assert grads["x"].shape == tuple(t.grad.shape) == shape
    report = verify(graph)
    assert report.verdict == "pass" and report.symbolic.status == "ok", report.to_text()


@pytest.mark.parametrize("op", ["max", "min"])
def test_an_extremum_over_nothing_is_a_user_error_as_in_torch(op):
    with pytest.raises((RuntimeError, IndexError)):
        getattr(torch, f"a{op}")(torch.zeros((3, 0)), dim=1)
    b = GraphBuilder(op)
    b.output(b.node("sum", b.node(op, b.input("x", np.zeros((3, 0)), True), axis=-1, name="y"), name="L"))
    with pytest.raises(GraphError, match="axis of size 0") as exc:
        load_graph(b.build())
    assert exc.value.node == "y"


@pytest.mark.parametrize("x_shape,idx,axis", [((1, 5), [[0, 4], [1, 1], [3, 2]], 1),
                                               ((4, 1), [[0, 0, 0], [0, 0, 0]], 0),
                                               ((2, 1, 3), [[[2], [0]]], 2)])
def test_take_along_axis_broadcasts_like_torch(x_shape, idx, axis):
    rng = np.random.default_rng(0)
    x, idx = rng.standard_normal(x_shape), np.array(idx)
    b = GraphBuilder("tala")
    y = b.node("take_along_axis", b.input("x", x, True), b.input("i", idx, dtype="int64"), axis=axis, name="y")
    t = torch.tensor(x, requires_grad=True)
    ty = torch.take_along_dim(t, torch.tensor(idx), dim=axis)
    w = rng.uniform(0.5, 1.5, tuple(ty.shape))
    b.output(b.node("sum", b.node("mul", y, b.input("w", w), name="wy"), name="L"))
    graph = load_graph(b.build())
    (ty * torch.tensor(w)).sum().backward()
    value, grads = engine(graph, "y")
    np.testing.assert_array_equal(value, ty.detach().numpy())
    np.testing.assert_allclose(grads["x"], t.grad.numpy(), rtol=1e-15, atol=0)
    assert verify(graph).verdict == "pass"


NONFINITE = np.array([1.0, np.nan, np.inf, -np.inf, 0.25])


def _binary(op, x, y):
    b = GraphBuilder(op)
    out = b.node(op, b.input("x", x, True), b.input("y", y, True), name="m")
    b.output(b.node("sum", b.node("mul", out, b.input("w", np.linspace(1, 2, x.size)), name="wm"), name="L"))
    return load_graph(b.build(), allow_nonfinite=True)  # NaN/Inf inputs on purpose


def _clip(x):
    b = GraphBuilder("clip")
    out = b.node("clip", b.input("x", x, True), min=0.0, max=2.0, name="m")
    b.output(b.node("sum", b.node("mul", out, b.input("w", np.linspace(1, 2, x.size)), name="wm"), name="L"))
    return load_graph(b.build(), allow_nonfinite=True)


@pytest.mark.parametrize("op", ["maximum", "minimum", "clip"])
def test_nonfinite_inputs_are_named_at_the_op_that_first_sees_them(op, capfd):
    y = np.full(NONFINITE.shape, 0.5)
    graph = _clip(NONFINITE) if op == "clip" else _binary(op, NONFINITE, y)
    t = torch.tensor(NONFINITE, requires_grad=True)
    ty = torch.clamp(t, 0.0, 2.0) if op == "clip" else getattr(torch, op)(t, torch.tensor(y))
    value, _ = engine(graph, "m")
    np.testing.assert_array_equal(value, ty.detach().numpy())  # NaN propagates, as in torch
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy RuntimeWarning anywhere on the way
        report = verify(graph)
    assert "RuntimeWarning" not in capfd.readouterr().err
    assert report.verdict == "fail"
    (f,) = [f for f in report.findings if f.severity == "error"]
    assert (f.node, f.cause) == ("m", "nonfinite") and "'x'" in f.detail and f.worst.index == (1,), f.detail
    assert not [f for f in report.findings if f.cause == "rule_error"]


@pytest.mark.parametrize("x,e", [([1.5, np.inf, np.nan], [2.0, 2.0, 2.0]), ([1.5, 2.0, 0.5], [np.inf, np.nan, -np.inf]),
                                 ([np.inf, 2.0], [0.5, np.inf]), ([-np.inf, 3.0], [3.0, np.nan])])
def test_symbolic_oracle_on_nonfinite_pow_inputs_matches_torch(x, e):
    b = GraphBuilder("pow")
    p = b.node("pow", b.input("x", np.array(x), True), b.input("e", np.array(e), True), name="p")
    b.output(b.node("sum", p, name="L"))
    result = symbolic_gradients(load_graph(b.build(), allow_nonfinite=True), SymbolicOptions())
    assert result.status == "ok", result.reason
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    te = torch.tensor(e, dtype=torch.float64, requires_grad=True)
    torch.pow(tx, te).sum().backward()
    np.testing.assert_allclose(result.gradients["x"], tx.grad.numpy(), rtol=1e-12)  # inf and NaN where torch's are
    np.testing.assert_allclose(result.gradients["e"], te.grad.numpy(), rtol=1e-12)


def test_symbolic_oracle_on_a_kept_zero_size_axis():
    b = GraphBuilder("empty")
    b.output(b.node("sum", b.node("sum", b.input("x", np.zeros((0, 3)), True), axis=-1, keepdims=True, name="s"),
                    name="L"))
    result = symbolic_gradients(load_graph(b.build(), allow_nonfinite=True), SymbolicOptions())
    assert result.status == "ok", result.reason
    t = torch.zeros((0, 3), dtype=torch.float64, requires_grad=True)
    t.sum(dim=-1, keepdim=True).sum().backward()
    assert result.gradients["x"].shape == tuple(t.grad.shape)
