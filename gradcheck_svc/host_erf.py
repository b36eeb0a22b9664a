"""The error function on host NumPy arrays, to full float64 accuracy (NumPy has none): SciPy's when
installed, else math.erf per element. Its own module so that both backend.py and the strict test
backend use it without importing each other."""
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
