"""max_pool and avg_pool over the trailing spatial axes of (N, C, *S), ONNX attributes.

Both read the windows as a strided view (ops/windows.py) and reduce its
kernel axes; their VJPs put window gradients back with windows_adjoint.
Global pooling needs no op of its own: the importer maps it to mean / max
over the spatial axes. Every axis is addressed from the end, so a leading
batch axis (finite differences) passes through.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from .base import FLOAT, Attr, Case, Kink, OpDef, Spec, save_inputs
from .registry import register
from .slices import independent
from .windows import WINDOW_ATTRS, crop_spatial, geometry, pad_spatial, windows, windows_adjoint

POOL_ATTRS = {**WINDOW_ATTRS, "ceil_mode": Attr("bool", False, doc="round the output size up")}
# every sample and channel is pooled on its own: a change in one stays in one
PER_CHANNEL = independent(lambda axis, attrs: axis if axis < -attrs["geo"].k else None)


def _infer_pool(node, specs, attrs):
    x = specs[0].shape
    if len(x) < 3:
        raise GraphError(f"pooling expects (N, C, *spatial), got {list(x)}", node=node)
    if attrs["kernel_shape"] is None:
        raise GraphError("pooling needs attribute 'kernel_shape'", node=node)
    geo = geometry(node, x[2:], attrs["kernel_shape"], attrs, ceil_mode=attrs["ceil_mode"])
    return Spec(x[:2] + geo.out, FLOAT), geo


def _flat_windows(xp, x, geo, fill):
    win = windows(xp, pad_spatial(xp, x, geo, fill), geo)
    return win.reshape(win.shape[:-geo.k] + (-1,))  # (..., *out, prod(K)), a copy


def _windows_scratch(in_shapes, out_shape, *, geo, **_):
    """_flat_windows' copy: every output element's window (the backward's window gradient is as large)."""
    return math.prod(out_shape) * math.prod(geo.kernel)


# --- max_pool ------------------------------------------------------------------------


def _infer_max(node, specs, attrs):
    spec, geo = _infer_pool(node, specs, attrs)
    return spec, {"geo": geo}


def _max_pool(xp, x, geo):
    return xp.max(_flat_windows(xp, x, geo, -np.inf), axis=-1)


def _max_pool_vjp(xp, g, saved, geo):
    # NOTE max_pool: at a tie the whole gradient goes to the first maximal element in window
    # order (row-major over the kernel), as PyTorch's CPU kernel does.
    (x,) = saved
    flat = _flat_windows(xp, x, geo, -np.inf)
    first = xp.argmax(flat, axis=-1)
    dflat = (xp.arange(flat.shape[-1]) == first[..., None]) * g[..., None]
    dwin = dflat.reshape(dflat.shape[:-1] + geo.kernel)
    return (crop_spatial(windows_adjoint(xp, dwin, geo), geo),)


def _max_pool_select(xp, x, geo):
    """The piece: each window's first maximal element (window order, as the vjp's convention at a tie), in the
    smallest integer type that holds a window's positions (finite differences keep it for the whole run)."""
    first = xp.argmax(_flat_windows(xp, x, geo, -np.inf), axis=-1)
    return first.astype(np.min_scalar_type(max(0, math.prod(geo.kernel) - 1)))


def _max_pool_frozen(xp, first, x, geo):
    """Each window's selected element, gathered from the (padded) input by its position there: no copy of
    every window (as large as the input: a complex-step copy's peak)."""
    k = geo.k
    at = xp.unravel_index(first, geo.kernel)  # the kernel offset per output element, (N, C, *out) each
    flat = 0
    for i in range(k):  # the row-major position in the padded spatial block
        o = xp.arange(geo.out[i]).reshape((-1,) + (1,) * (k - 1 - i))  # the window's index along axis i
        flat = flat * geo.padded[i] + o * geo.strides[i] + at[i] * geo.dilations[i]
    xpad = pad_spatial(xp, x, geo, -np.inf)
    src = xpad.reshape(xpad.shape[:-k] + (-1,))  # (..., N, C, prod(padded))
    idx = flat.reshape((1,) * (src.ndim - first.ndim + k - 1) + first.shape[:-k] + (-1,))
    y = xp.take_along_axis(src, xp.broadcast_to(idx, src.shape[:-1] + idx.shape[-1:]), axis=-1)
    return y.reshape(src.shape[:-1] + geo.out)


def _window_tie_gap(xs, attrs):
    """Per output element, the gap between the two largest values of its window."""
    flat = _flat_windows(np, np.asarray(xs[0], dtype=np.float64), attrs["geo"], -np.inf)
    if flat.shape[-1] < 2:
        return np.full(flat.shape[:-1], np.inf)
    top = np.sort(flat, axis=-1)
    return top[..., -1] - top[..., -2]


def _distinct(rng, shape):
    """Values in [-2, 2) at least 4/size apart: no window holds a near-tie (a kink) by chance."""
    n = int(np.prod(shape))
    return ((rng.permutation(n) + rng.uniform(0.0, 0.5)) * (4.0 / n) - 2.0).reshape(shape)


def _cases(rng, extra=None):
    s = _distinct
    return [
        Case([s(rng, (2, 2, 7))], {"kernel_shape": [3], "strides": [2], "pads": [1, 1], **(extra or {})}),
        Case([s(rng, (1, 2, 5, 5))], {"kernel_shape": [2, 2], **(extra or {})}),
        Case([s(rng, (1, 1, 5, 6))], {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1],
                                      "ceil_mode": True, **(extra or {})}),
        Case([s(rng, (1, 2, 6))], {"kernel_shape": [2], "dilations": [2], "auto_pad": "SAME_UPPER",
                                   **(extra or {})}),
    ]


