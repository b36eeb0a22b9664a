"""Issue 34 item 1: the traced function is NumPy's function, or the call is refused.

The eight mis-traces that passed for a function NumPy does not compute, each now NumPy's (its loss and its
gradient are those of f on NumPy arrays); then the guard that catches the class: check() runs f on NumPy
copies too and refuses a trace whose output, in-place-updated arguments or engine loss differ -- shown on
planted mis-traces (the old compositions put back), in process and through a real server."""
from __future__ import annotations

import numpy as np
import pytest

import gradcheck_client
import gradcheck_svc
from gradcheck_core import numpy_compose
from gradcheck_core.trace_errors import TracerError
from grpc_helpers import module_server

X = np.array([0.3, -1.2, 0.8, 1.7, -0.4, 0.9])
M = X.reshape(2, 3)
W = np.arange(1.0, 7.0)


def _roll_n_then_update(x):
    y = np.roll(x, 6)  # a new array in NumPy, though every element is where it was
    y += 1.0
    return x * W + y


def _cumsum_one_then_update(x):
    y = np.cumsum(x, axis=1)  # along an axis of length 1: still a new array
    y *= 3.0
    return x * W.reshape(6, 1) + y


def _rot90_0_then_update(m):
    y = np.rot90(m, 0)  # NumPy's m[:]: updating y updates m
    y += 1.0
    return m * W.reshape(2, 3)


def _rot90_4_then_update(m):
    y = np.rot90(m, 4)
    y *= 2.0
    return m * W.reshape(2, 3)


def _astype_same_then_update(x):
    y = x.astype(float, copy=False)  # the same array
    y += 1.0
    return x * W


def _astype_copy_then_update(x):
    y = x.astype(float)  # a copy
    y += 1.0
    return x * W + y


CASES = {
    "roll tuple shift, one axis": (lambda x: np.roll(x, (1, 2), axis=0) * W, X),
    "roll list shift, one axis": (lambda x: np.roll(x, [2, -3, 4], axis=[0, 0, 0]) * W, X),
    "roll tuple shift, axis=None": (lambda m: np.roll(m, (1, 2)) * W.reshape(2, 3), M),
    "roll shifts on two axes": (lambda m: np.roll(m, (1, -1), axis=(0, 1)) * W.reshape(2, 3), M),
    "split negative index": (lambda x: np.split(x, [-1])[0] * W[:5], X),
    "array_split negative indices": (lambda x: np.array_split(x, [-4, -1])[1] * W[:3], X),
    "array_split decreasing indices": (lambda x: np.array_split(x, [4, 2])[2] * W[:4], X),
    "roll by n, then in place": (_roll_n_then_update, X),
    "cumsum along length 1, then in place": (_cumsum_one_then_update, X.reshape(6, 1)),
    "rot90 k=0, then in place": (_rot90_0_then_update, M),
    "rot90 k=4, then in place": (_rot90_4_then_update, M),
    "astype copy=False, then in place": (_astype_same_then_update, X),
    "astype copy, then in place": (_astype_copy_then_update, X),
}


def _numpy_loss(f, x, seed):
    out = np.asarray(f(x.copy()))
    c = np.random.default_rng(seed).standard_normal(out.shape) if out.size != 1 else 1.0
    return float(np.sum(out * c)), c


def _numpy_gradient(f, x, c, h=1e-6):
    g = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[k] += h
        down[k] -= h
        g[k] = (np.sum(f(up) * c) - np.sum(f(down) * c)) / (2 * h)
    return g


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_former_mis_trace_is_numpys_function(case):
    f, x = CASES[case]
    report = gradcheck_svc.check(f, x.copy(), seed=2, symbolic=False)
    assert report.passed, report.text
    loss, c = _numpy_loss(f, x, 2)
    assert report.loss == pytest.approx(loss, rel=1e-13, abs=1e-13)
    np.testing.assert_allclose(report.parameters[0].gradient, _numpy_gradient(f, x, c), rtol=1e-7, atol=1e-8)


# --- the guard ------------------------------------------------------------------------------------------


def _first_shift_only_roll(t, a, shift, axis=None):
    """The old mis-trace: a tuple shift on one axis rolled by its first element."""
    shift = shift[0] if isinstance(shift, (tuple, list)) else shift
    x = t._lift(a)
    n = x.shape[0]
    s = shift % n
    return t.apply("concat", x[n - s:], x[:n - s], axis=0) if s else x


def _input_returning_roll(t, a, shift, axis=None):
    """The old aliasing mis-trace: a roll by a multiple of n returned its input itself."""
    return t._lift(a)


