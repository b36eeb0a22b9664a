"""NumPy functions traced as compositions of registry ops (no op of their own).

Each entry takes NumPy's own arguments and records only registry ops (through Tracer.apply), so the
server verifies exactly what is recorded: var/std from mean and square, dot/outer/tensordot/einsum from
broadcasting multiply and sum or matmul, stack from expand_dims and concatenate, flip/roll/split from
slices, triu/tril/trace from constant 0/1 masks (exact: multiplying by 0 or 1 rounds nothing). Where a
composition depends on data, the dependence is a trace-time constant, as the comparison rule says: sort's
permutation is the argsort of the trace-time values (the gradient flows to the elements it picked, as in
every NumPy autodiff library). Arguments a composition cannot honour are refused, by name.
"""
from __future__ import annotations

import math
import string

import numpy as np

from .trace_errors import TracerError, user_site
from .traced import Traced


def _error(message: str) -> TracerError:
    return TracerError(message + user_site())


def _refuse(fname: str, **given) -> None:
    """NumPy arguments the composition does not trace (dtype=, out=, where=...): refused unless left at their
    default (None, or True for where=)."""
    for k, v in given.items():
        if v is not None and not (k == "where" and v is True):
            raise _error(f"numpy.{fname}: argument '{k}' cannot be traced")


def _axes(axis, ndim: int) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < ndim:
            raise _error(f"axis {a} is out of bounds for {ndim} dimension(s)")
        out.append(a % ndim)
    return tuple(out)


def _v(t, a):
    return t._lift(a)


# --- statistics and reductions -----------------------------------------------------------------


def var(t, a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None,
        correction=None):
    _refuse("var", dtype=dtype, out=out, where=where, mean=mean)
    ddof = correction if correction is not None else ddof
    x = _v(t, a)
    axes = _axes(axis, x.ndim)
    n = math.prod(x.shape[i] for i in axes)
    if n - ddof <= 0:  # NumPy divides by max(n - ddof, 0): inf or nan, with a RuntimeWarning
        raise _error(f"numpy.var: ddof={ddof} leaves no degrees of freedom over {n} element(s): NumPy divides by "
                     "zero (inf or nan), which has no gradient to check")
    centred = x - t.apply("mean", x, axis=list(axes), keepdims=True)
    return t.apply("sum", t.apply("square", centred), axis=list(axes), keepdims=bool(keepdims)) / float(n - ddof)


def std(t, a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None,
        correction=None):
    return t.apply("sqrt", var(t, a, axis, dtype, out, ddof, keepdims, where=where, mean=mean,
                               correction=correction))


def cumsum(t, a, axis=None, dtype=None, out=None):
    """Prefix sums in log2(n) steps (Hillis-Steele): y += y shifted by 1, 2, 4, ... along the axis (a slice
    padded with zeros in front). Linear, so its gradient is exact; n log n elements, not a matmul's n^2."""
    _refuse("cumsum", dtype=dtype, out=out)
    x = _v(t, a)
    if axis is None:
        x, axis = x.reshape(-1), 0
    (axis,) = _axes(axis, x.ndim)
    n, step = x.shape[axis], 1
    while step < n:
        head = x[tuple(slice(0, n - step) if i == axis else slice(None) for i in range(x.ndim))]
        pads = [0] * (2 * x.ndim)
        pads[axis] = step  # zeros in front along the axis: x shifted by `step`
        x = x + t.apply("pad", head, pads=pads)
        step *= 2
    return _new_array(t, x)  # NumPy's cumsum is a new array, also along an axis of length 1


def _new_array(t, x):
    """x as a new array of its own (what NumPy returns): not the input itself nor a view of it, when a
    composition ended without recording an op of its own (a roll by n, a cumsum of one element)."""
    return copy(t, x)


# --- elementwise, from the registry's ops -----------------------------------------------------------


def tan(t, x):
    return t.apply("sin", x) / t.apply("cos", x)


def sinh(t, x):
    return (t.apply("exp", x) - t.apply("exp", -_v(t, x))) * 0.5


def cosh(t, x):
    return (t.apply("exp", x) + t.apply("exp", -_v(t, x))) * 0.5


def log2(t, x):
    return t.apply("log", x) / math.log(2.0)


def log10(t, x):
    return t.apply("log", x) / math.log(10.0)