register(OpDef(
    name="max_pool", forward=_max_pool, vjp=_max_pool_vjp, infer=_infer_max, arity=1, input_kinds=(FLOAT,),
    attrs=POOL_ATTRS, save=save_inputs, cases=_cases, scratch=_windows_scratch,
    select=_max_pool_select, frozen=_max_pool_frozen, frozen_linear=True,  # a gather
    kinks=(Kink("ties for a window's maximum", "gradient to the first maximal element", _window_tie_gap),),
    sliced=PER_CHANNEL, doc="ONNX MaxPool (padding never wins: pads are -inf)"))

# --- avg_pool ------------------------------------------------------------------------


def _infer_avg(node, specs, attrs):
    spec, geo = _infer_pool(node, specs, attrs)
    if attrs["count_include_pad"]:
        # explicit pads count, the extra end padding of ceil_mode does not
        explicit = geometry(node, geo.spatial, geo.kernel, attrs)
        inside = np.pad(np.ones(explicit.padded), [(0, e - p) for e, p in zip(geo.padded, explicit.padded)])
    else:
        inside = np.pad(np.ones(geo.spatial), [(geo.pads[i], geo.pads[geo.k + i]) for i in range(geo.k)])
    count = windows(np, inside, geo).sum(axis=tuple(range(-geo.k, 0)))
    return spec, {"geo": geo, "count": count}


def _avg_pool(xp, x, geo, count):
    return xp.sum(_flat_windows(xp, x, geo, 0.0), axis=-1) / xp.asarray(count, dtype=x.dtype)


def _avg_pool_vjp(xp, g, saved, geo, count):
    share = g / xp.asarray(count, dtype=g.dtype)
    dwin = xp.broadcast_to(share.reshape(share.shape + (1,) * geo.k), share.shape + geo.kernel)
    return (crop_spatial(windows_adjoint(xp, dwin, geo), geo),)


register(OpDef(
    name="avg_pool", forward=_avg_pool, vjp=_avg_pool_vjp, infer=_infer_avg, arity=1, input_kinds=(FLOAT,),
    attrs={**POOL_ATTRS, "count_include_pad": Attr("bool", False, doc="pads count in the divisor")},
    save=lambda xs, y, **_: (), cases=lambda rng: _cases(rng) + _cases(rng, {"count_include_pad": True}),
    scratch=_windows_scratch,
    sliced=PER_CHANNEL, doc="ONNX AveragePool (count_include_pad)"))
