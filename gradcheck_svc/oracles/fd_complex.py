"""Complex-step differences: exact directional derivatives from one complex forward.

For a real-analytic f, Im f(x + i h v) / h = grad f . v + O(h^2) with no subtraction (Squire & Trapp, SIAM
Review 1998; Martins, Sturdza & Alonso, ACM TOMS 2003): with h ~ 2^-64 max(1, |x|) the value is exact to
the rounding of that one forward, whatever |L|, the step or the size -- no rounding term eps |L| / h, so
no refinement ladder. The forward is the engine's own frozen-branch batched forward on complex128
(forward_batched(..., frozen=selections(...))): every piecewise op evaluates on the piece its real part,
the base point, took (relu, max-pool, abs, clip, sort, where, comparisons), so no kink is ever crossed;
held ops (floor, sign, integer and boolean outputs) keep their base values and so drop the imaginary part.
Each op's complex form is its own forward (OpDef.complex_step); no derivative table here. Copies at the base
point travel as their imaginary parts alone where the ops allow (engine/executor.py Pair: multilinear and linear
ops, and elementwise ones linearized by their Slopes -- the same forward's complex step at the base, to first
order, as the shared real part already is).

Error: the first pass's estimate is the rounding of the result itself, ROUND eps |d|. A value it does not
settle is probed (probed()): evaluated again with the base's real part moved by a few ulps (the
forward's roundings fall differently) and a far smaller step (a step not small next to a singularity
shows as a change) -- twice; the spread of the three values, times SAFETY, is its estimated error.

Where it does not apply (blockers): a parameter with an op downstream that has no complex form, or a
piecewise op whose piece is not frozen (a non-finite input: its ordinary forward would not select by the
real part), keeps real central differences; the plan names the op (FDPlan.methods, fallback).
"""
from __future__ import annotations

import warnings

import numpy as np

from ..engine.executor import run_step
from .fd_formulas import Refined

COMPLEX = "complex"  # the methods' names in the plan and the report
CENTRAL = "central"
METHODS = (COMPLEX, CENTRAL)  # FDOptions.method, the option fd_method
STEP = 2.0 ** -64  # h relative to max(1, |x|): h^2 truncation is below any rounding
ROUND = 8  # the first pass's estimate: ROUND eps |d|
SAFETY = 4  # the probes' spread times this is the probed error
PROBE_SHRINK = (2.0 ** -24, 2.0 ** -40)  # each probe's step relative to the first pass's
PROBE_ULPS = 4.0  # each probe's base point: x (1 + u), |u| < PROBE_ULPS eps, seeded
EPS = np.finfo(np.float64).eps


def _power_of_two(scale):
    """STEP x the power of two at or below scale: h v and Im L / h then round no more than v does."""
    with np.errstate(all="ignore"):
        return STEP * 2.0 ** np.floor(np.log2(scale))


def _power_of_two_array(scale: np.ndarray) -> np.ndarray:
    """_power_of_two of a float64 array, the same values at a fifth of its cost (np.log2 and 2.0 ** an array
    were most of a complex step's slopes on a small graph): scale = m 2^e with m in [0.5, 1) (frexp), so
    floor(log2(scale)) = e - 1 wherever log2 cannot round across an integer -- m further than 2^-31 from 0.5 and
    from 1, where log2 is off the integer by more than 1e-9, thousands of its ulps -- and the product is a
    power of two, exact (ldexp). The elements near a power of two, or not finite and positive, take
    _power_of_two itself."""
    if scale.ndim == 0:
        return _power_of_two(scale)
    m, e = np.frexp(scale)
    out = np.ldexp(STEP, e - 1)
    edge = ~(np.abs(m - 0.75) <= 0.25 - 2.0 ** -31)  # (m - 0.75 is exact; NaN, inf and 0 are edges too)
    if edge.any():
        out[edge] = _power_of_two(scale[edge])
    return out


def steps(flat: np.ndarray) -> np.ndarray:
    """The imaginary step per element: ~STEP max(1, |x|), a power of two."""
    return _power_of_two_array(np.maximum(1.0, np.abs(np.asarray(flat, dtype=np.float64))))


