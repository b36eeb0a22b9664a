"""Shape ops (reshape, transpose, broadcast_to, expand_dims, squeeze, concat,
slice), indexing (take, take_along_axis) and constants.

Forward functions find the number of leading batch axes as x.ndim minus the
static rank recorded by `infer`, so they run on batched arrays unchanged.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import scatter_add
from ..errors import GraphError
from .base import (
    BOOL,
    FLOAT,
    INT,
    REALS,
    Attr,
    Case,
    OpDef,
    Spec,
    broadcast_shapes,
    lead_of,
    norm_axes,
    norm_axis,
    save_nothing,
)
from .registry import register
from .slices import Sliced


def _grad_reshape(xp, g, s, in_shape, **_):
    return (g.reshape(in_shape),)


# --- reshape -----------------------------------------------------------------------


def _infer_reshape(node, specs, attrs):
    src = specs[0].shape
    shape = list(attrs["shape"])
    if shape.count(-1) > 1:
        raise GraphError("reshape: at most one dimension may be -1", node=node)
    if any(d < -1 for d in shape):
        raise GraphError(f"reshape: invalid dimension in {shape}", node=node)
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or math.prod(src) % known:
            raise GraphError(f"cannot reshape {list(src)} to {shape}", node=node)
        shape[shape.index(-1)] = math.prod(src) // known
    if math.prod(shape) != math.prod(src):
        raise GraphError(f"cannot reshape {list(src)} to {shape}", node=node)
    return Spec(tuple(shape), specs[0].dtype), {"shape": tuple(shape), "in_shape": src}


register(OpDef(
    name="reshape", numpy="reshape",
    forward=lambda xp, x, shape, in_shape: x.reshape(x.shape[: lead_of(x, len(in_shape))] + shape),
    vjp=_grad_reshape, infer=_infer_reshape, arity=1, input_kinds=(FLOAT,),
    attrs={"shape": Attr("ints", doc="new shape; one entry may be -1")}, save=save_nothing, linear=True,
    cases=lambda rng: [Case([REALS.sample(rng, (2, 3))], {"shape": [3, 2]}),
                       Case([REALS.sample(rng, (2, 3, 1))], {"shape": [-1]}),
                       Case([REALS.sample(rng, ())], {"shape": [1, 1]})],
    doc='the same elements in a new shape (numpy.reshape; one dimension may be -1)'))

# --- transpose ---------------------------------------------------------------------


def _infer_transpose(node, specs, attrs):
    src = specs[0].shape
    r = len(src)
    perm = attrs["axes"]
    if perm is None:
        perm = list(range(r))[::-1]
    perm = [norm_axis(node, a, r, "axes entry") + r for a in perm]
    if sorted(perm) != list(range(r)):
        raise GraphError(f"axes {attrs['axes']} is not a permutation of {r} axes", node=node)
    return Spec(tuple(src[p] for p in perm), specs[0].dtype), {"perm": tuple(perm)}


def _transpose(xp, x, perm):
    lead = lead_of(x, len(perm))
    return xp.transpose(x, tuple(range(lead)) + tuple(lead + p for p in perm))


register(OpDef(
    name="transpose", numpy="transpose", forward=_transpose,
    vjp=lambda xp, g, s, perm: (xp.transpose(g, tuple(np.argsort(perm))),),
    infer=_infer_transpose, arity=1, input_kinds=(FLOAT,),
    attrs={"axes": Attr("ints", None, doc="permutation; default reverses the axes")}, save=save_nothing, linear=True,
    cases=lambda rng: [Case([REALS.sample(rng, (2, 3))], {}),
                       Case([REALS.sample(rng, (2, 3, 4))], {"axes": [1, 2, 0]}),
                       Case([REALS.sample(rng, (2, 1, 4))], {"axes": [0, -1, 1]})],
    doc='permute the axes (numpy.transpose; default: reverse them)'))

# --- broadcast_to ------------------------------------------------------------------


def _infer_broadcast_to(node, specs, attrs):
    src, shape = specs[0].shape, tuple(attrs["shape"])
    if broadcast_shapes(node, [src, shape]) != shape:
        raise GraphError(f"cannot broadcast {list(src)} to {list(shape)}", node=node)
    return Spec(shape, specs[0].dtype), {"shape": shape, "in_shape": src}


def _broadcast_to(xp, x, shape, in_shape):
    lead = lead_of(x, len(in_shape))
    x = x.reshape(x.shape[:lead] + (1,) * (len(shape) - len(in_shape)) + x.shape[lead:])
    return xp.broadcast_to(x, x.shape[:lead] + shape)


register(OpDef(
    name="broadcast_to", numpy="broadcast_to", forward=_broadcast_to,
    vjp=lambda xp, g, s, **_: (g,),  # the engine sums g back to the input's shape
    infer=_infer_broadcast_to, arity=1, input_kinds=(FLOAT,),
    attrs={"shape": Attr("ints")}, save=save_nothing, linear=True,
    cases=lambda rng: [Case([REALS.sample(rng, (3,))], {"shape": [2, 3]}),
                       Case([REALS.sample(rng, (2, 1))], {"shape": [4, 2, 3]}),
                       Case([REALS.sample(rng, ())], {"shape": [2]})],
    doc="repeat x to a larger shape by NumPy's broadcasting rules"))

# --- tile --------------------------------------------------------------------------


def _infer_tile(node, specs, attrs):
    src, reps = specs[0].shape, tuple(attrs["reps"])
    if len(reps) != len(src) or any(r < 0 for r in reps):
        raise GraphError(f"tile needs one repeat count >= 0 per axis of {list(src)}, got {list(reps)}", node=node)
    return Spec(tuple(d * r for d, r in zip(src, reps)), specs[0].dtype), {"reps": reps, "in_shape": src}


def _tile(xp, x, reps, in_shape):
    return xp.tile(x, (1,) * lead_of(x, len(in_shape)) + reps)


def _tile_vjp(xp, g, s, reps, in_shape):
    # output axis i is reps[i] blocks of in_shape[i]: split it into (block, within) and sum the blocks
    split = tuple(v for r, d in zip(reps, in_shape) for v in (r, d))
    return (xp.sum(g.reshape(split), axis=tuple(range(0, len(split), 2))),)


register(OpDef(
    name="tile", numpy="tile", forward=_tile, vjp=_tile_vjp, infer=_infer_tile, arity=1, input_kinds=(FLOAT,),
    attrs={"reps": Attr("ints", doc="repeat count per axis (as many as x has axes)")}, save=save_nothing,
    cases=lambda rng: [Case([REALS.sample(rng, (2, 3))], {"reps": [2, 3]}),
                       Case([REALS.sample(rng, (3,))], {"reps": [1]}),
                       Case([REALS.sample(rng, (2, 1, 2))], {"reps": [1, 4, 2]})],
    doc="repeat x whole along each axis (numpy.tile, ONNX Tile)"))

# --- expand_dims / squeeze ----------------------------------------------------------


def _infer_expand_dims(node, specs, attrs):
    src = specs[0].shape
    r = len(src) + 1
    axis = norm_axis(node, attrs["axis"], r)
    out = list(src)
    out.insert(axis + r, 1)
    return Spec(tuple(out), specs[0].dtype), {"axis": axis, "in_shape": src}


register(OpDef(
    name="expand_dims", numpy="expand_dims", forward=lambda xp, x, axis, in_shape: xp.expand_dims(x, axis),
    vjp=_grad_reshape, infer=_infer_expand_dims, arity=1, input_kinds=(FLOAT,),
    attrs={"axis": Attr("int")}, save=save_nothing, linear=True,
    cases=lambda rng: [Case([REALS.sample(rng, (2, 3))], {"axis": 1}),
                       Case([REALS.sample(rng, (3,))], {"axis": -1}),
                       Case([REALS.sample(rng, ())], {"axis": 0})], doc='insert a size-1 axis at the given position'))


def _infer_squeeze(node, specs, attrs):
    src = specs[0].shape
    r = len(src)
    if attrs["axis"] is None:
        axes = tuple(i - r for i, d in enumerate(src) if d == 1)
    else:
        axes = norm_axes(node, attrs["axis"], r)
        for a in axes:
            if src[a] != 1:
                raise GraphError(f"cannot squeeze axis {a + r} of size {src[a]}", node=node)
    out = tuple(d for i, d in enumerate(src) if i - r not in axes)
    return Spec(out, specs[0].dtype), {"axes": axes, "in_shape": src}


register(OpDef(
    name="squeeze", numpy="squeeze", forward=lambda xp, x, axes, in_shape: xp.squeeze(x, axis=axes) if axes else x,
    vjp=_grad_reshape, infer=_infer_squeeze, arity=1, input_kinds=(FLOAT,),
    attrs={"axis": Attr("axes", None, doc="axes of size 1 to drop; default all")}, save=save_nothing, linear=True,
    cases=lambda rng: [Case([REALS.sample(rng, (2, 1, 3))], {}),
                       Case([REALS.sample(rng, (1, 3, 1))], {"axis": 0})],
    doc='remove size-1 axes (all of them, or those given)'))

# --- concat ------------------------------------------------------------------------


def _infer_concat(node, specs, attrs):
    # NOTE PyTorch's legacy rule: a 1-D empty input (shape [0]) is skipped, whatever the others' rank
    legacy = tuple(i for i, s in enumerate(specs) if tuple(s.shape) == (0,))
    kept = [s for i, s in enumerate(specs) if i not in legacy]
    if not kept or all(len(s.shape) == 1 for s in kept):  # all 1-D: an ordinary concatenation
        legacy, kept = (), list(specs)
    first = kept[0].shape
    r = len(first)
    if r == 0:
        raise GraphError("concat inputs must have at least 1 dimension", node=node)
    axis = norm_axis(node, attrs["axis"], r)
    for s in kept[1:]:
        if len(s.shape) != r or any(a != b for i, (a, b) in enumerate(zip(s.shape, first)) if i - r != axis):
            raise GraphError(
                f"concat inputs differ outside axis {axis + r}: {list(first)} vs {list(s.shape)}", node=node
            )
    out = list(first)
    out[axis] = sum(s.shape[axis] for s in kept)
    # sizes: per input along the axis, 0 for a skipped one (it contributes nothing)
    sizes = tuple(0 if i in legacy else s.shape[axis] for i, s in enumerate(specs))
    return Spec(tuple(out), FLOAT), {"axis": axis, "sizes": sizes, "rank": r, "legacy": legacy}


def _concat(xp, *xs, axis, sizes, rank, legacy=()):
    xs = [x for i, x in enumerate(xs) if i not in legacy]
    lead = max(x.ndim - rank for x in xs)
    if lead:
        lead_shape = np.broadcast_shapes(*[x.shape[: x.ndim - rank] for x in xs])
        xs = [xp.broadcast_to(x, lead_shape + x.shape[x.ndim - rank:]) for x in xs]
    return xp.concatenate(xs, axis=axis)


def _concat_vjp(xp, g, s, axis, sizes, rank, legacy=()):
    kept = [n for i, n in enumerate(sizes) if i not in legacy]
    parts = iter(xp.split(g, np.cumsum(kept)[:-1].tolist(), axis=axis))
    return tuple(xp.zeros((0,), dtype=g.dtype) if i in legacy else next(parts) for i in range(len(sizes)))


def _concat_sliced(xp, op, xs, base_out, attrs):
    """A change along the concatenation axis stays one slice, shifted past the inputs before it."""
    changed = [i for i, x in enumerate(xs) if isinstance(x, Sliced)]
    if len(changed) != 1 or xs[changed[0]].axis != attrs["axis"] or changed[0] in attrs.get("legacy", ()):
        return None
    x = xs[changed[0]]
    return Sliced(base_out, x.axis, x.index + sum(attrs["sizes"][:changed[0]]), x.values)


register(OpDef(
    name="concat", numpy="concatenate", forward=_concat, vjp=_concat_vjp, infer=_infer_concat, arity=None,
    input_kinds=(FLOAT,), attrs={"axis": Attr("int", 0)}, save=save_nothing, sliced=_concat_sliced, linear=True,
    cases=lambda rng: [Case([REALS.sample(rng, (2, 3)), REALS.sample(rng, (1, 3))], {"axis": 0}),
                       Case([REALS.sample(rng, (2, 1)), REALS.sample(rng, (2, 2)), REALS.sample(rng, (2, 3))],
                            {"axis": -1})],  # (the legacy empty input: tests/ops/test_concat_legacy_empty_torch.py)
    doc="concatenate along an existing axis (numpy.concatenate)"))

# --- slice -------------------------------------------------------------------------


def _infer_slice(node, specs, attrs):
    src = specs[0].shape
    r = len(src)
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = list(attrs["axes"]) if attrs["axes"] is not None else list(range(len(starts)))
    steps = list(attrs["steps"]) if attrs["steps"] is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise GraphError("slice: starts, ends, axes and steps must have the same length", node=node)
    index = [slice(None)] * r
    seen = set()
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        a = norm_axis(node, ax, r) + r
        if a in seen:
            raise GraphError(f"slice: axis {ax} given twice", node=node)
        if sp == 0:
            raise GraphError("slice: step must not be 0", node=node)
        seen.add(a)
        index[a] = slice(st, en, sp)
    out = tuple(len(range(*s.indices(d))) for s, d in zip(index, src))
    return Spec(out, specs[0].dtype), {"index": tuple(index), "in_shape": src}


def _slice_vjp(xp, g, s, index, in_shape):
    z = xp.zeros(in_shape, dtype=g.dtype)
    z[index] = g
    return (z,)


register(OpDef(
    name="slice", forward=lambda xp, x, index, in_shape: x[(Ellipsis,) + index],
    vjp=_slice_vjp, infer=_infer_slice, arity=1, input_kinds=(FLOAT,),
    attrs={"starts": Attr("ints"), "ends": Attr("ints"), "axes": Attr("ints", None), "steps": Attr("ints", None)},
    save=save_nothing, linear=True,
    cases=lambda rng: [Case([REALS.sample(rng, (4, 5))], {"starts": [1, 0], "ends": [3, 5], "steps": [1, 2]}),
                       Case([REALS.sample(rng, (6,))], {"starts": [-1], "ends": [-7], "steps": [-2]}),
                       Case([REALS.sample(rng, (2, 3, 4))], {"starts": [1], "ends": [3], "axes": [-1]})],
    doc="ONNX-style slice: starts, ends, optional axes and steps"))

# --- take / take_along_axis (int64 indices) ---------------------------------------


def _zero_d_index(node, what, attrs, idx_shape, allowed):
    """A 0-d input indexed along dim 0 or -1 (PyTorch: index_select takes one index, gather a 0-d one,
    the result is the value itself): the attrs that say so (axis None), or a one-line refusal."""
    if attrs["axis"] not in (0, -1) or isinstance(attrs["axis"], bool) or tuple(idx_shape) not in allowed:
        raise GraphError(f"{what}: a 0-d input takes axis 0 or -1 and a single index (shape "
                         f"{' or '.join(str(list(a)) for a in allowed)}), got axis {attrs['axis']!r} and indices "
                         f"{list(idx_shape)}", node=node)
    return {"axis": None, "in_shape": ()}


def _zero_d_pick(xp, x, idx):
    """x itself, after checking that every index is 0 or -1 (the only position of a 0-d input)."""
    bad = [int(i) for i in xp.asarray(idx).reshape(-1).tolist() if int(i) not in (0, -1)]
    if bad:
        raise IndexError(f"index {bad[0]} is out of range for a 0-d input")
    return x.copy()


def _infer_take(node, specs, attrs):
    src, idx = specs[0].shape, specs[1].shape
    if not src:  # NOTE as torch.index_select on a 0-d tensor (NumPy's take would flatten instead)
        return Spec((), specs[0].dtype), {**_zero_d_index(node, "take", attrs, idx, ((), (1,))), "idx_rank": len(idx)}
    axis = norm_axis(node, attrs["axis"], len(src))
    a = axis + len(src)
    out = src[:a] + idx + src[a + 1:]
    return Spec(out, specs[0].dtype), {"axis": axis, "in_shape": src, "idx_rank": len(idx)}


def _take_vjp(xp, g, s, axis, in_shape, idx_rank):
    (idx,) = s
    if axis is None:  # a 0-d input: the value itself
        return g, None
    a = axis + len(in_shape)
    n = in_shape[a]
    idx = xp.where(idx < 0, idx + n, idx)
    # move the gathered block of g to the front, scatter-add into axis a moved to the front
    g = xp.moveaxis(g, list(range(a, a + idx_rank)), list(range(idx_rank)))
    z = xp.zeros((n,) + in_shape[:a] + in_shape[a + 1:], dtype=g.dtype)
    scatter_add(xp, z, idx.reshape(-1), g.reshape((-1,) + g.shape[idx_rank:]))
    return xp.moveaxis(z, 0, a), None


register(OpDef(
    name="take", numpy="take", forward=lambda xp, x, idx, axis, in_shape, idx_rank: (
        _zero_d_pick(xp, x, idx) if axis is None else xp.take(x, idx, axis=axis)),
    vjp=_take_vjp, infer=_infer_take, arity=2, input_kinds=(FLOAT, INT),
    attrs={"axis": Attr("int", 0)}, save=lambda xs, y, **_: (xs[1],),
    cases=lambda rng: [Case([REALS.sample(rng, (5, 3)), np.array([0, 4, 4, 1])], {"axis": 0}),
                       Case([REALS.sample(rng, (2, 4)), np.array([[3, -1], [0, 0]])], {"axis": 1})],
    doc="numpy.take: gather slices along an axis with int64 indices (repeats accumulate)"))


def _infer_take_along(node, specs, attrs):
    src, idx = specs[0].shape, specs[1].shape
    if not src and not idx:  # NOTE as torch.gather on a 0-d tensor with a 0-d index
        return Spec((), specs[0].dtype), _zero_d_index(node, "take_along_axis", attrs, idx, ((),))
    if len(src) != len(idx) or not src:
        raise GraphError(f"take_along_axis: indices rank {len(idx)} must equal input rank {len(src)}",
                         node=node)
    axis = norm_axis(node, attrs["axis"], len(src))
    for i, (a, b) in enumerate(zip(src, idx)):
        if i - len(src) != axis and 1 not in (a, b) and a != b:
            raise GraphError(f"take_along_axis: index shape {list(idx)} does not fit input {list(src)}",
                             node=node)
    # off the axis, input and indices broadcast against each other (numpy.take_along_axis,
    # torch.take_along_dim)
    out = tuple(b if i - len(src) == axis or a == 1 else a for i, (a, b) in enumerate(zip(src, idx)))
    return Spec(out, specs[0].dtype), {"axis": axis, "in_shape": src}


def _take_along(xp, x, idx, axis, in_shape):
    if axis is None:
        return _zero_d_pick(xp, x, idx)
    lead, idx_lead = lead_of(x, len(in_shape)), lead_of(idx, len(in_shape))
    if lead or idx_lead:  # batch axes on either side (computed indices: top_k_indices of a batched input)
        batch = tuple(np.broadcast_shapes(x.shape[:lead], idx.shape[:idx_lead]))
        x = xp.broadcast_to(x, batch + x.shape[lead:])
        idx = xp.broadcast_to(idx, batch + idx.shape[idx_lead:])
    return xp.take_along_axis(x, idx, axis=axis)


def _take_along_vjp(xp, g, s, axis, in_shape):
    (idx,) = s
    if axis is None:
        return g, None
    r = len(in_shape)
    n = in_shape[axis]
    idx = xp.broadcast_to(xp.where(idx < 0, idx + n, idx), g.shape)
    # scatter into the input as broadcast to the output's other dims; the engine sums a size-1
    # input dim back (fit)
    z = xp.zeros(tuple(n if i - r == axis else d for i, d in enumerate(g.shape)), dtype=g.dtype)
    grid = list(xp.indices(idx.shape, sparse=True))
    grid[axis] = idx
    scatter_add(xp, z, tuple(grid), g)
    return z, None


register(OpDef(
    name="take_along_axis", numpy="take_along_axis", forward=_take_along, vjp=_take_along_vjp,
    infer=_infer_take_along, arity=2,
    input_kinds=(FLOAT, INT), attrs={"axis": Attr("int")}, save=lambda xs, y, **_: (xs[1],),
    cases=lambda rng: [Case([REALS.sample(rng, (3, 4)), np.array([[0], [3], [3]])], {"axis": 1}),
                       Case([REALS.sample(rng, (3, 2)), np.array([[2, 0], [2, 2]])], {"axis": 0}),
                       Case([REALS.sample(rng, (1, 5)), np.array([[0, 4], [1, 1], [3, 2]])], {"axis": 1})],
    doc="numpy.take_along_axis with int64 indices (repeats accumulate)"))

# --- constant ----------------------------------------------------------------------

_DTYPE_CLASS = {"float32": FLOAT, "float64": FLOAT, "float": FLOAT, "int64": INT, "bool": BOOL}


def _infer_constant(node, specs, attrs):
    kind = _DTYPE_CLASS.get(attrs["dtype"])
    if kind is None:
        raise GraphError(f"constant: unknown dtype '{attrs['dtype']}'", node=node)
    try:
        value = np.asarray(attrs["value"], dtype=np.float64)
    except (TypeError, ValueError):
        raise GraphError("constant: value must be a number or a nested list of numbers", node=node) from None
    if kind == INT and not np.all(value == np.round(value)):
        raise GraphError("constant: int64 value must hold integers", node=node)
    return Spec(value.shape, kind), {"value": value, "kind": kind}


def _constant(xp, value, kind, dtype):
    return xp.asarray(value.astype({INT: np.int64, BOOL: np.bool_}.get(kind, dtype)))


register(OpDef(
    name="constant", forward=_constant, vjp=None, infer=_infer_constant, arity=0, input_kinds=(),
    attrs={"value": Attr("value", doc="number or nested list"), "dtype": Attr("str", "float64")},
    save=save_nothing, wants_dtype=True, cases=lambda rng: [Case([], {"value": [[1.5, -2.0]]})],
    doc="a constant tensor; float constants take the engine's float dtype"))


def _infer_constant_of_shape(node, specs, attrs):
    shape = tuple(attrs["shape"])
    if min(shape, default=0) < 0:
        raise GraphError(f"constant_of_shape: negative dimension in {list(shape)}", node=node)
    return Spec(shape, FLOAT), {"shape": shape, "value": attrs["value"]}


register(OpDef(
    name="constant_of_shape",
    forward=lambda xp, shape, value, dtype: xp.full(shape, value, dtype=dtype),
    vjp=None, infer=_infer_constant_of_shape, arity=0, input_kinds=(),
    attrs={"shape": Attr("ints"), "value": Attr("float", 0.0)}, save=save_nothing, wants_dtype=True,
    cases=lambda rng: [Case([], {"shape": [2, 3], "value": 0.02})],
    doc="ONNX ConstantOfShape (float): a tensor of one repeated value, stored as its shape, not its data"))