def exp2(t, x):
    return t.apply("pow", 2.0, x)


def reciprocal(t, x):
    return t.apply("div", 1.0, x)


def degrees(t, x):
    return _v(t, x) * (180.0 / math.pi)


def radians(t, x):
    return _v(t, x) * (math.pi / 180.0)


def logaddexp(t, a, b):
    """m + log(exp(a - m) + exp(b - m)) with m = maximum(a, b): exact whichever way maximum splits a tie
    (its derivative cancels)."""
    m = t.apply("maximum", a, b)
    return m + t.apply("log", t.apply("exp", _v(t, a) - m) + t.apply("exp", _v(t, b) - m))


def positive(t, x):
    return copy(t, x)


def clip(t, a, a_min=np._NoValue, a_max=np._NoValue, out=None, *, min=np._NoValue, max=np._NoValue, **kwargs):
    _refuse("clip", out=out, **{k: v for k, v in kwargs.items()})
    lo = min if min is not np._NoValue else a_min
    hi = max if max is not np._NoValue else a_max
    lo, hi = (None if b is np._NoValue else b for b in (lo, hi))
    if all(b is None or not isinstance(b, Traced) and np.ndim(b) == 0 for b in (lo, hi)):
        return t.apply("clip", a, min=None if lo is None else float(lo), max=None if hi is None else float(hi))
    y = _v(t, a)
    if lo is not None:
        y = t.apply("maximum", y, lo)
    if hi is not None:
        y = t.apply("minimum", y, hi)
    return y


# --- products ------------------------------------------------------------------------------------


def tensordot(t, a, b, axes=2):
    x, y = _v(t, a), _v(t, b)
    if isinstance(axes, (int, np.integer)):
        ax_a, ax_b = list(range(x.ndim - axes, x.ndim)), list(range(axes))
    else:
        ax_a, ax_b = axes
        ax_a = list(ax_a) if isinstance(ax_a, (list, tuple)) else [ax_a]
        ax_b = list(ax_b) if isinstance(ax_b, (list, tuple)) else [ax_b]
    ax_a, ax_b = list(_axes(ax_a, x.ndim)), list(_axes(ax_b, y.ndim))
    if [x.shape[i] for i in ax_a] != [y.shape[i] for i in ax_b]:
        raise _error(f"numpy.tensordot: shape-mismatch for sum ({list(x.shape)} and {list(y.shape)})")
    free_a = [i for i in range(x.ndim) if i not in ax_a]
    free_b = [i for i in range(y.ndim) if i not in ax_b]
    k = math.prod(x.shape[i] for i in ax_a)
    xm = t.apply("transpose", x, axes=free_a + ax_a).reshape(math.prod(x.shape[i] for i in free_a), k)
    ym = t.apply("transpose", y, axes=ax_b + free_b).reshape(k, math.prod(y.shape[i] for i in free_b))
    return t.apply("matmul", xm, ym).reshape([x.shape[i] for i in free_a] + [y.shape[i] for i in free_b])


def dot(t, a, b, out=None):
    _refuse("dot", out=out)
    x, y = _v(t, a), _v(t, b)
    if x.ndim == 0 or y.ndim == 0:
        return x * y
    if y.ndim <= 2:
        return t.apply("matmul", x, y)  # NumPy's dot and matmul agree here
    return tensordot(t, x, y, axes=([x.ndim - 1], [y.ndim - 2]))


def vdot(t, a, b):
    return dot(t, _v(t, a).reshape(-1), _v(t, b).reshape(-1))


def inner(t, a, b):
    x, y = _v(t, a), _v(t, b)
    if x.ndim == 0 or y.ndim == 0:
        return x * y
    return tensordot(t, x, y, axes=([x.ndim - 1], [y.ndim - 1]))


def outer(t, a, b, out=None):
    _refuse("outer", out=out)
    x, y = _v(t, a).reshape(-1, 1), _v(t, b).reshape(1, -1)
    return x * y


