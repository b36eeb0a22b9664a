"""The error function on host NumPy arrays, to full float64 accuracy (NumPy has none): SciPy's, a
dependency (one vectorized pass; the exact GELU's forward and derivative each call it). math.erf per
element stays only for an environment that lacks SciPy (a hand-made one: the GPU run brings SciPy in
bench/gpu_bundle.txt); it is exact, only slower. Its own module so that both backend.py and the strict
test backend use it without importing each other."""
from __future__ import annotations

import math

import numpy as np

_np_erf = np.frompyfunc(math.erf, 1, 1)


def numpy_erf(x):
    try:
        from scipy.special import erf as sp_erf  # optional, much faster
    except ImportError:
        return np.asarray(_np_erf(x), dtype=x.dtype)
    return sp_erf(x)
