"""The guard of check(): the traced graph computes f, or the check is refused.

The tracer reproduces NumPy function by function (numpy_protocol, numpy_compose, indexing); a function it
gets wrong -- an argument form it reads otherwise, a copy where NumPy gives a view -- would be verified as
if it were f, and pass. So check() also runs f on plain NumPy copies of its arguments and compares what
both give: the output and, for code that updates its arguments in place, each argument's value after the
call. Before verifying, against the trace-time values (the registry's NumPy forwards, op_values.py); after
verifying, the loss against the engine's own forward of the graph (report.loss), which also covers values
the tracer does not know at trace time (ops without a local evaluation). A difference beyond rounding
refuses the check, naming the first output that differs.

f runs twice (traced, then on NumPy arrays), with NumPy's global random state the same at both starts, so
np.random draws inside f agree; a generator kept outside f, or other state f changes, makes the two runs
differ, and the message says so.
"""
from __future__ import annotations

import contextvars
import warnings
from dataclasses import dataclass, field

import numpy as np

from .trace_errors import TracerError

# rounding the two evaluations may differ by (compositions sum in another order, sinh is built from exp):
# relative to the output's own magnitude, far below what a mis-trace changes (a whole element)
RTOL = 1e-6
ATOL = 1e-12

# set while f runs on NumPy arrays: tracer.constant(x) is then x itself (the number it marks)
PLAIN_RUN = contextvars.ContextVar("gradcheck_plain_run", default=False)


@dataclass
class Expected:
    """What f gives on NumPy arrays: its output, and the arguments after the call (by name)."""
    output: np.ndarray
    arguments: dict = field(default_factory=dict)


def numpy_copies(args, which) -> list:
    """The arguments f gets in its plain run: float64 copies of the checked ones (as the trace takes them),
    copies of other arrays (so neither run sees the other's in-place updates), anything else as it is."""
    return [np.array(a, dtype=np.float64) if i in which else np.array(a) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(args)]


def run_plain(f, args, names, state) -> Expected:
    """f on NumPy arrays, from NumPy's global random state `state` (the one the traced run started from)."""
    token = PLAIN_RUN.set(True)
    after = np.random.get_state()
    try:
        np.random.set_state(state)
        # the traced run already showed f's warnings (log(0), a branch on data); the same ones again are noise
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = f(*args)
    except Exception as exc:  # f traced, but does not run on plain NumPy arrays: nothing to confirm it by
        raise TracerError(f"{_name(f)} ran traced but fails on plain NumPy arrays ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''}): check() compares the "
                          "traced graph with f's own NumPy result, so f must run on NumPy arrays too") from None
    finally:
        np.random.set_state(after)
        PLAIN_RUN.reset(token)
    return Expected(np.asarray(out), {n: a for n, a in zip(names, args) if isinstance(a, np.ndarray)})


def _name(f) -> str:
    name = getattr(f, "__name__", "f")
    return "f" if name == "<lambda>" else name


def _first_difference(got, want):
    """(index, got, want) of the first element beyond rounding, or None when they agree."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return "shape", list(got.shape), list(want.shape)
    if not got.size:
        return None
    scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0))
    close = np.isclose(got, want, rtol=RTOL, atol=ATOL + RTOL * scale, equal_nan=True)
    if close.all():
        return None
    index = np.unravel_index(int(np.argmin(close.reshape(-1))), got.shape)
    return [int(i) for i in index], float(got[index]), float(want[index])


def _refuse(fname: str, what: str, diff) -> TracerError:
    where, got, want = diff
    at = f"its shape is {got} traced, {want} in NumPy" if where == "shape" else \
        f"at index {where} NumPy gives {want:.17g}, the traced graph {got:.17g}"
    return TracerError(f"check refused: the traced graph does not compute {fname}: {what} differs ({at}). "
                       "Either f is not deterministic (random numbers from a generator made outside f, other "
                       "state it changes) or the tracer mis-traced a NumPy call here: please report it with f")


def confirm_trace(fname: str, output, arguments: dict, expected: Expected) -> bool:
    """Compare the trace-time values of the output and of the arguments after the call (traced Values or
    plain arrays, by name) with f's NumPy result; raise TracerError at the first difference. Returns whether
    every value was known at trace time (else the loss check after verifying is what confirms it)."""
    pairs = [("its output", output, expected.output)] + [
        (f"argument '{n}' after the call (updated in place)", v, expected.arguments[n])
        for n, v in arguments.items() if n in expected.arguments]
    for what, got, want in pairs:
        value = getattr(got, "value", got)
        # an op without a trace-time value: its shape here, its values through the engine's loss (confirm_loss;
        # an argument updated by such an op is confirmed only as far as the loss reads it)
        diff = _first_difference(value, want) if value is not None else \
            None if tuple(got.shape) == want.shape else ("shape", list(got.shape), list(want.shape))
        if diff is not None:
            raise _refuse(fname, what, diff)
    return output.value is not None


def expected_loss(output: np.ndarray, cotangent) -> float:
    """The loss check() verifies, from f's NumPy output: sum(output * c), or the output itself."""
    return float(np.sum(output * cotangent)) if cotangent is not None else float(np.reshape(output, -1)[0])


def confirm_loss(fname: str, loss, want: float, terms: float, dtype: str, known: bool) -> None:
    """The engine's forward loss (report.loss) against f's NumPy loss `want`; `terms` is sum|output * c|,
    the size its rounding is relative to. In float32 the engine's rounding is checked only where the trace
    could not confirm the output itself (known=False)."""
    if loss is None:
        return
    try:  # a report's JSON spells a non-finite double as a string ("NaN", "Infinity")
        loss = float(loss)
    except (TypeError, ValueError):
        raise TracerError(f"check refused: the report's loss is not a number ({str(loss)[:40]!r})") from None
    if not np.isfinite(loss):
        if not np.isfinite(want):
            return
        raise TracerError(f"check refused: the engine's loss is {loss}, {fname}'s own is {want:.17g}: a report whose "
                          "loss is not finite does not stand for the function checked")
    if dtype == "float32" and known:
        return
    rtol = RTOL if dtype != "float32" else float(np.sqrt(np.finfo(np.float32).eps)) * 10
    if not abs(loss - want) <= rtol * (abs(want) + terms) + ATOL:
        raise TracerError(f"check refused: the traced graph does not compute {fname}: the engine's loss is "
                          f"{loss:.17g}, f's own on NumPy arrays {want:.17g} (its output reduced the same way). "
                          "Either f is not deterministic or the tracer mis-traced a NumPy call: please report "
                          "it with f")