def einsum(t, *operands, out=None, optimize=False, **kwargs):
    """Explicit or implicit subscripts, each letter at most once per operand. Two operands: one matmul (shared
    output letters its batch axes, contracted letters its inner axis, after transpose and reshape); one or
    three and more: each operand laid out over all letters (transpose, expand_dims), multiplied with
    broadcasting and summed over the contracted letters. Repeated letters in one operand (diagonals, 'ii->i')
    and '...' are refused."""
    _refuse("einsum", out=out, **kwargs)
    if not operands or not isinstance(operands[0], str):
        raise _error("numpy.einsum: only the subscripts-string form can be traced")
    spec, arrays = operands[0].replace(" ", ""), operands[1:]
    if "..." in spec:
        raise _error("numpy.einsum: '...' cannot be traced (name the axes)")
    lhs, _, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(arrays):
        raise _error(f"numpy.einsum: {len(terms)} subscripts for {len(arrays)} operand(s)")
    if "->" not in spec:  # implicit mode: the letters seen once, alphabetically
        rhs = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    if any(len(set(term)) != len(term) for term in terms + [rhs]) or not set(rhs) <= set(lhs) \
            or not set("".join(terms)) <= set(string.ascii_letters):
        raise _error(f"numpy.einsum: subscripts '{spec}' cannot be traced (each letter at most once per operand)")
    xs = [_v(t, a) for a in arrays]
    sizes = {}
    for term, x in zip(terms, xs):
        if len(term) != x.ndim:
            raise _error(f"numpy.einsum: '{term}' for an operand of shape {list(x.shape)}")
        for c, n in zip(term, x.shape):
            if sizes.setdefault(c, n) != n:
                raise _error(f"numpy.einsum: letter '{c}' has sizes {sizes[c]} and {n}")
    if len(xs) == 2:
        return _einsum_pair(t, terms, xs, rhs, sizes)
    letters = sorted(set(lhs.replace(",", "")), key=lambda c: (c not in rhs, rhs.find(c), c))
    total = None
    for term, x in zip(terms, xs):
        x = _permute(t, x, [term.index(c) for c in letters if c in term])
        for i, c in enumerate(letters):
            if c not in term:
                x = t.apply("expand_dims", x, axis=i)
        total = x if total is None else total * x
    contracted = [i for i, c in enumerate(letters) if c not in rhs]
    # letters are ordered the output's first: what the sum leaves is rhs in order
    return t.apply("sum", total, axis=contracted) if contracted else total


def _permute(t, x, order):
    return x if list(order) == list(range(len(order))) else t.apply("transpose", x, axes=list(order))


def _reshape(x, shape):
    return x if tuple(shape) == tuple(x.shape) else x.reshape(list(shape))


def _einsum_pair(t, terms, xs, rhs, sizes):
    (ta, tb), (x, y) = terms, xs
    # a letter in one operand only and not in the output is summed away first
    for k, (term, other) in enumerate(((ta, tb), (tb, ta))):
        alone = [i for i, c in enumerate(term) if c not in other and c not in rhs]
        if alone:
            xs[k] = t.apply("sum", xs[k], axis=alone)
            terms[k] = "".join(c for c in term if c in other or c in rhs)
    (ta, tb), (x, y) = terms, xs
    batch = [c for c in ta if c in tb and c in rhs]
    inner = [c for c in ta if c in tb and c not in rhs]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    size = lambda letters: math.prod(sizes[c] for c in letters)  # noqa: E731
    lead = [sizes[c] for c in batch]
    xm = _reshape(_permute(t, x, [ta.index(c) for c in batch + free_a + inner]), lead + [size(free_a), size(inner)])
    ym = _reshape(_permute(t, y, [tb.index(c) for c in batch + inner + free_b]), lead + [size(inner), size(free_b)])
    z = _reshape(t.apply("matmul", xm, ym), lead + [sizes[c] for c in free_a + free_b])
    return _permute(t, z, [(batch + free_a + free_b).index(c) for c in rhs])


# --- matrices ---------------------------------------------------------------------------------------


