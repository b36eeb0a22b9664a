"""The tracer refuses rather than lies: every silent idiom that would trace a different function raises
a TracerError naming the user's line and the fix, or (aliasing) gives NumPy's own answer."""
from __future__ import annotations

import math

import numpy as np
import pytest

import gradcheck_svc
from gradcheck_client import Tracer
from gradcheck_core.trace_errors import TracerError

X = np.array([0.3, -0.7, 1.1])


def _freeze_float(x):
    return np.sum(x * float(x[0]))


def _freeze_numpy_scalar(x):
    return np.sum(x * np.float64(x[0]))


def _freeze_math(x):
    return np.sum(x) * math.exp(x[1])


def _freeze_setitem(x):
    out = np.zeros(3)
    out[0] = x[0]
    return np.sum(out * x)


def _freeze_slice_setitem(x):
    out = np.zeros(3)
    out[:2] = x[:2]
    return np.sum(out * x)


def _freeze_asarray(x):
    return np.sum(np.asarray(x) * 2)


def _freeze_array_list(x):
    return np.sum(np.array([x[0], x[1]]))


def _freeze_ndarray_inplace(x):
    acc = np.zeros(3)
    acc += x
    return np.sum(acc * x)


def _freeze_out(x):
    buf = np.empty(3)
    np.multiply(x, 2.0, out=buf)
    return np.sum(buf)


def _freeze_int(x):
    return np.sum(x[: int(x[2])])


def _freeze_item(x):
    return np.sum(x) * x[0].item()


def _freeze_tolist(x):
    return np.sum(np.array(x.tolist()) * x)


@pytest.mark.parametrize("f", [_freeze_float, _freeze_numpy_scalar, _freeze_math, _freeze_setitem,
                               _freeze_slice_setitem, _freeze_asarray, _freeze_array_list,
                               _freeze_ndarray_inplace, _freeze_out, _freeze_int, _freeze_item, _freeze_tolist])
def test_freezing_a_traced_value_is_refused_naming_the_line_and_the_fix(f):
    with pytest.raises(TracerError) as err:
        gradcheck_svc.check(f, X)
    message = str(err.value)
    assert "test_tracer_refusals.py:" in message  # the user's line, with its code
    assert "t.constant" in message  # the fix for a constant really meant
    assert "float() or .value" not in message  # the old advice, the very trap, is gone


def _aliased(x):
    y = x
    y += 1.0  # changes x too, in NumPy
    y *= 2.0
    return np.sum(x * x)


def _copied(x):
    y = x.copy()
    y += 1.0  # x is unchanged
    z = +x
    z -= 5.0
    return np.sum(x * y * z)


@pytest.mark.parametrize("f", [_aliased, _copied])
def test_in_place_operators_follow_numpy_aliasing(f):
    plain = f(X.copy())
    report = gradcheck_svc.check(f, X.copy(), fd_mode="full")
    assert report.passed, report.text
    assert report.loss == pytest.approx(plain, rel=1e-14)  # NumPy's own loss value
    h, grad = 1e-6, np.zeros(3)
    for i in range(3):
        e = np.eye(3)[i] * h
        grad[i] = (f(X + e) - f(X - e)) / (2 * h)
    np.testing.assert_allclose(report.parameters["x"].gradient, grad, rtol=1e-7)


def _write_through_view(x):
    v = x[:2]
    v += 1.0  # NumPy writes into x
    return np.sum(x)


def _write_base_under_view(x):
    v = x[1:]
    x *= 2.0  # NumPy's v sees it
    return np.sum(v)


def _setitem_traced(x):
    x[0] = 0.0
    return np.sum(x)


@pytest.mark.parametrize("f, match", [(_write_through_view, "a view of"), (_write_base_under_view, "while a view"),
                                      (_setitem_traced, "assignment into the traced value")])
def test_writes_through_views_are_refused(f, match):
    with pytest.raises(TracerError, match=match):
        gradcheck_svc.check(f, X.copy())


def test_trace_time_checks_of_what_the_server_would_refuse():
    t = Tracer()
    w = t.param("w", 3)  # an int parameter is taken as float: its gradient is checked
    assert w.value.dtype == np.float64
    with pytest.raises(TracerError, match="needs float data"):
        t.param("b", np.array([True, False]))
    with pytest.raises(TracerError, match="needs float data"):
        t.param("k", [1, 2], dtype="int64")
    with pytest.raises(TracerError, match=r"the loss must be a scalar, got shape \[3\]: reduce it"):
        t.graph(t.param("v", X) * 2)
    with pytest.raises(TracerError, match="the loss must be a value traced"):
        t.graph(1.0)
    # NumPy's tile pads reps (or the array) with leading ones; the op takes one count per axis
    for reps in (2, (2, 1), (3, 1, 2)):
        report = gradcheck_svc.check(lambda x, reps=reps: np.tile(x, reps), np.arange(6.0).reshape(2, 3) / 7)
        assert report.passed and report.data["check"]["output_shape"] == list(np.tile(np.ones((2, 3)), reps).shape)


def test_constant_is_the_explicit_way_to_freeze():
    from gradcheck_core.tracer import constant

    report = gradcheck_svc.check(lambda x: np.sum(x * constant(x[0])), X)
    np.testing.assert_allclose(report.parameters["x"].gradient, np.full(3, X[0]), rtol=1e-15)  # no d/dx[0] term


def test_numpy_keeps_the_refusal_as_the_cause_outside_check():
    t = Tracer()
    x = t.param("x", X)
    out = np.zeros(3)
    with pytest.raises(ValueError) as err:
        out[0] = x[0]  # NumPy wraps the refusal: "setting an array element with a sequence"
    assert isinstance(err.value.__cause__, TracerError) and "t.constant" in str(err.value.__cause__)


def _scalar_copy_then_update(x):
    first = x[0]  # a NumPy scalar: a copy, not a view
    flat = x.flatten()  # a copy too
    x *= 3.0
    return np.sum(x) * first + np.sum(flat)


def test_copies_are_not_views():
    plain = _scalar_copy_then_update(X.copy())
    report = gradcheck_svc.check(_scalar_copy_then_update, X.copy())
    assert report.passed and report.loss == pytest.approx(plain, rel=1e-14)
