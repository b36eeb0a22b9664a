"""The NumPy people write: each function and ndarray method traced and verified, its gradient equal to
central differences of the plain NumPy function (float64) within 1e-7 relative, at several shapes and axes."""
from __future__ import annotations

import numpy as np
import pytest

import gradcheck_svc

R = np.random.default_rng(7)


def _a(*shape, lo=-1.5, hi=1.5):
    return R.uniform(lo, hi, size=shape)


def _pos(*shape):
    return R.uniform(0.3, 2.0, size=shape)


def _matrix(n):
    return R.uniform(-0.3, 0.3, size=(n, n)) + 2.0 * np.eye(n)


CASES = {
    "prod": (lambda x: np.prod(x), [_a(4)]),
    "prod_axis": (lambda x: np.prod(x, axis=1, keepdims=True), [_a(2, 3, 2)]),
    "prod_zero": (lambda x: np.prod(x, axis=0), [np.array([[0.0, 1.5], [2.0, 0.0], [0.7, -1.2]])]),
    "var": (lambda x: np.var(x), [_a(5)]),
    "var_axis_ddof": (lambda x: np.var(x, axis=0, ddof=1), [_a(4, 3)]),
    "std": (lambda x: np.std(x, axis=(0, 2), keepdims=True), [_a(3, 2, 4)]),
    "tan": (np.tan, [_a(3, 2, lo=-1.2, hi=1.2)]),
    "arctan": (np.arctan, [_a(4)]),
    "arctan2": (np.arctan2, [_a(3), _pos(3)]),
    "sinh": (np.sinh, [_a(4)]),
    "cosh": (np.cosh, [_a(2, 2)]),
    "log2": (np.log2, [_pos(3)]),
    "log10": (np.log10, [_pos(3)]),
    "expm1": (np.expm1, [_a(4)]),
    "exp2": (np.exp2, [_a(3)]),
    "logaddexp": (np.logaddexp, [_a(4), _a(4)]),
    "sign": (lambda x: np.sign(x) * x, [_a(5)]),
    "reciprocal": (np.reciprocal, [_pos(3)]),
    "fabs": (np.fabs, [_a(4)]),
    "floor": (lambda x: np.floor(x) + x * x, [np.array([0.3, 1.4, -0.6])]),
    "ceil": (lambda x: np.ceil(x) * x, [np.array([0.3, 1.4, -0.6])]),
    "degrees": (np.degrees, [_a(3)]),
    "cumsum": (lambda x: np.cumsum(x), [_a(2, 3)]),
    "cumsum_axis": (lambda x: np.cumsum(x, axis=0), [_a(3, 2)]),
    "cumsum_long": (lambda x: np.cumsum(x, axis=-1), [_a(2, 11)]),
    "dot_vv": (np.dot, [_a(3), _a(3)]),
    "dot_mm": (np.dot, [_a(2, 3), _a(3, 4)]),
    "dot_nd": (np.dot, [_a(2, 3), _a(2, 3, 2)]),
    "outer": (np.outer, [_a(3), _a(2)]),
    "tensordot": (lambda a, b: np.tensordot(a, b, axes=([1, 0], [0, 1])), [_a(2, 3, 2), _a(3, 2, 4)]),
    "tensordot_int": (lambda a, b: np.tensordot(a, b, axes=1), [_a(2, 3), _a(3, 2)]),
    "einsum_mm": (lambda a, b: np.einsum("ij,jk->ik", a, b), [_a(2, 3), _a(3, 2)]),
    "einsum_batch": (lambda a, b: np.einsum("bij,bjk->bik", a, b), [_a(2, 2, 3), _a(2, 3, 2)]),
    "einsum_implicit": (lambda a, b: np.einsum("i,j", a, b), [_a(3), _a(2)]),
    "einsum_sum": (lambda a: np.einsum("ij->j", a), [_a(3, 2)]),
    "einsum_transposed_out": (lambda a, b: np.einsum("bij,bkj->kbi", a, b), [_a(2, 3, 4), _a(2, 2, 4)]),
    "einsum_lone_letter": (lambda a, b: np.einsum("ijz,jk->ki", a, b), [_a(2, 3, 2), _a(3, 2)]),
    "einsum_three": (lambda a, b, c: np.einsum("ij,jk,k->i", a, b, c), [_a(2, 3), _a(3, 2), _a(2)]),
    "trace": (np.trace, [_a(3, 3)]),
    "trace_offset": (lambda a: np.trace(a, offset=1), [_a(3, 4)]),
    "diag_1d": (lambda v: np.diag(v, k=1), [_a(3)]),
    "diag_1d_main": (np.diag, [_a(3)]),
    "diag_1d_below": (lambda v: np.diag(v, k=-2) * np.arange(25.0).reshape(5, 5), [_a(3)]),
    "diag_2d": (lambda m: np.diag(m, k=-1), [_a(3, 3)]),
    "flip": (lambda x: np.flip(x, axis=1), [_a(2, 3)]),
    "flip_all": (np.flip, [_a(2, 3)]),
    "roll": (lambda x: np.roll(x, 2, axis=1), [_a(2, 4)]),
    "roll_flat": (lambda x: np.roll(x, -1), [_a(2, 3)]),
    "rot90": (np.rot90, [_a(2, 3)]),
    "rot90_k3": (lambda x: np.rot90(x, 3), [_a(2, 3)]),
    "triu": (np.triu, [_a(3, 3)]),
    "tril": (lambda x: np.tril(x, -1), [_a(3, 4)]),
    "clip": (lambda x: np.clip(x, -0.5, 0.7), [np.array([-1.0, -0.2, 0.3, 1.2])]),
    "clip_array": (lambda x, lo: np.clip(x, lo, None), [np.array([-1.0, 0.3, 1.2]), np.array([0.0, 0.1, 0.2])]),
    "repeat": (lambda x: np.repeat(x, 2, axis=0), [_a(2, 3)]),
    "repeat_flat": (lambda x: np.repeat(x, [1, 2, 0]), [_a(3)]),
    "pad": (lambda x: np.pad(x, 1), [_a(2, 3)]),
    "pad_reflect": (lambda x: np.pad(x, ((1, 0), (2, 1)), mode="reflect"), [_a(3, 4)]),
    "sort": (lambda x: np.sort(x) * np.arange(1.0, 5.0), [_a(3, 4)]),
    "sort_axis0": (lambda x: np.sort(x, axis=0)[0], [_a(3, 2)]),
    "split": (lambda x: np.split(x, 2, axis=1)[1] * np.split(x, 2, axis=1)[0], [_a(2, 4)]),
    "array_split": (lambda x: np.array_split(x, [1, 3])[1], [_a(5)]),
    "stack": (lambda a, b: np.stack([a, b], axis=1), [_a(2, 3), _a(2, 3)]),
    "hstack": (lambda a, b: np.hstack([a, b]), [_a(2, 3), _a(2, 1)]),
    "vstack": (lambda a, b: np.vstack([a, b]), [_a(3), _a(3)]),
    "tile": (lambda x: np.tile(x, (2, 1)), [_a(3)]),
    "norm": (np.linalg.norm, [_a(4)]),
    "norm_fro": (np.linalg.norm, [_a(2, 3)]),
    "norm_axis": (lambda x: np.linalg.norm(x, axis=1), [_a(3, 2)]),
    "norm_1": (lambda x: np.linalg.norm(x, ord=1), [np.array([0.5, -1.2, 0.8])]),
    "inv": (np.linalg.inv, [_matrix(3)]),
    "det": (np.linalg.det, [_matrix(3)]),
    "solve": (np.linalg.solve, [_matrix(3), _a(3, 2)]),
    "solve_vector": (np.linalg.solve, [_matrix(2), _a(2)]),
    # NumPy's argument forms the server's schema spells otherwise: a scalar for a list, a tuple of axes
    "reshape_scalar": (lambda x: np.reshape(x, -1) * np.arange(6.0), [_a(2, 3)]),
    "broadcast_to_scalar": (lambda x: np.broadcast_to(x, 4) * np.arange(4.0), [_a(1)]),
    "expand_dims_tuple": (lambda x: np.expand_dims(x, (0, 3)) * np.arange(3.0).reshape(1, 1, 3, 1), [_a(2, 3)]),
    # ndarray methods, abs(), unary +
    "method_squeeze": (lambda x: (x * 2).squeeze(), [_a(1, 3, 1)]),
    "method_ravel": (lambda x: x.ravel() * np.arange(6.0), [_a(2, 3)]),
    "method_flatten": (lambda x: x.flatten() ** 2, [_a(3, 2)]),
    "method_astype": (lambda x: x.astype(np.float64) * 3, [_a(3)]),
    "method_copy": (lambda x: x.copy() * x, [_a(3)]),
    "method_var_std_prod": (lambda x: x.var(axis=0) + x.std() + x.prod(axis=1).sum(), [_a(2, 3)]),
    "method_cumsum_dot": (lambda x: x.cumsum(axis=1).dot(np.ones(3)), [_a(2, 3)]),
    "abs": (lambda x: abs(x), [_a(4)]),
    "positive": (lambda x: +x * x, [_a(3)]),
}