def relative_steps(x: np.ndarray) -> np.ndarray:
    """An imaginary step per element small next to |x| itself (STEP |x|, a power of two; STEP at 0, and |x|
    floored at 2^-900, where the step would be subnormal): next to a singularity at 0 (1/x, log, sqrt) the
    complex step stays far inside the distance to it."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    return _power_of_two_array(np.where(x == 0, 1.0, np.maximum(x, 2.0 ** -900)))


class Slopes:
    """Each elementwise step's slope in each of its inputs at the base point, by a complex step of the op's own
    forward (no derivative table): Im f(.., x_k + i eps, ..) / eps, eps = relative_steps(x_k) -- what
    engine/executor.elementwise_step multiplies the Pairs' imaginary parts by. Made once per (step, input) for
    one base (a FiniteDifferences' own); None where it is not finite (the step then runs on complex copies)."""

    def __init__(self):
        self._made: dict = {}

    def of(self, xp, step, k: int, base: dict):
        key = (step.name, k)
        if key not in self._made:
            xs = [base[n] for n in step.inputs]
            eps = relative_steps(xs[k])
            xs[k] = np.asarray(xs[k], dtype=np.float64) + 1j * eps
            with np.errstate(all="ignore"):
                d = np.imag(run_step(xp, step, xs)) / eps
            self._made[key] = d if np.isfinite(d).all() else None
        return self._made[key]


def step_of(flat: np.ndarray) -> float:
    """One step for a whole direction: scaled by the largest element."""
    return float(_power_of_two(max(1.0, float(np.max(np.abs(flat))) if np.size(flat) else 1.0)))


def lacks_complex(program, frozen: dict, base: dict) -> dict[str, str]:
    """step name -> its op, for the steps a complex forward cannot pass: an op without a complex form (or
    not at its base inputs: OpDef.complex_step as a predicate), or a piecewise op left unfrozen (selections()
    skipped it: a non-finite input)."""
    out = {}
    for s in program.steps:
        piecewise = s.op.held or s.op.select is not None
        form = s.op.complex_step
        if callable(form):
            with np.errstate(all="ignore"):
                form = form([base[n] for n in s.inputs], s.attrs)
        if not form or (piecewise and s.name not in frozen):
            out[s.name] = s.op.name
    return out


def blockers(program, frozen: dict, base: dict, off: str | None) -> dict[str, list[str]]:
    """parameter -> the ops downstream of it that keep it on real central differences (sorted, distinct);
    every parameter, with the reason `off`, when complex steps are off (the option, frozen branches off, a
    loss that is not finite)."""
    params = list(program.params)
    if off:
        return {p: [f"({off})"] for p in params}
    lacking = lacks_complex(program, frozen, base)
    if not lacking:
        return {}
    out = {}
    for p in params:
        ops = sorted({lacking[n] for n in program.downstream([p]) if n in lacking})
        if ops:
            out[p] = ops
    return out


def derivative(losses: np.ndarray, h) -> np.ndarray:
    """Im L / h per copy."""
    return np.imag(losses) / h


def first_noise(values: np.ndarray) -> np.ndarray:
    """The first pass's error estimate: the rounding of the value itself (probe_bounds where it does not settle)."""
    return ROUND * EPS * np.abs(np.asarray(values, dtype=np.float64))


def probed(evaluate, x0: dict, which, h, many=None, first=None) -> Refined:
    """The values `which` probed: evaluate(base points p -> flat real values, step factor) -> their
    derivatives, at the base and at each probe (the base's real parts moved by a few ulps, a seeded pattern
    per probe, and the step shrunk). The base's value (the probes' points are not the base point); SAFETY x
    the spread of the three its error (a step not small next to a singularity shows there too). first: the
    values at the base point where the caller has them (the first pass: the same forward at the same point),
    not evaluated again."""
    rng = np.random.default_rng(len(np.atleast_1d(which)))
    points = [(x0, 1.0)]
    for shrink in PROBE_SHRINK:
        points.append(({p: x * (1.0 + PROBE_ULPS * EPS * rng.uniform(-1.0, 1.0, np.shape(x))) for p, x in x0.items()},
                       shrink))
    todo = points if first is None else points[1:]
    # many(points) -> the same values for every point in one evaluation: one batched forward for the probes,
    # where the forward's cost is per node rather than per copy (a deep chain of small values)
    values = list(many(todo) if many is not None else [evaluate(x, f) for x, f in todo])
    every = np.stack(values if first is None else [np.asarray(first, dtype=np.float64)] + values)
    with np.errstate(invalid="ignore"):
        spread = np.max(every, axis=0) - np.min(every, axis=0)
        error = SAFETY * spread + first_noise(np.max(np.abs(every), axis=0))
    error = np.where(np.isfinite(error), error, np.inf)
    m = every.shape[1]
    return Refined(np.asarray(which), np.where(np.isfinite(error), every[0], np.nan), error,
                   np.broadcast_to(np.asarray(h, dtype=np.float64), (m,)).copy(), [COMPLEX] * m)


class ComplexGuard:
    """Complex forwards are evaluated inside this: a silent cast of complex to real (NumPy's ComplexWarning,
    an op writing complex values into a real buffer) is an error, never a dropped derivative."""

    def __enter__(self):
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error", np.exceptions.ComplexWarning)
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def check_real_part(losses: np.ndarray, loss: float) -> None:
    """The real part of a complex forward is the base forward (the same branches, the same arithmetic up to
    h^2 terms and a complex function's last bit): where it is not, the op's complex form is not its forward."""
    re = np.real(losses)
    with np.errstate(invalid="ignore"):
        off = np.abs(re - loss) > 1e-9 * (abs(loss) + 1.0)
    if np.isfinite(loss) and off.any():
        raise ComplexStepError(f"a complex forward's real part {float(re[np.argmax(off)]):.17g} is not the loss "
                               f"{loss:.17g}")


class ComplexStepError(ValueError):
    """A complex forward that could not be evaluated faithfully: the caller falls back to central differences."""
