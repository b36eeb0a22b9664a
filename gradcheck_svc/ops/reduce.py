"""Reductions over axes: sum, mean, max, min, and the 2-norm.

User attributes: `axis` (an int, a list of ints, or null for all axes) and
`keepdims`. `infer` normalizes them to negative `axes` so the same forward
runs on arrays carrying leading batch axes.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from .base import FLOAT, REALS, Attr, Case, Kink, OpDef, Spec, norm_axes, save_nothing
from .registry import register
from .slices import independent

REDUCE_ATTRS = {
    "axis": Attr("axes", None, doc="int, list of ints, or null for all axes"),
    "keepdims": Attr("bool", False),
}


def _infer_reduce(node, specs, attrs):
    shape = specs[0].shape
    axis = attrs["axis"]
    one = [axis] if isinstance(axis, int) and not isinstance(axis, bool) else axis
    if not shape and isinstance(one, list) and len(one) == 1 and one[0] in (0, -1) and not isinstance(one[0], bool):
        # NOTE a 0-d tensor reduced over dim 0 or -1: PyTorch takes it as reducing over nothing (the
        # value itself, keepdim or not), where NumPy refuses the axis; we follow PyTorch
        axes = ()
    else:
        axes = norm_axes(node, axis, len(shape))
    keep = bool(attrs["keepdims"])
    out = tuple(1 if i - len(shape) in axes else d for i, d in enumerate(shape)) if keep else tuple(
        d for i, d in enumerate(shape) if i - len(shape) not in axes
    )
    count = math.prod(shape[a] for a in axes)
    return Spec(out, FLOAT), {"axes": axes, "keepdims": keep, "in_shape": shape, "count": count}


def _keep(xp, g, axes, keepdims):
    """g with the reduced axes present (size 1), whatever keepdims was."""
    return g if keepdims or not axes else xp.expand_dims(g, axes)


def _cases(rng):
    specs = [((2, 3, 4), None, False), ((2, 3, 4), 1, False), ((2, 3, 4), [0, 2], True),
             ((2, 3), -1, True), ((5,), 0, False), ((1, 3), 0, False)]
    return [Case([REALS.sample(rng, s)], {"axis": a, "keepdims": k}) for s, a, k in specs]


def _infer_extremum(node, specs, attrs):
    spec, out = _infer_reduce(node, specs, attrs)
    if out["count"] == 0 and math.prod(spec.shape) > 0:
        # NumPy raises here and so does PyTorch: a max over nothing has no identity
        raise GraphError(f"reduction over an axis of size 0 (input {list(specs[0].shape)}) has no identity",
                         node=node)
    return spec, out


def _kept_axis(axis, attrs):
    """Where an axis the reduction keeps lands in its output (negative); None for a reduced one."""
    if axis in attrs["axes"]:
        return None
    return axis if attrs["keepdims"] else axis + sum(1 for a in attrs["axes"] if a > axis)


_PER_POSITION = independent(_kept_axis)


def _linear_sliced(xp, op, xs, base_out, attrs):
    """sum and mean: a kept axis stays a slice; summing over the changed axis is the unperturbed sum
    plus the reduction of the change alone -- B x one slice of work instead of B x the whole input
    (an elementwise chain ending in a sum costs O(n), not O(n^2), for n perturbations)."""
    (x,) = xs
    if x.axis not in attrs["axes"]:
        return _PER_POSITION(xp, op, xs, base_out, attrs)
    return base_out + op.forward(xp, xp.expand_dims(x.values - x.old(xp), x.axis), **attrs)


def reduction(name, forward, vjp, save, sympy_doc, kinks=(), identity=True, linear=False, select=None, frozen=None,
              numpy=True, complex_step=True):
    register(OpDef(
        name=name, forward=forward, vjp=vjp, infer=_infer_reduce if identity else _infer_extremum, arity=1,
        input_kinds=(FLOAT,), attrs=REDUCE_ATTRS, save=save, kinks=tuple(kinks), cases=_cases, doc=sympy_doc,
        numpy=name if numpy else None,  # np.sum, np.mean, np.max, np.min take the same axis and keepdims
        sliced=_linear_sliced if linear else _PER_POSITION, select=select, frozen=frozen, linear=linear,
        complex_step=complex_step))


def _sum(xp, x, axes, keepdims, **_):
    return xp.sum(x, axis=axes, keepdims=keepdims)


def _mean(xp, x, axes, keepdims, count, **_):
    return xp.sum(x, axis=axes, keepdims=keepdims) / count


reduction("sum", _sum,
          lambda xp, g, s, axes, keepdims, in_shape, **_: (xp.broadcast_to(_keep(xp, g, axes, keepdims), in_shape),),
          save_nothing, "sum over axes", linear=True)
reduction("mean", _mean,
          lambda xp, g, s, axes, keepdims, in_shape, count, **_: (
              xp.broadcast_to(_keep(xp, g, axes, keepdims) / count, in_shape),),
          save_nothing, "mean over axes", linear=True)


def _extremum_vjp(xp, g, s, axes, keepdims, **_):
    # NOTE max/min: ties share the gradient evenly (as torch.amax/amin).
    x, y = s
    mask = (x == _keep(xp, y, axes, keepdims)).astype(g.dtype)
    count = xp.sum(mask, axis=axes, keepdims=True)
    return (mask * (_keep(xp, g, axes, keepdims) / count),)


def _extremum_select(pick):
    """The piece of max/min: per element its share of the output, 1 for the extremum, 1/c for each of c
    tied ones (as the convention splits the gradient), 0 for the rest."""
    def select(xp, x, axes, keepdims, **_):
        mask = (x == _keep(xp, getattr(xp, pick)(x, axis=axes, keepdims=keepdims), axes, keepdims)).astype(x.dtype)
        return mask / xp.sum(mask, axis=axes, keepdims=True)
    return select


def _extremum_frozen(xp, s, x, axes, keepdims, **_):
    return xp.sum(xp.where(s > 0, x * s, 0.0), axis=axes, keepdims=keepdims)


def _tie_gap(xs, attrs):
    """Per reduced group, the gap between the two largest (or smallest) elements."""
    x = np.asarray(xs[0])
    axes = attrs["axes"]
    rank = x.ndim
    keep = [a + rank for a in range(-rank, 0) if a not in axes]
    moved = np.moveaxis(x, [a + rank for a in axes], list(range(rank - len(axes), rank)))
    flat = moved.reshape(tuple(x.shape[k] for k in keep) + (-1,))
    if flat.shape[-1] < 2:
        return np.full(flat.shape[:-1], np.inf)
    top = np.sort(flat, axis=-1)
    return np.minimum(top[..., -1] - top[..., -2], top[..., 1] - top[..., 0])


for _name, _fn in (("max", "max"), ("min", "min")):
    reduction(
        _name,
        (lambda f: lambda xp, x, axes, keepdims, **_: getattr(xp, f)(x, axis=axes, keepdims=keepdims))(_fn),
        _extremum_vjp,
        lambda xs, y, **_: (xs[0], y),
        f"{_name} over axes",
        kinks=[Kink("ties for the extremum", "gradient split evenly among the tied elements", _tie_gap)],
        identity=False, select=_extremum_select(_fn), frozen=_extremum_frozen,
    )


# NOTE norm: the 2-norm over the axes, sqrt(sum(x^2)). Where a whole reduced slice is 0 it has no derivative
# (a cone's tip: |t| along every direction); the gradient there is 0, the subgradient torch.linalg.vector_norm
# and Tensor.norm give, and central differences agree (|h| - |-h| = 0). Composed as sqrt(sum(square)), the
# sqrt's derivative was infinite there and a model taking the norm of a zero slice (a zero-initialized bias,
# a padded row) could not be verified. No frozen piece: a cone has none, and the differences straddle the tip
# symmetrically. No complex step at a zero slice: sqrt((i h)^2) = i h is not the norm's extension there.
def _slice_norm(xs, attrs):
    """Per input element, its slice's norm: the distance from the kink (the slice all zeros). Input-shaped,
    not output-shaped as an elementwise op's: the kink's elements are then the parameter's that sit there
    (diagnosis/kinks.py maps them by broadcasting; a reduced shape would not map back)."""
    x = np.asarray(xs[0], dtype=np.float64)
    return np.broadcast_to(_norm(np, x, attrs["axes"], True), x.shape)


def _norm(xp, x, axes, keepdims, **_):
    return xp.sqrt(xp.sum(x * x, axis=axes, keepdims=keepdims))


def _norm_vjp(xp, g, s, axes, keepdims, **_):
    x, y = s
    y = _keep(xp, y, axes, keepdims)
    return (xp.where(y > 0, x / xp.where(y > 0, y, 1), 0) * _keep(xp, g, axes, keepdims),)


reduction("norm", _norm, _norm_vjp, lambda xs, y, **_: (xs[0], y), "2-norm over axes, sqrt(sum(x^2))",
          kinks=[Kink("a reduced slice all zeros", "gradient 0 (as torch.linalg.vector_norm)", _slice_norm)],
          numpy=False, complex_step=lambda xs, attrs: bool(np.all(_slice_norm(xs, attrs) > 0)))
