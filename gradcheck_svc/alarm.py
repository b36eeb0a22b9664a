"""A time budget for Python code on the main thread: SIGALRM raises an exception at the next bytecode.

Used where the code to stop is pure Python that has no time limit of its own (sympy.simplify in the
expr check, ONNX constant folding); a whole verification's limit is bounded.py's child, killed at it.
A single long NumPy call finishes first. Only the main thread receives signals, and only one interval
timer exists per process: `timer_free` says whether this caller may use it (callers fall back to
something else when it is not).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


def timer_free() -> bool:
    """Main thread, POSIX, and nobody else's interval timer running."""
    return (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))


@contextmanager
def alarm(seconds: float, raise_type: type[BaseException], fired=None):
    """Raise `raise_type` in the main thread once `seconds` have passed inside the block; `fired()` first, if
    given. A raise that lands in a finalizer (a `__del__` the garbage collector runs just then) is printed and
    dropped by Python, and the block runs on: `fired` records the moment for the caller's own checks."""
    def expired(signum, frame):
        if fired is not None:
            fired()
        raise raise_type

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