def trace(t, a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    _refuse("trace", dtype=dtype, out=out)
    x = _v(t, a)
    if x.ndim != 2 or _axes((axis1, axis2), 2) != (0, 1):
        raise _error("numpy.trace: only a 2-D array's trace (axis1=0, axis2=1) can be traced")
    return t.apply("sum", x * np.eye(*x.shape, k=offset))


def diag(t, v, k=0):
    """1-D: w[:, None] * eye(n, k), w being v padded to n = len(v) + |k| on the side that lines it up with
    the k-th diagonal (a constant 0/1 mask: exact); 2-D: its k-th diagonal (take)."""
    x = _v(t, v)
    if x.ndim == 1:
        k = int(k)
        n = x.shape[0] + abs(k)
        w = t.apply("pad", x, pads=[0, k] if k >= 0 else [-k, 0]) if k else x
        return t.apply("expand_dims", w, axis=1) * np.eye(n, k=k)
    if x.ndim == 2:
        return diagonal(t, x, offset=k)
    raise _error("numpy.diag: input must be 1-D or 2-D")


def diagonal(t, a, offset=0, axis1=0, axis2=1):
    x = _v(t, a)
    if x.ndim != 2 or _axes((axis1, axis2), 2) != (0, 1):
        raise _error("numpy.diagonal: only a 2-D array's diagonal can be traced")
    rows, cols = x.shape
    i = np.arange(max(0, -offset), min(rows, cols - offset))
    y = t.apply("take", x.reshape(-1), (i * cols + i + offset).astype(np.int64), axis=0)
    y._readonly = "diagonal"  # NumPy's is a read-only view: updating it in place fails there
    return y


def _tri_mask(t, m, k, upper: bool):
    x = _v(t, m)
    if x.ndim < 2:
        raise _error(f"numpy.{'triu' if upper else 'tril'}: only arrays of 2 or more axes can be traced")
    ones = np.ones(x.shape[-2:])
    return x * (np.triu(ones, k) if upper else np.tril(ones, k))


def triu(t, m, k=0):
    return _tri_mask(t, m, k, True)


def tril(t, m, k=0):
    return _tri_mask(t, m, k, False)


# --- rearranging --------------------------------------------------------------------------------


def flip(t, m, axis=None):
    x = _v(t, m)
    axes = _axes(axis, x.ndim)
    return x[tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim))]


def fliplr(t, m):
    return flip(t, m, 1)


def flipud(t, m):
    return flip(t, m, 0)


def roll(t, a, shift, axis=None):
    """NumPy's pairing: shift and axis broadcast against each other and the shifts on one axis add up
    (np.roll(x, (1, 2), axis=0) rolls by 3; axis=None rolls the flattened array by their sum). Always a new
    array, as NumPy's (a roll by a multiple of n too)."""
    x = _v(t, a)
    if axis is None:
        return _new_array(t, roll(t, x.reshape(-1), shift, 0).reshape(x.shape))
    try:
        pairs = np.broadcast(np.asarray(shift, dtype=np.int64), np.asarray(axis, dtype=np.int64))
    except ValueError:
        raise _error(f"numpy.roll: 'shift' {shift!r} and 'axis' {axis!r} should be scalars or the same "
                     "length") from None
    total = {}
    for s, ax in pairs:
        (ax,) = _axes(int(ax), x.ndim)
        total[ax] = total.get(ax, 0) + int(s)
    for ax, s in total.items():
        n = x.shape[ax]
        s = s % n if n else 0
        if s:
            head = tuple(slice(n - s, None) if i == ax else slice(None) for i in range(x.ndim))
            tail = tuple(slice(None, n - s) if i == ax else slice(None) for i in range(x.ndim))
            x = t.apply("concat", x[head], x[tail], axis=ax)
    return _new_array(t, x)


def rot90(t, m, k=1, axes=(0, 1)):
    x = _v(t, m)
    a0, a1 = _axes(axes, x.ndim)
    k = int(k) % 4
    order = list(range(x.ndim))
    order[a0], order[a1] = order[a1], order[a0]
    if k == 0:
        return x  # NumPy's m[:], a view of all of x: the same array for every later update
    if k == 2:
        return flip(t, flip(t, x, a0), a1)
    if k == 1:
        return t.apply("transpose", flip(t, x, a1), axes=order)
    return flip(t, t.apply("transpose", x, axes=order), a1)


def swapaxes(t, a, axis1, axis2):
    x = _v(t, a)
    a1, a2 = _axes((axis1, axis2), x.ndim)
    order = list(range(x.ndim))
    order[a1], order[a2] = order[a2], order[a1]
    return t.apply("transpose", x, axes=order)


