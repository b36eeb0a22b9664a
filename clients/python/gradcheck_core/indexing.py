"""x[key] on a traced value, as the registry's ops: basic indexing (ints, slices, Ellipsis,
None) is one `slice` node, then `squeeze` for the integer positions and `expand_dims` for
each None; integer arrays on one or several axes, every other axis whole, are `take` (see
_take: several arrays index the merged axes by their flat index). A NumPy boolean mask is a
constant of the graph, like every comparison of trace-time values: its True positions."""
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
    """Integer arrays (and ints among them) index the axes they stand on, broadcast together, every other
    axis whole: NumPy's advanced indexing. One array on one axis is `take` on that axis; several (the
    cross-entropy idiom logp[np.arange(n), y]) are `take` of the flat index np.ravel_multi_index gives,
    on those axes moved to the front and merged, the result's axes placed where NumPy places them (slices
    on the other axes are taken first). A
    boolean mask is the integer arrays of its True positions: it is a constant of the graph (the
    comparison rule: x[x > 0] selects by the trace-time values)."""
    if any(k is None for k in key):
        raise _error("an index mixing arrays with None (np.newaxis) cannot be traced: index first, then add the "
                     "axis (y = x[idx]; y[:, None])")
    key = _expand_ellipsis(key, shape)
    key = _masks_to_arrays(x, key, shape)
    arrays = [i for i, k in enumerate(key) if _is_array_index(k) or _is_int(k)]
    if any(k != slice(None) for j, k in enumerate(key) if j not in arrays):  # x[1:, idx]: the slices first
        x = _record(x, tuple(slice(None) if j in arrays else k for j, k in enumerate(key)))
        shape, key = x.shape, tuple(k if j in arrays else slice(None) for j, k in enumerate(key))
    if not shape:
        raise _error("a 0-d traced value cannot be indexed")
    if len(arrays) == 1 and not _is_int(key[arrays[0]]):
        return x.tracer.apply("take", x, _index_array(key[arrays[0]]), axis=arrays[0])
    if any(isinstance(key[i], Traced) for i in arrays):
        raise _error("a traced integer array among several array indices cannot be traced: index with the NumPy "
                     "array itself (logp[np.arange(n), labels] with labels plain data, as check() passes int "
                     "arguments), or one traced index array on one axis (x[:, idx])")
    dims = [shape[i] for i in arrays]
    try:
        idx = np.broadcast_arrays(*(np.asarray(key[i]) for i in arrays))
    except ValueError:
        raise _error("shape mismatch: indexing arrays could not be broadcast together with shapes "
                     + " ".join(str(list(np.shape(key[i]))) for i in arrays)) from None
    for ax, n, a in zip(arrays, dims, idx):
        if a.size and (a.max() >= n or a.min() < -n):
            bad = int(a.max()) if a.max() >= n else int(a.min())
            raise IndexError(f"index {bad} is out of bounds for axis {ax} with size {n}")
    flat = np.ravel_multi_index(tuple(np.asarray(a, dtype=np.int64) % n for a, n in zip(idx, dims)), dims)
    rest = [i for i in range(len(shape)) if i not in arrays]
    t = x.tracer
    front = x if arrays + rest == list(range(len(shape))) else t.apply("transpose", x, axes=arrays + rest)
    merged = front.reshape([int(np.prod(dims))] + [shape[i] for i in rest])
    y = t.apply("take", merged, flat.astype(np.int64), axis=0)
    at = arrays[0] if arrays == list(range(arrays[0], arrays[-1] + 1)) else 0  # NumPy: in place when adjacent
    if at == 0:
        return y
    b = flat.ndim  # the broadcast index's axes come first in y: move them to where the indexed axes were
    order = list(range(b, b + at)) + list(range(b)) + list(range(b + at, y.ndim))
    y = t.apply("transpose", y, axes=order)
    y.detach()  # NumPy's advanced indexing gives a new array, not a view
    return y


def _expand_ellipsis(key, shape):
    if sum(k is Ellipsis for k in key) > 1:
        raise _error("an index can only have a single ellipsis ('...')")
    used = sum(np.ndim(k) if _is_mask(k) else 1 for k in key if k is not Ellipsis)
    if used > len(shape):
        raise _error(f"too many indices for a traced value of shape {list(shape)}")
    fill = (slice(None),) * (len(shape) - used)
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        return key[:at] + fill + key[at + 1:]
    return key + fill


def _is_mask(k) -> bool:
    return isinstance(k, np.ndarray) and k.dtype.kind == "b" or isinstance(k, list) and \
        np.asarray(k).dtype.kind == "b"


def _masks_to_arrays(x, key, shape):
    """A boolean mask over axes a..a+m-1 is the m integer arrays of its True positions (np.nonzero)."""
    out, axis = [], 0
    for k in key:
        if isinstance(k, Traced) and k.dtype.kind not in "iu":  # a node's value (a boolean op's too), not data
            raise _error(f"indexing with the traced value '{k.name}' cannot be traced: an index is a NumPy integer "
                         "array or mask (a comparison of traced values is a mask: x[x > 0]) or an integer input "
                         "of the trace; for a boolean computed in the graph use np.where(mask, x, 0)")
        if _is_mask(k):
            k = np.asarray(k)
            want = tuple(shape[axis:axis + k.ndim])
            if k.shape != want:
                raise IndexError(f"boolean index of shape {list(k.shape)} does not match the indexed shape "
                                 f"{list(want)} of a traced value of shape {list(shape)}")
            out.extend(np.nonzero(k))
            axis += k.ndim
            continue
        out.append(k)
        axis += 1
    return tuple(out)


def _index_array(idx):
    if isinstance(idx, Traced):
        return idx
    idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise _error(f"array index of dtype {idx.dtype} (integers expected)")
    return idx.astype(np.int64)
