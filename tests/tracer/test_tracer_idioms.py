"""Issue 34 item 5: the idioms users write trace as NumPy's functions, or fail in one line naming the fix.

The cross-entropy idiom logp[np.arange(n), y] (integer arrays on several axes) and boolean masks, with
gradients equal to torch's autograd of the same indexing; a traced boolean as an index and np.asarray()
of a traced value are refused naming what to write instead."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

import gradcheck_svc
from gradcheck_client import Tracer
from gradcheck_core.trace_errors import TracerError
from gradcheck_core.tracer import ops

R = np.random.default_rng(11)


def cross_entropy(z, y):
    m = np.max(z, axis=1, keepdims=True)
    logp = z - m - np.log(np.sum(np.exp(z - m), axis=1, keepdims=True))
    return -np.mean(logp[np.arange(len(y)), y])


def test_the_cross_entropy_idiom_has_torchs_loss_and_gradient():
    z, y = R.standard_normal((5, 4)), np.array([3, 0, 0, 2, 1])
    report = gradcheck_svc.check(cross_entropy, z, y)
    assert report.passed, report.text
    zt = torch.tensor(z, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(zt, torch.tensor(y))
    loss.backward()
    assert report.loss == pytest.approx(loss.item(), rel=1e-14)
    np.testing.assert_allclose(report.parameters["z"].gradient, zt.grad.numpy(), rtol=1e-12, atol=1e-15)


# keys on a (3, 4, 5) array: NumPy's placement of the broadcast axes (adjacent arrays in place, separated
# ones first), ints among arrays, slices beside them, masks over one or several axes
KEYS = {
    "two arrays, leading": (np.array([0, 2, 2]), np.array([1, 3, 0])),
    "two arrays, trailing": (slice(None), np.array([[0], [3]]), np.array([4, 0, 1])),
    "separated arrays": (np.array([1, 0]), slice(None), np.array([4, 4])),
    "int and array, separated": (1, slice(None), np.array([0, 0, 3])),
    "arrays beside a slice": (np.array([2, 0]), slice(1, 4), np.array([-1, 2])),
    "negative indices": (np.array([-1, -3]), np.array([-4, 0])),
    "mask over one axis": (slice(None), np.array([True, False, False, True])),
    "mask over two axes": (np.arange(12).reshape(3, 4) % 3 == 0,),
    "mask over all axes": (np.arange(60).reshape(3, 4, 5) % 7 == 2,),
}


@pytest.mark.parametrize("name", sorted(KEYS))
def test_array_and_mask_indexing_has_torchs_gradient(name):
    key = KEYS[name]
    x = R.standard_normal((3, 4, 5))
    want = x[key]
    c = R.standard_normal(want.shape)
    report = gradcheck_svc.check(lambda x: np.sum(x[key] * c), x)
    assert report.passed, report.text
    # torch gathers the elements NumPy's indexing picks (the positions an arange of x's size gives under the
    # same key: NumPy's placement rules, which torch's own indexing does not share for an int among arrays)
    picked = torch.tensor(np.arange(x.size).reshape(x.shape)[key])
    xt = torch.tensor(x, requires_grad=True)
    out = xt.reshape(-1)[picked]
    assert tuple(out.shape) == want.shape
    (out * torch.tensor(c)).sum().backward()
    assert report.loss == pytest.approx(float(np.sum(want * c)), rel=1e-13)
    np.testing.assert_allclose(report.parameters["x"].gradient, xt.grad.numpy(), rtol=1e-13, atol=1e-15)


def test_an_array_indexed_result_is_a_copy_in_place_updates_stay_its_own():
    x = R.standard_normal((3, 4))

    def f(x):
        y = x[np.arange(3), [0, 1, 2]]
        y += 1.0  # a new array in NumPy: x is unchanged
        return np.sum(x) + np.sum(y * y)

    report = gradcheck_svc.check(f, x)
    assert report.passed and report.loss == pytest.approx(f(x.copy()), rel=1e-14)


def test_a_traced_boolean_index_is_refused_naming_the_fix():
    t = Tracer()
    x = t.param("x", [0.5, -2.0, 1.0])
    mask = ops.greater(x, 0.0)  # a graph node, not a trace-time mask
    with pytest.raises(TracerError) as err:
        x[mask]
    assert "\n" not in str(err.value)
    assert f"indexing with the traced value '{mask.name}'" in str(err.value) and "x[x > 0]" in str(err.value)
    # the comparison is a trace-time mask: it selects
    assert x[x > 0].shape == (2,)


def test_np_asarray_of_a_traced_value_says_to_drop_the_call():
    with pytest.raises(TracerError) as err:
        gradcheck_svc.check(lambda x: np.sum(np.asarray(x) * 2), np.ones(3))
    message = str(err.value)
    assert "\n" not in message and "drop the call" in message and "np.asarray(x) -> x" in message
    assert "test_tracer_idioms.py:" in message  # the user's line


def test_a_traced_index_among_several_arrays_names_the_fix():
    t = Tracer()
    x, labels = t.param("x", np.ones((3, 4))), t.input("labels", np.array([0, 3, 2]))
    with pytest.raises(TracerError, match=r"index with the NumPy array itself \(logp\[np.arange\(n\), labels\]"):
        x[np.arange(3), labels]
    assert x[:, labels].shape == (3, 3)  # one traced index array on one axis: op 'take'
