"""compare()'s fast path for finite values gives exactly what the general rule gives."""
import dataclasses

import numpy as np
import pytest

from gradcheck_svc.verify.compare import Tolerance, _compare_general, compare


def _cases(rng):
    for shape in [(), (1,), (7,), (3, 4), (2, 3, 5)]:
        for scale in (1e-12, 1.0, 1e6):
            ref = rng.standard_normal(shape) * scale
            for g in (ref.copy(), ref * (1 + 1e-9), ref + rng.standard_normal(shape) * scale * 1e-3,
                      np.zeros(shape), -ref):
                for noise in (0.0, np.abs(rng.standard_normal(shape)) * 1e-6, np.inf):
                    yield g, ref, noise


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_finite_fast_path_equals_the_general_rule(dtype):
    rng = np.random.default_rng(0)
    tol = Tolerance.for_dtype(dtype)
    n = 0
    for g, ref, noise in _cases(rng):
        fast, general = compare(g, ref, tol, noise), _compare_general(np.asarray(g, float), np.asarray(ref, float),
                                                                       tol, noise)
        assert dataclasses.asdict(fast) == dataclasses.asdict(general), (g, ref, noise)
        n += 1
    assert n > 100


def test_non_finite_values_take_the_general_rule():
    tol = Tolerance.for_dtype("float64")
    ref = np.array([1.0, 2.0, 3.0])
    assert not compare(np.array([1.0, np.nan, 3.0]), ref, tol).passed
    assert compare(np.array([1.0, np.inf]), np.array([1.0, np.inf]), tol).passed  # the same infinity agrees
    assert not compare(np.array([1e308, 0.0]), np.array([-1e308, 0.0]), tol).passed  # the error overflows
    assert compare(np.array([np.nan]), np.array([np.nan]), tol).passed
