"""pow at a == 0 follows PyTorch's convention: d/da a**0 = 0, d/db 0**b = 0 for b >= 0 (not NaN)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

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


def test_symbolic_nan_at_the_kink_is_a_note_when_fd_and_the_engine_agree():
    """0**y for 0 < y < 1: d/dy is 0 * log(0), NaN in SymPy; the engine, finite differences and torch give 0.
    The kink note's "not a failure" is the verdict: PASS, the row "ok (kink)" in text and JSON alike."""
    import gradcheck_svc

    y, base = np.array([0.5, 0.3, 2.0, 0.7]), np.array([0.0, 0.0, 0.0, 1.5])
    report = gradcheck_svc.check(lambda y, base: np.sum(np.power(base, y)), y, base, wrt="y", fd_mode="full")
    assert report.passed, report.text
    row = report.parameters["y"]
    assert row.status == "ok (kink)" and row.data["explained_by"] == "nondifferentiable_point"
    assert row.data["symbolic"]["gradient"][:2] == ["NaN", "NaN"]  # SymPy's, at the two kink elements
    assert row.data["symbolic"]["gradient"][2] == 0.0  # 0**2: defined, and it agrees
    [note] = [f for f in report.data["findings"] if f["cause"] == "nondifferentiable_point"]
    assert note["severity"] == "warning" and "the symbolic reference is NaN there for y" in note["detail"]
    assert note["detail"].endswith("not a failure")
    [line] = [ln for ln in report.text.splitlines() if ln.strip().startswith("y ")]
    assert "ok (kink)" in line
    yt = torch.tensor(y, requires_grad=True)
    torch.pow(torch.tensor(base), yt).sum().backward()
    np.testing.assert_array_equal(row.gradient, yt.grad.numpy())  # 0 at the kink, 1.5**0.7 log 1.5 beside it
    np.testing.assert_allclose(row.reference, yt.grad.numpy(), atol=1e-8)  # finite differences agree


def test_a_nan_symbolic_reference_excuses_nothing_when_finite_differences_disagree():
    """The same kink with the base a parameter too: d/dbase is infinite at 0 for 0 < y < 1 (torch: inf), where
    finite differences cannot agree with the engine: no excuse, the check fails."""
    import gradcheck_svc

    report = gradcheck_svc.check(lambda y, base: np.sum(np.power(base, y)), np.array([0.5, 2.0]),
                                 np.array([0.0, 1.5]), fd_mode="full")
    assert not report.passed
    assert report.parameters["base"].status == "FAIL"
