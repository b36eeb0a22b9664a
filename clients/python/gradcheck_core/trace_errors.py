"""What tracing raises and warns (the tracer and its NumPy and indexing layers share them),
and where in the user's code it happened."""
from __future__ import annotations

import linecache
import os
import sys

from .errors import InvalidInput

_HERE = os.path.dirname(os.path.abspath(__file__))


class TracerError(InvalidInput, ValueError):
    """The function cannot be traced faithfully: refused, one line naming the construct (exit 2)."""


class UnknownOpError(TracerError, AttributeError):
    """An op the server's registry lacks (an AttributeError too: `hasattr(ops, name)` works)."""


class TracerWarning(UserWarning):
    """A trace-time decision (a branch on data) is baked into the graph."""


def _library(filename: str) -> bool:
    """A frame of the tracer itself or of NumPy (what sits between the user's line and us)."""
    path = os.path.abspath(filename)
    if path.startswith(_HERE + os.sep):
        return True
    numpy = sys.modules.get("numpy")
    root = os.path.dirname(os.path.abspath(numpy.__file__)) if numpy is not None else None
    return bool(root) and path.startswith(root + os.sep)


def user_site() -> str:
    """The user's source line that is being traced: ' (at FILE:LINE: `code`)', or '' when none is found
    (the first frame outside this package and NumPy, innermost first)."""
    frame = sys._getframe(1)
    while frame is not None and _library(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ""
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return f" (at {where}: `{code[:120]}`)" if code else f" (at {where})"


def numpy_caller() -> str:
    """The outermost NumPy function between the user's line and the tracer (np.r_[...] reaches the tracer
    through numpy.ndim: this names AxisConcatenator.__getitem__), or '' when NumPy was called directly."""
    frame, outer = sys._getframe(1), ""
    numpy = sys.modules.get("numpy")
    root = os.path.dirname(os.path.abspath(numpy.__file__)) + os.sep if numpy is not None else None
    while frame is not None and _library(frame.f_code.co_filename):
        if root and os.path.abspath(frame.f_code.co_filename).startswith(root):
            outer = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        frame = frame.f_back
    return outer