def moveaxis(t, a, source, destination):
    """NumPy's order: the moved axes at their destinations (in increasing order of destination), the others
    in their order around them."""
    x = _v(t, a)
    src, dst = _axes(source, x.ndim), _axes(destination, x.ndim)
    if len(src) != len(dst):
        raise _error("numpy.moveaxis: `source` and `destination` arguments must have the same number of elements")
    order = [i for i in range(x.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return _permute(t, x, order)


def expand_dims(t, a, axis):
    """NumPy's tuple of axes: one expand_dims per axis, in increasing order of the result's axes."""
    x = _v(t, a)
    if not isinstance(axis, (tuple, list)):
        return t.apply("expand_dims", x, axis=int(axis))
    for ax in sorted(_axes(axis, x.ndim + len(axis))):
        x = t.apply("expand_dims", x, axis=ax)
    return x


def repeat(t, a, repeats, axis=None):
    """take() with the constant indices np.repeat(arange(n), repeats): each copy reads its source element."""
    x = _v(t, a)
    if axis is None:
        x, axis = x.reshape(-1), 0
    (axis,) = _axes(axis, x.ndim)
    idx = np.repeat(np.arange(x.shape[axis]), np.asarray(repeats, dtype=np.int64)).astype(np.int64)
    return t.apply("take", x, idx, axis=axis)


def tile(t, A, reps):
    """NumPy's tile pads reps or the array's shape with leading ones; the op takes one count per axis."""
    x = _v(t, A)
    reps = [int(r) for r in (reps if isinstance(reps, (tuple, list)) else (reps,))]
    if len(reps) > x.ndim:
        x = x.reshape([1] * (len(reps) - x.ndim) + list(x.shape))
    reps = [1] * (x.ndim - len(reps)) + reps
    return t.apply("tile", x, reps=reps)


def pad(t, array, pad_width, mode="constant", **kwargs):
    x = _v(t, array)
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise _error(f"numpy.pad: mode '{mode}' cannot be traced (constant, reflect, edge, wrap can)")
    value = kwargs.pop("constant_values", 0.0)
    if kwargs or np.ndim(value) != 0:
        raise _error("numpy.pad: only one scalar constant_values (and no other options) can be traced")
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2))
    if mode == "reflect":
        return _reflect(t, x, widths.copy())
    return t.apply("pad", x, pads=[int(w) for w in widths[:, 0]] + [int(w) for w in widths[:, 1]], mode=mode,
                   value=float(value))


def _reflect(t, x, widths: np.ndarray):
    """Reflect padding as NumPy does it: a width of at least the axis's length reflects the padded array again,
    in rounds of at most length - 1 per side (op 'pad' reflects less than the axis in one step)."""
    if any(n == 1 and w.any() for n, w in zip(x.shape, widths)):
        raise _error("numpy.pad: reflect padding of an axis of length 1 cannot be traced")
    while widths.any():
        step = np.minimum(widths, np.asarray(x.shape)[:, None] - 1)
        x = t.apply("pad", x, pads=[int(w) for w in step[:, 0]] + [int(w) for w in step[:, 1]], mode="reflect",
                    value=0.0)
        widths = widths - step
    return x


def sort(t, a, axis=-1, kind=None, order=None, stable=None):
    _refuse("sort", order=order)
    x = _v(t, a)
    if axis is None:
        x, axis = x.reshape(-1), 0
    perm = np.argsort(x._known(), axis=axis, kind="stable").astype(np.int64)  # trace-time permutation
    return t.apply("take_along_axis", x, perm, axis=int(axis))


