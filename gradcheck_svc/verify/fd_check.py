"""Engine values against finite differences that know their own error.

The first pass's differences carry only a rounding estimate. Values that fail against it are
refined by the oracle (finite_diff: a ladder of steps, Richardson, one-sided near a domain
edge), worst first, in batches, until one is confirmed wrong or none is left; each is then
held to the tolerance plus its estimated FD error. A refined value off by more than that is a
confirmed mismatch however imprecise its estimate (the exact value lies within the estimate's
bound, so the engine is off by more than the tolerance). One within it whose error estimate is
neither within the tolerance nor a small fraction of the value (TRUST) decides nothing: it
is *undecidable by FD*, never counted as a mismatch and never a pass either (run.py: the
parameter is undecided unless the symbolic oracle or a kink's one-sided check decides it). So is every value
still failing on the first pass once REFINE_MAX values were refined without a confirmed
mismatch (`unrefined`): the first pass's error estimate covers rounding only, so its verdict
is no verdict (a correct graph whose 700 values all missed on the first pass once failed with
no finding at all). Once a mismatch is confirmed the verdict is settled and refining stops;
the values still off on the first pass alone are `unconfirmed`: left out of the comparison
(a mismatch shown with a rounding-only bound would show a bound that is not one) and counted.

Used for the parameters' gradients (run.py) and by localization for every adjoint and local
derivative it checks, so no node is blamed for the oracle's own truncation error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..oracles.fd_formulas import EPS
from ..oracles.fd_modes import FDMode
from .compare import Comparison, Tolerance, compare, within
from .compare import bounds as _bounds

TRUST = 1e-3  # an FD error estimate above this fraction of the value (and the tolerance) is no verdict
REFINE_BATCH = 32  # values refined per ladder (its forwards run as stacked batches)
REFINE_MAX = 2048  # values refined per check at most: the rest still failing are undecidable (unrefined)
ROUNDING_SHARE = 8  # an error bound within 8x rounding's at its step (2x the largest factor, one-sided's 4)


@dataclass
class FDCheck:
    comparison: Comparison  # engine vs reference, each value allowed tolerance + its FD error
    reference: np.ndarray  # flat: first-pass differences, refined where they failed
    error: np.ndarray  # flat: each value's estimated FD error
    refined: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))  # flat indices
    undecidable: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))  # flat indices
    # flat indices left undecided because REFINE_MAX values were refined first (a subset of undecidable)
    unrefined: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))
    # flat indices off on the first pass, never refined: a confirmed mismatch settled the verdict first
    unconfirmed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))

    @property
    def passed(self) -> bool:
        return self.comparison.passed


def as_referenced(ref, g: np.ndarray) -> np.ndarray:
    """A gradient as a finite_diff.FDResult `ref` holds it: its directional derivatives for a projection."""
    return ref.directions @ np.reshape(g, -1) if ref.mode == FDMode.PROJECTION else g


def _over(engine, reference, allowed) -> np.ndarray:
    """Elements compare() would fail (its rule, `within`, not a second one)."""
    with np.errstate(invalid="ignore"):
        return ~within(engine, reference, np.abs(engine - reference), allowed)


def _deciders(least: np.ndarray, g: np.ndarray):
    """For one refined batch, with least its allowed error and g the engine's values there:
    trusted_at(values, err), an estimate whose error is small enough to trust, and
    settled(values, err), an estimate that already decides the comparison."""
    def trusted_at(values, err):
        with np.errstate(invalid="ignore"):
            # fmax: a first pass that was NaN (a step across a domain edge) leaves least NaN there
            return np.isfinite(err) & (err <= np.fmax(least, TRUST * np.abs(values)))

    def settled(values, err):
        """Decided: agreeing with a bound within the tolerance, or disagreeing with a trusted one. (An
        untrusted estimate descends the whole ladder: near a pole a coarse level's gap-based bound is no
        bound yet; the finest bound the ladder reaches is what fd_check holds a disagreement to.)"""
        with np.errstate(invalid="ignore"):
            off = np.abs(g - values)
            return ((err <= least) & (off <= least + err)) | (trusted_at(values, err) & (off > least + err))
    return trusted_at, settled


def _decided(r, eng: np.ndarray, allowed: np.ndarray, trusted_at, loss):
    """(confirmed mismatches, undecidable values) among refined values r (a finite_diff.Refined), with
    `allowed` each one's tolerance plus its FD error. Off by more than that is confirmed when the estimate
    is trusted, or -- however imprecise -- when its bound is rounding's (within ROUNDING_SHARE of the
    rounding at its step, 4 eps (|L| + 1) / h, known when `loss` is): rounding's bound holds, while a
    bound made of the gaps between levels does not where the ladder never got below the function's own
    scale (sqrt at 1e-300: 331 +- 140 against the exact 2.5e+149). Within it, only a trusted one decides."""
    off = _over(eng, r.values, allowed) & np.isfinite(r.error)
    trusted = trusted_at(r.values, r.error)
    if loss is None:
        confirmed = off & trusted
    else:
        with np.errstate(all="ignore"):
            rounding = 4 * EPS * (abs(loss) + 1.0) / np.abs(r.step)
        confirmed = off & (trusted | (r.error <= ROUNDING_SHARE * rounding))
    return confirmed, ~trusted & ~confirmed


def fd_check(engine: np.ndarray, reference: np.ndarray, noise, tol: Tolerance, refine, floor=None,
             loss: float | None = None, per_batch: int = REFINE_BATCH) -> FDCheck:
    """engine and reference in the reference's shape; noise its first-pass error estimate;
    refine(flat indices, settled) -> finite_diff.Refined for those values, where settled(values,
    error) says which estimates already decide the comparison; None: the first pass stands.
    floor: each value's allowed error besides its FD error, in place of the tolerance model's
    (the joint screen's, verify/joint_check.py). loss: the function's value, for _decided's rounding
    bound (None: only trusted estimates confirm a mismatch). per_batch: values refined at a time, worst first
    (refining stops at the first batch with a confirmed mismatch)."""
    if floor is not None:
        floor = np.array(np.broadcast_to(floor, np.shape(reference)), dtype=np.float64).reshape(-1)

    def bounds(ref, tol, error=0.0):
        return _bounds(ref, tol, error) if floor is None else floor + error
    shape = np.shape(reference)
    eng = np.asarray(engine, dtype=np.float64).reshape(-1)
    ref = np.array(reference, dtype=np.float64).reshape(-1)
    error = np.array(np.broadcast_to(noise, shape), dtype=np.float64).reshape(-1)
    refined = np.zeros(ref.size, bool)
    undecidable = np.zeros(ref.size, bool)
    unrefined = np.zeros(ref.size, bool)
    unconfirmed = np.zeros(ref.size, bool)
    while refine is not None and refined.sum() < REFINE_MAX:
        allowed = bounds(ref, tol, error)
        over = _over(eng, ref, allowed) & ~refined
        if not over.any():
            break
        with np.errstate(all="ignore"):
            ratio = np.where(over, np.nan_to_num(np.abs(eng - ref) / allowed, nan=np.inf), -1.0)
        batch = np.argsort(-ratio, kind="stable")[:min(per_batch, int(over.sum()), REFINE_MAX - int(refined.sum()))]
        trusted_at, settled = _deciders(bounds(ref, tol)[batch], eng[batch])
        r = refine(batch, settled)  # a value stops descending the ladder once it is decided
        ref[batch], error[batch] = r.values, r.error
        refined[batch] = True
        confirmed, undecidable[batch] = _decided(r, eng[batch], bounds(ref, tol, error)[batch], trusted_at, loss)
        if confirmed.any():
            # a confirmed mismatch: the verdict is settled, localization takes it from here
            unconfirmed = _over(eng, ref, bounds(ref, tol, error)) & ~refined
            break
    else:
        if refine is not None:  # the cap: what still fails on the first pass alone decides nothing
            unrefined = _over(eng, ref, bounds(ref, tol, error)) & ~refined
            undecidable |= unrefined
    # undecidable and unconfirmed values are no verdict either way: left out of the comparison
    # (compared with themselves)
    out = undecidable | unconfirmed
    if floor is None:
        cmp = compare(eng.reshape(shape), np.where(out, eng, ref).reshape(shape), tol, error.reshape(shape))
    else:
        cmp = compare(eng.reshape(shape), np.where(out, eng, ref).reshape(shape), Tolerance(0.0, 0.0),
                      (floor + error).reshape(shape))
    return FDCheck(cmp, ref, error, np.flatnonzero(refined), np.flatnonzero(undecidable),
                   np.flatnonzero(unrefined), np.flatnonzero(unconfirmed))


def elements_check(fd, name: str, g: np.ndarray, index: np.ndarray, tol: Tolerance, floor=None) -> FDCheck:
    """Elements `index` (flat) of value `name` by ordinary central differences (FiniteDifferences.elements),
    refined where the first pass misses, against the engine's g (flat, the whole value's); floor: as
    fd_check's (None: the tolerance model on these values)."""
    index = np.asarray(index, dtype=np.intp)
    res = fd.elements(name, index)
    return fd_check(np.asarray(g, dtype=np.float64).reshape(-1)[index], res.reference, res.noise, tol,
                    lambda which, settled: fd.refine(name, res, index[which], settled), floor=floor, loss=fd.loss)