def _central(f, args, c, i, h=1e-6):
    base = args[i].astype(np.float64)
    grad = np.zeros_like(base)
    for k in np.ndindex(base.shape):
        up, down = base.copy(), base.copy()
        up[k] += h
        down[k] -= h
        plus = [up if j == i else a for j, a in enumerate(args)]
        minus = [down if j == i else a for j, a in enumerate(args)]
        grad[k] = (np.sum(np.asarray(f(*plus)) * c) - np.sum(np.asarray(f(*minus)) * c)) / (2 * h)
    return grad


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_gradient_equals_central_differences_of_numpy(name):
    f, args = CASES[name]
    report = gradcheck_svc.check(f, *args, seed=1, symbolic=False)
    assert report.passed, report.text
    out = np.asarray(f(*args))
    c = np.random.default_rng(1).standard_normal(out.shape) if out.size != 1 else 1.0
    assert report.loss == pytest.approx(float(np.sum(out * c)), rel=1e-12, abs=1e-12)  # NumPy's own value
    for i, p in enumerate(report.parameters):
        fd = _central(f, args, c, i)
        scale = max(np.max(np.abs(fd)), 1e-3)
        np.testing.assert_allclose(p.gradient, fd, rtol=1e-7, atol=1e-7 * scale, err_msg=f"{name} {p.name}")
