"""pow at a == 0 follows PyTorch's convention: d/da a**0 = 0, d/db 0**b = 0 for b >= 0 (not NaN)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.graph import load_graph
from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.engine_run import run_engine


def _graph(a, b):
    g = GraphBuilder("pow0")
    y = g.node("pow", g.input("a", a, requires_grad=True), g.input("b", b, requires_grad=True), name="y")
    g.output(g.node("sum", y, name="L"))
    return load_graph(g.build())


@pytest.mark.parametrize("a, b", [
    ([0.0, 0.0, 0.0, 2.0, 0.0], [0.0, 2.0, 0.5, 0.0, 1.0]),  # x**0 at 0, 0**y for y >= 0, x**0 away from 0
    ([0.0, 3.0, -2.0], [0.0, 0.0, 2.0]),
])
def test_pow_gradients_at_zero_equal_torch(a, b):
    a, b = np.array(a), np.array(b)
    run = run_engine(_graph(a, b), VerifyOptions(), "float64")
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    torch.pow(ta, tb).sum().backward()
    np.testing.assert_array_equal(run.gradients["a"], ta.grad.numpy())
    np.testing.assert_array_equal(run.gradients["b"], tb.grad.numpy())
    # no NaN where a >= 0 (log(-2) is NaN, in torch too)
    assert not np.isnan(run.gradients["a"]).any() and not np.isnan(run.gradients["b"][a >= 0]).any()


def test_pow_names_its_kink():
    (kink,) = REGISTRY["pow"].kinks
    assert "a == 0" in kink.where and "PyTorch" in kink.convention


def test_x_squared_at_zero_verifies():
    report = verify(_graph(np.array([0.0, 1.5]), np.array([2.0, 2.0])), VerifyOptions())
    assert np.isfinite(report.parameters[1].gradient).all()
    np.testing.assert_array_equal(report.parameters[0].gradient, [0.0, 3.0])


def test_checks_at_zero_pass_with_the_symbolic_oracle():
    """The symbolic reference follows the same convention (its formula carries it), so these verify."""
    import gradcheck_svc

    x0 = np.array([0.0, 1.5])
    report = gradcheck_svc.check(lambda x: np.sum(x ** 0.0 + x ** 2.0 + x ** 1.0), x0)
    assert report.passed, report.text
    assert report.data["parameters"][0]["verdict_reference"] == "symbolic"
    np.testing.assert_array_equal(report.parameters["x"].gradient, [1.0, 4.0])
    # (for 0 < y < 1 the slope in the base is infinite at 0, and SymPy's d/dy there is NaN: not checked here)
    report = gradcheck_svc.check(lambda y, base: np.sum(np.power(base, y)), np.array([0.0, 2.0, 1.0]), np.zeros(3),
                                 wrt="y")
    assert report.passed, report.text
    np.testing.assert_array_equal(report.parameters["y"].gradient, [0.0, 0.0, 0.0])
