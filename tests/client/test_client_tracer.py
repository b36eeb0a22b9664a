"""The define-by-run tracer and graph files (client side, checked with the engine and torch)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_client import Tracer, load_graph, ops, save_graph
from gradcheck_core.graphio import GraphFileError
from gradcheck_core.tracer import _EAGER, TracerError, TracerWarning, tanh
from gradcheck_svc.graph import validate
from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.verify import verify


def test_seed_expression_traces_to_the_seed_graph():
    t = Tracer("seed")
    w, x = t.param("w", 3.0), t.param("x", 2.0)
    z = (w * x).named("z")
    loss = ((z ** 2) / 4).named("L")
    g = t.graph(loss)
    assert [(n.name, n.op) for n in g.nodes] == [("z", "mul"), ("pow_3", "pow"), ("L", "div")]
    report = verify(validate(g))
    assert report.passed and report.loss == 9.0
    assert {p.name: float(p.gradient) for p in report.parameters} == {"w": 6.0, "x": 9.0}


def test_mlp_trace_matches_torch(rng):
    hv, wv, bv = rng.standard_normal((4, 3)), rng.standard_normal((3, 5)), rng.standard_normal(5)
    t = Tracer("mlp")
    h, W, b = t.input("h", hv), t.param("W", wv), t.param("b", bv)
    loss = (tanh(h @ W + b) ** 2).mean()
    report = verify(validate(t.graph(loss)))
    W_t, b_t = (torch.tensor(a, requires_grad=True) for a in (wv, bv))
    ref = (torch.tanh(torch.tensor(hv) @ W_t + b_t) ** 2).mean()
    ref.backward()
    assert report.passed
    assert report.loss == pytest.approx(ref.item(), rel=1e-12)
    grads = {p.name: p.gradient for p in report.parameters}
    np.testing.assert_allclose(grads["W"], W_t.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(grads["b"], b_t.grad.numpy(), rtol=1e-10)
    assert float(loss.value) == pytest.approx(ref.item(), rel=1e-12)  # the trace-time value agrees too


def test_data_dependent_control_flow_is_baked_in():
    def model(t, x0):
        x = t.param("x", x0)
        y = x * 3.0
        if y > 0:  # decided now, from the trace-time value
            return ops.relu(y).named("branch")
        return (y * y).named("branch")

    pos, neg = Tracer(), Tracer()
    with pytest.warns(TracerWarning, match="baked into the graph"):
        g_pos, g_neg = pos.graph(model(pos, 1.0)), neg.graph(model(neg, -1.0))
    assert g_pos.nodes[-1].op == "relu" and g_neg.nodes[-1].op == "mul"
    assert verify(validate(g_neg)).parameters[0].gradient == pytest.approx(-18.0)  # d(9x²)/dx at -1


def test_reductions_with_attributes_and_pruning():
    t = Tracer()
    x = t.param("x", np.arange(6.0).reshape(2, 3))
    _unused = ops.exp(x)
    loss = x.sum(axis=1).mean()
    g = t.graph(loss)
    assert [n.op for n in g.nodes] == ["sum", "mean"]  # the unused exp is not in the graph
    assert dict(g.nodes[0].attrs) == {"axis": 1.0, "keepdims": False}
    assert float(loss.value) == pytest.approx(7.5)
    assert verify(validate(g)).passed


def test_unknown_values_refuse_control_flow():
    t = Tracer()
    y = ops.softmax(t.param("x", [1.0, 2.0]))  # no trace-time evaluation for this op
    with pytest.raises(TracerError, match="not known at trace time"):
        bool(y > 0)
    assert verify(validate(t.graph(y.sum()))).passed  # it still traces and verifies


def test_tracer_op_names_are_registry_ops():
    assert set(_EAGER) <= set(REGISTRY)


def test_names_must_be_unique():
    t = Tracer()
    t.param("x", 1.0)
    with pytest.raises(TracerError, match="already used"):
        t.input("x", 2.0)


@pytest.mark.parametrize("suffix", [".json", ".pb"])
def test_graph_files_round_trip(tmp_path, suffix):
    t = Tracer("io")
    g = t.graph((t.param("w", [1.0, 2.0]) * 2.0).sum())
    path = save_graph(g, tmp_path / f"g{suffix}")
    assert load_graph(path) == g


def test_bad_graph_file_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "bad.pb").write_bytes(b"\xff\xff\xff")
    with pytest.raises(GraphFileError, match=r"bad\.pb: not a valid gradcheck.v1.Graph \(pb\)"):
        load_graph(tmp_path / "bad.pb")


@pytest.mark.parametrize("name", sorted(_EAGER))
def test_trace_time_values_match_the_engine_forward(name, rng):
    """The tracer's NumPy twin of an op (used only for branching at trace time) computes what the
    engine computes, on the op's own test points."""
    from gradcheck_svc.backend import get_backend
    from gradcheck_svc.engine import Program, forward, prepare_feeds
    from gradcheck_svc.verify.audit import mask_shape

    backend = get_backend("cpu")
    for case in REGISTRY[name].cases(rng):
        t = Tracer(name)
        xs = [t.input(f"in{i}", np.asarray(x)) for i, x in enumerate(case.inputs)]  # where's condition is bool
        y = ops.__getattr__(name)(*xs, name="y", **case.attrs)
        if mask_shape(REGISTRY[name], case) is not None:  # a bool mask: its loss reads it through where
            ones = t.input("ones", np.ones(y.shape))
            loss = ops.where(y, ones, -ones).sum()
        else:
            loss = y.sum()
        program = Program(validate(t.graph(loss), require_parameters=False), np.float64)  # a forward only
        values = forward(program, backend, prepare_feeds(program, backend), grad=False, keep_values=True).values
        np.testing.assert_allclose(y.value, values["y"], rtol=1e-12, atol=1e-12, err_msg=f"{name} {case.attrs}")
