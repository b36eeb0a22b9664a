"""x[key] on a traced value, as the registry's ops: basic indexing (ints, slices, Ellipsis,
None) is one `slice` node, then `squeeze` for the integer positions and `expand_dims` for
each None; one integer array (or traced int64 value) on one axis, every other axis whole,
is `take`. Boolean masks select a data-dependent number of elements: refused."""
from __future__ import annotations

import numpy as np

from .trace_errors import TracerError
from .traced import Traced


def _error(message: str) -> Exception:
    return TracerError(message)


def _is_int(k) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def _is_array_index(k) -> bool:
    return isinstance(k, (list, np.ndarray, Traced))


def getitem(x, key):
    parts = key if isinstance(key, tuple) else (key,)
    y = _record(x, parts)
    if len(parts) == len(x.shape) and all(_is_int(k) for k in parts):
        y.detach()  # one element by integers: NumPy gives a scalar, a copy, not a view of x
    traced = [k for k in parts if isinstance(k, Traced)]
    if x.value is not None and all(k.value is not None for k in traced):
        # the trace-time value by NumPy's own indexing: what the recorded ops reproduce
        plain = tuple(k.value.astype(np.int64) if isinstance(k, Traced) else k for k in parts)
        y.value = np.asarray(x.value[plain if isinstance(key, tuple) else plain[0]], dtype=np.float64)
    return y


def _record(x, key):
    shape = x.shape
    arrays = [i for i, k in enumerate(key) if _is_array_index(k)]
    if arrays:
        return _take(x, key, arrays, shape)
    if sum(k is Ellipsis for k in key) > 1:  # `is`: == on an array index would compare elements
        raise _error("an index can only have a single ellipsis ('...')")
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > len(shape):
        raise _error(f"too many indices for a traced value of shape {list(shape)}")
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1:]
    else:
        key = key + (slice(None),) * (len(shape) - used)
    starts, ends, axes, steps, drop, new = [], [], [], [], [], []
    axis = out_pos = 0
    for k in key:
        if k is None:
            new.append(out_pos)
            out_pos += 1
            continue
        n = shape[axis]
        if _is_int(k):
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise IndexError(f"index {int(k)} is out of bounds for axis {axis} with size {n}")
            starts.append(i), ends.append(i + 1), axes.append(axis), steps.append(1)
            drop.append(axis)
        elif isinstance(k, slice):
            if k != slice(None):
                start, stop, step = k.indices(n)
                # a negative step running past index 0 ends "before the first element": -(n+1)
                starts.append(start), ends.append(stop if stop >= 0 else -(n + 1)), axes.append(axis)
                steps.append(step)
            out_pos += 1
        else:
            raise _error(f"cannot index a traced value with {type(k).__name__} {k!r}")
        axis += 1
    y = x
    if axes:
        y = x.tracer.apply("slice", y, starts=starts, ends=ends, axes=axes, steps=steps)
    if drop:
        y = y.tracer.apply("squeeze", y, axis=drop)
    for pos in new:  # increasing positions in the result: each insert leaves the later ones right
        y = y.tracer.apply("expand_dims", y, axis=pos)
    return y


def _take(x, key, arrays, shape):
    (i,) = arrays if len(arrays) == 1 else (None,)
    if i is None or any(k != slice(None) for j, k in enumerate(key) if j != i):
        raise _error("only one integer-array index, with every other axis whole (x[idx], x[:, idx]), "
                     "can be traced (it becomes op 'take')")
    idx = key[i]
    if not isinstance(idx, Traced):
        idx = np.asarray(idx)
        if idx.dtype.kind == "b":
            raise _error("boolean mask indexing selects a data-dependent number of elements: it cannot be "
                         "traced (use numpy.where)")
        if idx.dtype.kind not in "iu":
            raise _error(f"array index of dtype {idx.dtype} (integers expected)")
        idx = idx.astype(np.int64)
    if not shape:
        raise _error("a 0-d traced value cannot be indexed")
    return x.tracer.apply("take", x, idx, axis=i)
