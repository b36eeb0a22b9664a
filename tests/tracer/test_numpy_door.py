"""The NumPy door's edges (issue 44): each traced as NumPy computes it (the faithful check holds the trace's
output to NumPy's own) or refused in one line naming the user's line -- never a traceback or a false FAIL."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gradcheck_svc
from gradcheck_core.trace_errors import TracerError

R = np.random.default_rng(44)
X = R.uniform(-1, 1, 6)
STACK = R.uniform(-1, 1, (2, 3, 3)) + 3 * np.eye(3)


def _grad(report, name):
    return np.asarray(report.parameters[name].gradient, dtype=np.float64)


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "fd-only"])
def test_clip_with_a_min_above_a_max_is_all_a_max_and_passes(symbolic):
    """NumPy allows it: minimum(maximum(x, 0.5), -0.2) is -0.2 everywhere, gradient 0 (finite differences
    froze the elements between the bounds on the wrong piece: 'rule_error 0 vs 1.28' with symbolic off)."""
    report = gradcheck_svc.check(lambda x: np.clip(x, 0.5, -0.2) * np.arange(1.0, 7.0), X, symbolic=symbolic)
    assert report.verdict == "pass", report.text
    assert np.array_equal(_grad(report, "x"), np.zeros(6))


def _refused(f, *args, words=()):
    with pytest.raises(TracerError) as info:
        gradcheck_svc.check(f, *args)
    message = str(info.value)
    assert "\n" not in message and "test_numpy_door.py:" in message, message  # one line, the user's line
    assert all(w in message for w in words), message
    return message


def test_var_with_ddof_of_the_whole_length_is_refused_in_one_line():
    _refused(lambda x: np.var(x, ddof=len(x)), X, words=("numpy.var", "ddof=6", "6 element"))
    report = gradcheck_svc.check(lambda x: np.var(x, ddof=len(x) - 1), X)  # one degree of freedom: fine
    assert report.verdict == "pass", report.text


def test_stacked_inv_det_and_solve_are_traced_matrix_by_matrix_as_torch_differentiates_them():
    m = torch.tensor(STACK, requires_grad=True)
    for f, tf in [(lambda a: np.linalg.inv(a), torch.linalg.inv), (lambda a: np.linalg.det(a), torch.linalg.det),
                  (lambda a: np.linalg.solve(a, np.arange(3.0)),
                   lambda a: torch.linalg.solve(a, torch.arange(3.0, dtype=torch.float64))),
                  (lambda a: np.linalg.solve(a, np.ones((2, 3, 2))),
                   lambda a: torch.linalg.solve(a, torch.ones((2, 3, 2), dtype=torch.float64)))]:
        report = gradcheck_svc.check(lambda a: (f(a) * np.linspace(0.5, 1.5, f(STACK).size).reshape(f(STACK).shape)).sum(),
                                     STACK)
        assert report.verdict == "pass", report.text
        w = torch.linspace(0.5, 1.5, f(STACK).size, dtype=torch.float64).reshape(f(STACK).shape)
        (expected,) = torch.autograd.grad((tf(m) * w).sum(), m)
        assert np.allclose(_grad(report, "a"), expected.numpy(), rtol=1e-8, atol=1e-10)
    # a b NumPy itself rejects for a stack: refused in one line
    _refused(lambda a: np.linalg.solve(a, np.ones((2, 3))), STACK, words=("numpy.linalg.solve",))


def test_reflect_padding_wider_than_the_axis_is_numpys():
    """NumPy reflects the padded array again, in rounds; so does the trace (its output held to NumPy's)."""
    w = R.uniform(-1, 1, np.pad(X.reshape(2, 3), ((3, 5), (7, 2)), mode="reflect").shape)
    report = gradcheck_svc.check(lambda x: (np.pad(x.reshape(2, 3), ((3, 5), (7, 2)), mode="reflect") * w).sum(), X)
    assert report.verdict == "pass", report.text
    # torch's reflect pad is limited to less than the axis: the exact gradient by counting where each element lands
    idx = np.pad(np.arange(6).reshape(2, 3), ((3, 5), (7, 2)), mode="reflect")
    expected = np.bincount(idx.reshape(-1), weights=w.reshape(-1), minlength=6)
    assert np.allclose(_grad(report, "x"), expected, rtol=1e-9, atol=1e-12)


def test_floor_division_and_remainder_are_numpys():
    c = np.arange(1.0, 7.0)
    report = gradcheck_svc.check(lambda x: ((x // 0.3) * c).sum() + ((x % 0.3) * c).sum() + (2.0 % (x + 3)).sum(), X)
    assert report.verdict == "pass", report.text
    # d/dx floor(x / c) = 0, d/dx (x - c floor(x / c)) = 1, d/dx (2 - (x + 3) floor(2 / (x + 3))) = -floor(2 / (x + 3))
    assert np.allclose(_grad(report, "x"), c - np.floor(2.0 / (X + 3)), rtol=1e-9, atol=1e-9)


def test_real_is_the_array_and_view_is_refused_in_one_line():
    report = gradcheck_svc.check(lambda x: (x.real * x).sum(), X)
    assert report.verdict == "pass", report.text
    assert np.allclose(_grad(report, "x"), 2 * X, rtol=1e-9)
    _refused(lambda x: (x.view() * 2).sum(), X, words=("x.view()",))


def test_a_quotient_rounding_onto_an_integer_is_refused_not_traced_as_another_function():
    """0.5 // 0.1 is 4.0 in NumPy (by fmod) and floor(0.5 / 0.1) is 5.0: that element would be another function."""
    _refused(lambda x: (0.5 // x).sum(), np.array([0.1, 0.3, 0.7]), words=("//", "floor_divide"))
    _refused(lambda x: (0.5 % x).sum(), np.array([0.1, 0.3, 0.7]), words=("%",))