def _split_at(t, x, bounds, axis):
    return [x[tuple(slice(lo, hi) if i == axis else slice(None) for i in range(x.ndim))]
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def array_split(t, ary, indices_or_sections, axis=0):
    x = _v(t, ary)
    (axis,) = _axes(axis, x.ndim)
    n = x.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        size, extra = divmod(n, k)
        bounds = np.cumsum([0] + extra * [size + 1] + (k - extra) * [size]).tolist()
    else:
        bounds = [0] + [int(i) for i in indices_or_sections] + [n]  # Python's slice rules, as NumPy's
    return _split_at(t, x, bounds, axis)


def split(t, ary, indices_or_sections, axis=0):
    x = _v(t, ary)
    if isinstance(indices_or_sections, (int, np.integer)) and x.shape[_axes(axis, x.ndim)[0]] % indices_or_sections:
        raise _error("numpy.split: array split does not result in an equal division")
    return array_split(t, x, indices_or_sections, axis)


def stack(t, arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _refuse("stack", out=out, dtype=dtype)
    xs = [_v(t, a) for a in arrays]
    if not xs:
        raise _error("numpy.stack: need at least one array to stack")
    (axis,) = _axes(axis, xs[0].ndim + 1)
    return t.apply("concat", *(t.apply("expand_dims", x, axis=axis) for x in xs), axis=axis)


def _atleast(t, x, nd: int):
    x = _v(t, x)
    if x.ndim >= nd:
        return x
    if nd == 2:
        return x.reshape(1, -1) if x.ndim == 1 else x.reshape(1, 1)
    return x.reshape(1)


def hstack(t, tup, *, dtype=None, casting="same_kind"):
    _refuse("hstack", dtype=dtype)
    xs = [_atleast(t, a, 1) for a in tup]
    return t.apply("concat", *xs, axis=0 if xs[0].ndim == 1 else 1)


def vstack(t, tup, *, dtype=None, casting="same_kind"):
    _refuse("vstack", dtype=dtype)
    return t.apply("concat", *(_atleast(t, a, 2) for a in tup), axis=0)


def column_stack(t, tup):
    xs = [_v(t, a) for a in tup]
    return t.apply("concat", *(x.reshape(-1, 1) if x.ndim == 1 else x for x in xs), axis=1)


def ravel(t, a, order="C"):
    if order != "C":
        raise _error("numpy.ravel: only order='C' can be traced")
    return _v(t, a).reshape(-1)


def copy(t, a, order="K", subok=False):
    """A new array object holding the same values: a new Value on the same node (in-place updates of the
    copy do not reach the original, as in NumPy)."""
    x = _v(t, a)
    return type(x)(t, x._node)


def _batched(t, a, one, *others):
    """NumPy's stacked linear algebra, a (..., m, m): `one(a_i, *others_i)` per matrix of the stack, the results
    stacked back into the stack's leading shape (ops inv, det and solve take one matrix). others: per-matrix
    arguments of the same leading shape."""
    lead = a.shape[:-2]
    flat = a.reshape(-1, *a.shape[-2:])
    rest = [o.reshape(-1, *o.shape[len(lead):]) for o in others]
    outs = [one(flat[i], *(r[i] for r in rest)) for i in range(flat.shape[0])]
    return stack(t, outs).reshape(*lead, *outs[0].shape)


def inv(t, a):
    x = _v(t, a)
    return t.apply("inv", x) if x.ndim <= 2 else _batched(t, x, lambda m: t.apply("inv", m))


def det(t, a):
    x = _v(t, a)
    return t.apply("det", x) if x.ndim <= 2 else _batched(t, x, lambda m: t.apply("det", m))


def solve(t, a, b):
    """numpy.linalg.solve: op 'solve' takes b as [n, k]; NumPy's 1-D b is one column. A stack of matrices
    a (..., m, m) takes b (m,) for every one of them or b (..., m, k) of the same leading shape (NumPy 2)."""
    x, y = _v(t, a), _v(t, b)
    if x.ndim > 2:
        if y.ndim == 1:  # the same b for every matrix
            return _batched(t, x, lambda m: solve(t, m, y))
        if y.ndim == x.ndim and y.shape[:-2] == x.shape[:-2]:
            return _batched(t, x, lambda m, v: solve(t, m, v), y)
        raise _error(f"numpy.linalg.solve of a stack {list(x.shape)} with b {list(y.shape)} cannot be traced "
                     "(b of shape (m,) or of the stack's leading shape (..., m, k) can)")
    if y.ndim == 1:
        return t.apply("solve", x, y.reshape(-1, 1)).reshape(-1)
    return t.apply("solve", x, y)


def floor_divide(t, a, b):
    """a // b as floor(a / b) (piecewise constant: gradient 0 between the jumps). NumPy divides by way of
    fmod, exactly: where a / b rounds onto an integer the two differ by one (0.5 // 0.1 is 4.0, floor(0.5 / 0.1)
    5.0) -- such values are refused, naming the line, rather than traced as another function."""
    known = [x._known() if isinstance(x, Traced) else np.asarray(x, dtype=np.float64) for x in (a, b)]
    with np.errstate(all="ignore"):
        same = np.floor(known[0] / known[1]) == np.floor_divide(*known)
    if not np.all(same | np.isnan(np.floor_divide(*known))):
        raise _error("// or % where a quotient rounds onto an integer (NumPy's floor_divide, by fmod, differs "
                     "there from floor(a / b)): cannot be traced as NumPy computes it")
    return t.apply("floor", t.apply("div", a, b))


def remainder(t, a, b):
    """a % b as NumPy's a - b * floor(a / b) (the divisor's sign)."""
    return t.apply("sub", a, t.apply("mul", b, floor_divide(t, a, b)))


def norm(t, x, ord=None, axis=None, keepdims=False):
    """Vector 2-norm and Frobenius norm as sqrt(sum(x^2)); ord=1 and inf of vectors as sum/max of |x|."""
    v = _v(t, x)
    axes = _axes(axis, v.ndim)
    vector = len(axes) == 1
    if ord is None or ord == "fro" and not vector or ord == 2 and vector:
        return t.apply("sqrt", t.apply("sum", t.apply("square", v), axis=list(axes), keepdims=bool(keepdims)))
    if vector and ord == 1:
        return t.apply("sum", t.apply("abs", v), axis=list(axes), keepdims=bool(keepdims))
    if vector and ord == np.inf:
        return t.apply("max", t.apply("abs", v), axis=list(axes), keepdims=bool(keepdims))
    raise _error(f"numpy.linalg.norm with ord={ord!r} over {len(axes)} axis/axes cannot be traced")


COMPOSED = {getattr(np, name): fn for name, fn in [
    ("var", var), ("std", std), ("cumsum", cumsum), ("tan", tan), ("sinh", sinh), ("cosh", cosh),
    ("log2", log2), ("log10", log10), ("exp2", exp2), ("reciprocal", reciprocal), ("degrees", degrees),
    ("rad2deg", degrees), ("radians", radians), ("deg2rad", radians), ("logaddexp", logaddexp),
    ("positive", positive), ("clip", clip), ("tensordot", tensordot), ("dot", dot), ("vdot", vdot),
    ("inner", inner), ("outer", outer), ("einsum", einsum), ("trace", trace), ("diag", diag),
    ("diagonal", diagonal), ("triu", triu), ("tril", tril), ("flip", flip), ("fliplr", fliplr),
    ("flipud", flipud), ("roll", roll), ("rot90", rot90), ("swapaxes", swapaxes), ("moveaxis", moveaxis),
    ("repeat", repeat), ("tile", tile), ("expand_dims", expand_dims), ("pad", pad), ("sort", sort), ("split", split),
    ("array_split", array_split), ("stack", stack), ("hstack", hstack), ("vstack", vstack),
    ("column_stack", column_stack), ("ravel", ravel), ("copy", copy), ("fabs", lambda t, x: t.apply("abs", x)),
    ("floor_divide", floor_divide), ("remainder", remainder),
]} | {np.linalg.norm: norm, np.linalg.solve: solve, np.linalg.inv: inv, np.linalg.det: det}


def _astype(x, dtype, order="K", casting="unsafe", subok=True, copy=True):
    if np.dtype(dtype) != np.float64:
        raise _error(f"astype({np.dtype(dtype)}) of a traced value: the trace computes in float64 (the server's "
                     "dtype option sets the engine's precision); only astype(float) can be traced")
    return globals()["copy"](x.tracer, x) if copy else x  # copy=False: NumPy's same array, not a copy


def _function(name: str):
    return lambda x, *args, **kwargs: getattr(np, name)(x, *args, **kwargs)  # dispatched back to the tracer


def _flatten(x, order="C"):
    y = ravel(x.tracer, x, order)
    y.detach()  # a copy in NumPy: not a view of x
    return y


def _sort_in_place(x, *args, **kwargs):
    raise _error("x.sort() sorts a traced value in place: write `x = np.sort(x)`")


# ndarray methods a traced value answers (Value.__getattr__): NumPy's function of the same name, traced as a
# NumPy call (a registry op by its NumPy name, or a composition above)
METHODS = {name: _function(name) for name in (
    "var", "std", "prod", "cumsum", "dot", "clip", "trace", "diagonal", "repeat", "swapaxes", "ravel", "copy",
    "squeeze")} | {"astype": _astype, "flatten": _flatten, "sort": _sort_in_place}
