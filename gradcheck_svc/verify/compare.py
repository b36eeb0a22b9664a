"""Comparing an engine gradient with a reference: the tolerance model.

An element passes when

    |g - ref| <= atol * scale + rtol * |ref| + noise

where scale = max(1, max|ref|) over the parameter (float32 rounding grows with
the gradient's overall magnitude, not each element's), and noise is the
reference's own estimated rounding error (for finite differences,
~eps * |L| / h). Defaults per engine dtype: float64 engines are held to
atol 1e-7 / rtol 1e-6; float32 engines to atol 1e-4 / rtol 1e-3, about
1,000 float32 ulps, which leaves room for accumulated rounding in long
reductions while still catching wrong rules (errors of order 1%).

A vanishing gradient is held to its own size (float64 engines): where a parameter's
largest |ref| M is below VANISHING (1e-4), atol's term is atol * M / VANISHING -- at
the default atol, 0.1% of the parameter's largest gradient -- rather than atol itself,
which would let a 1% error in the first layers of a deep chain (gradients ~1e-6,
chain_256) pass unseen. It stops shrinking at ZERO_SHARE of atol (1e-13 at the
default), the rounding of a gradient that cancels to zero. Finite differences resolve such
gradients (their rounding, ~eps |L| / h, is in `noise`); float64 rounding in the
engine is ~1e-16 relative, far inside. float32 engines keep the absolute floor.

A NaN or Inf where the reference is finite always fails, and so does any element whose
allowed error is itself infinite or NaN (the same non-finite value on both sides agrees).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_TOLERANCES = {"float64": (1e-7, 1e-6), "float32": (1e-4, 1e-3)}
VANISHING = {"float64": 1e-4, "float32": 0.0}  # see the module's doc; 0: atol's term never shrinks
ZERO_SHARE = 1e-6


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    vanishing: float = 0.0  # a parameter's largest |ref| below which atol's term shrinks with it

    @classmethod
    def for_dtype(cls, dtype: str, atol: float | None = None, rtol: float | None = None) -> "Tolerance":
        a, r = DEFAULT_TOLERANCES[dtype]
        return cls(a if atol is None else atol, r if rtol is None else rtol, VANISHING[dtype])

    def absolute(self, magnitude: float) -> float:
        """atol's term for a parameter whose largest finite |ref| is `magnitude`."""
        a = self.atol * max(1.0, magnitude)
        if magnitude < self.vanishing:
            a *= max(magnitude / self.vanishing, ZERO_SHARE)
        return a


@dataclass
class Comparison:
    max_abs_error: float
    max_rel_error: float
    worst_index: tuple  # index into ref's shape of the element furthest beyond its tolerance
    engine_at_worst: float
    reference_at_worst: float
    passed: bool


def magnitude(ref) -> float:
    """A reference's largest finite |value|: what the tolerance's absolute term scales with."""
    ref = np.abs(np.asarray(ref, dtype=np.float64))
    return float(np.max(ref[np.isfinite(ref)], initial=0.0))


def bounds(ref: np.ndarray, tol: Tolerance, noise: np.ndarray | float = 0.0) -> np.ndarray:
    """Each element's allowed |g - ref|: the tolerance model above (NaN where ref is not finite)."""
    ref = np.asarray(ref, dtype=np.float64)
    with np.errstate(all="ignore"):
        return _bound(ref, magnitude(ref), tol, noise)


def _bound(ref, magnitude: float, tol: Tolerance, noise):
    """The tolerance model's one formula; magnitude = max |finite ref|."""
    return tol.absolute(magnitude) + tol.rtol * np.abs(ref) + noise


def within(g, ref, err, bound) -> np.ndarray:
    """The one pass/fail rule, per element: a finite error within a finite bound, or the very same
    value (both NaN, the same infinity). An infinite bound (an FD noise estimate of a -inf loss)
    excuses nothing."""
    with np.errstate(invalid="ignore"):
        return (np.isfinite(err) & np.isfinite(bound) & (err <= bound)) | (g == ref) | (np.isnan(g) & np.isnan(ref))


def compare(g: np.ndarray, ref: np.ndarray, tol: Tolerance, noise: np.ndarray | float = 0.0) -> Comparison:
    g = np.asarray(g, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ref.size == 0:
        return Comparison(0.0, 0.0, (), 0.0, 0.0, True)
    with np.errstate(all="ignore"):
        err = np.abs(g - ref)
    if np.isfinite(err).all() and np.isfinite(ref).all():
        return _compare_finite(g, ref, err, tol, noise)
    return _compare_general(g, ref, tol, noise)


def _compare_finite(g, ref, err, tol: Tolerance, noise) -> Comparison:
    """compare() when every value and error is finite (nearly always): the same numbers as the general
    rule below without its NaN/inf bookkeeping, which costs more than the comparison on small tensors
    (tests/verify/test_compare.py checks the two agree)."""
    magnitude = float(np.abs(ref).max())
    scale = max(1.0, magnitude)
    with np.errstate(all="ignore"):
        bound = _bound(ref, magnitude, tol, noise)
        rel = err / np.maximum(np.maximum(np.abs(ref), np.abs(g)), np.finfo(np.float64).eps * scale)
        ratio = err / bound
        ok = (np.isfinite(bound) & (err <= bound)) | (g == ref)
    return _comparison(g, ref, err, rel, ratio, ok)


def _comparison(g, ref, err, rel, ratio, ok) -> Comparison:
    flat = int(np.argmax(ratio))
    worst = np.unravel_index(flat, ref.shape) if ref.shape else ()
    return Comparison(
        max_abs_error=float(err.max()),
        max_rel_error=float(np.max(np.where(err == 0, 0.0, rel))),
        worst_index=tuple(int(i) for i in worst),
        engine_at_worst=float(g.reshape(-1)[flat]),
        reference_at_worst=float(ref.reshape(-1)[flat]),
        passed=bool(np.all(ok)),
    )


def _compare_general(g, ref, tol: Tolerance, noise) -> Comparison:
    with np.errstate(all="ignore"):
        err = np.abs(g - ref)
        nan = np.isnan(err)
        # as nan_to_num(err, nan=0.0) (NaN -> 0, inf -> the largest float; err >= 0), without its
        # per-call overhead: compare runs several times per parameter of every verification
        finite = np.minimum(np.where(nan, 0.0, err), np.finfo(np.float64).max)
        err = np.where(nan & ~(np.isnan(g) & np.isnan(ref)), np.inf, finite)
        err = np.where(g == ref, 0.0, err)  # the same infinity on both sides: no error
        bound = bounds(ref, tol, noise)
        # relative to the larger of the two magnitudes (a reference of 0 against 0.5 is 100% off, not
        # 1e+307), with a floor at float64 rounding of the tensor's scale so that noise near 0 stays small
        floor = np.finfo(np.float64).eps * max(1.0, float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0)))
        rel = err / np.maximum(np.maximum(np.abs(ref), np.abs(np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0))),
                               floor)
        ratio = np.where(np.isfinite(err), err / bound, np.inf)
        ok = within(g, ref, err, bound)
    return _comparison(g, ref, err, rel, ratio, ok)