def _one_step_short_cumsum(t, a, axis=None, dtype=None, out=None):
    """A cumsum that stops a doubling step early: its pad op has no trace-time value, so only the engine's
    loss can show it."""
    x = t._lift(a)
    head = x[: x.shape[0] - 1]
    return x + t.apply("pad", head, pads=[1, 0])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def _both(f, x, server):
    """check() in process, then through the server: the two errors (each must be a refusal)."""
    errors = []
    for run in (lambda: gradcheck_svc.check(f, x.copy()),
                lambda: gradcheck_client.check(f, x.copy(), server=server.target)):
        with pytest.raises(TracerError) as err:
            run()
        errors.append(str(err.value))
    return errors


def test_a_planted_mis_trace_of_the_output_is_refused_naming_it(monkeypatch, server):
    monkeypatch.setitem(numpy_compose.COMPOSED, np.roll, _first_shift_only_roll)
    for message in _both(lambda x: np.roll(x, (1, 2), axis=0) * W, X, server):
        assert "\n" not in message
        assert message.startswith("check refused: the traced graph does not compute f: its output differs")
        # the first differing element, with both values: NumPy's x rolled by 3, the trace's by 1
        assert f"at index [0] NumPy gives {np.roll(X, 3)[0]:.17g}, the traced graph {np.roll(X, 1)[0]:.17g}" \
            in message


def test_a_planted_aliasing_mis_trace_is_refused_by_the_argument_after_the_call(monkeypatch, server):
    monkeypatch.setitem(numpy_compose.COMPOSED, np.roll, _input_returning_roll)

    def shifted(x):
        y = np.roll(x, 6)
        y += 1.0  # NumPy: a copy, x unchanged; the planted trace: x itself
        return np.sum(y * W)

    for message in _both(shifted, X, server):
        assert "argument 'x' after the call (updated in place) differs" in message
        assert f"NumPy gives {X[0]:.17g}, the traced graph {X[0] + 1:.17g}" in message


def test_a_planted_mis_trace_without_trace_time_values_is_refused_by_the_engines_loss(monkeypatch, server):
    monkeypatch.setitem(numpy_compose.COMPOSED, np.cumsum, _one_step_short_cumsum)
    f = lambda x: np.cumsum(x) * W  # noqa: E731
    for message in _both(f, X, server):
        assert "\n" not in message and "the engine's loss is" in message
        c = np.random.default_rng(0).standard_normal(6)
        assert f"f's own on NumPy arrays {float(np.sum(np.cumsum(X) * W * c)):.17g}" in message


def test_a_function_that_is_not_deterministic_is_refused_and_random_draws_inside_f_are_not():
    rng = np.random.default_rng(5)  # outside f: the two runs draw different numbers
    with pytest.raises(TracerError, match=r"its output differs.*not deterministic"):
        gradcheck_svc.check(lambda x: x * rng.standard_normal(6), X)
    # the global generator starts both runs from the same state, and ends where one call leaves it
    np.random.seed(3)
    report = gradcheck_svc.check(lambda x: x * np.random.standard_normal(6), X)
    assert report.passed, report.text
    np.random.seed(3)
    mask = np.random.standard_normal(6)
    after_one_call = np.random.standard_normal()
    np.random.seed(3)
    gradcheck_svc.check(lambda x: x * np.random.standard_normal(6), X)
    assert np.random.standard_normal() == after_one_call
    c = np.random.default_rng(0).standard_normal(6)
    assert report.loss == pytest.approx(float(np.sum(X * mask * c)), rel=1e-14)


def test_in_place_updates_of_arguments_are_compared_and_the_callers_arrays_are_untouched():
    x, k = X.copy(), np.array([1, 2, 3, 4, 5, 6])

    def f(x, k):
        x *= 2.0  # the argument, updated in place (both runs), then used
        k += 1  # a plain int array: the caller's stays as it was
        return x * k

    report = gradcheck_svc.check(f, x, k)
    assert report.passed, report.text
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(k, [1, 2, 3, 4, 5, 6])
    c = np.random.default_rng(0).standard_normal(6)
    assert report.loss == pytest.approx(float(np.sum(2 * X * np.arange(2, 8) * c)), rel=1e-14)


def test_a_function_that_fails_on_numpy_arrays_is_refused_in_one_line():
    with pytest.raises(TracerError) as err:
        gradcheck_svc.check(lambda x: (x.named("h") * 2).sum(), X)  # the tracer's API only
    assert "\n" not in str(err.value)
    assert "f ran traced but fails on plain NumPy arrays (AttributeError" in str(err.value)
