"""Sliding windows over the trailing spatial axes, shared by convolution and pooling.

`Geometry` is the static part (kernel, strides, dilations, resolved pads,
output size), computed once by an op's `infer` from ONNX-style attributes.
`windows` is a strided *view* of the padded input (no copy, no Python loop
over pixels): shape (..., *out, *kernel). `windows_adjoint` is its transpose
(col2im): it adds window gradients back into the padded input with one
strided slice per kernel offset -- a loop over the kernel's few positions,
never over pixels. Both run unchanged with xp = numpy or cupy.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..errors import GraphError
from .base import Attr

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

WINDOW_ATTRS = {
    "kernel_shape": Attr("ints", None, doc="window size per spatial axis (default: from the weight)"),
    "strides": Attr("ints", None, doc="default 1 per axis"),
    "pads": Attr("ints", None, doc="begins then ends per spatial axis (ONNX order); default 0"),
    "dilations": Attr("ints", None, doc="default 1 per axis"),
    "auto_pad": Attr("str", "NOTSET", AUTO_PADS, "SAME_UPPER / SAME_LOWER pad so out = ceil(in / stride)"),
}


@dataclass(frozen=True)
class Geometry:
    spatial: tuple[int, ...]  # input spatial size
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends (ceil_mode's extra end padding included)
    out: tuple[int, ...]

    @property
    def k(self) -> int:
        return len(self.kernel)

    @property
    def padded(self) -> tuple[int, ...]:
        k = self.k
        return tuple(s + self.pads[i] + self.pads[k + i] for i, s in enumerate(self.spatial))


def geometry(node: str, spatial, kernel, attrs, ceil_mode: bool = False) -> Geometry:
    """Resolve strides, dilations, pads (incl. auto_pad and ceil_mode) and the output size."""
    k = len(spatial)
    kernel = tuple(kernel)

    def per_axis(key, default):
        v = attrs.get(key)
        v = tuple([default] * k) if v is None else tuple(v)
        if len(v) != k:
            raise GraphError(f"attribute '{key}' needs {k} values, got {list(v)}", node=node)
        return v

    strides, dilations = per_axis("strides", 1), per_axis("dilations", 1)
    if len(kernel) != k or min(kernel + strides + dilations, default=1) < 1:
        raise GraphError(f"kernel {list(kernel)}, strides {list(strides)} and dilations {list(dilations)} "
                         f"must be positive, one per spatial axis ({k})", node=node)
    span = tuple(d * (n - 1) + 1 for d, n in zip(dilations, kernel))
    auto = attrs.get("auto_pad") or "NOTSET"
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(math.ceil(s / st) for s, st in zip(spatial, strides))
        total = [max(0, (o - 1) * st + sp - s) for o, st, sp, s in zip(out, strides, span, spatial)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pads = tuple(small + big) if auto == "SAME_UPPER" else tuple(big + small)
    else:
        pads = (0,) * (2 * k) if auto == "VALID" or attrs.get("pads") is None else tuple(attrs["pads"])
        if len(pads) != 2 * k or min(pads) < 0:
            raise GraphError(f"attribute 'pads' needs {2 * k} non-negative values, got {list(pads)}", node=node)
        rnd = math.ceil if ceil_mode else math.floor
        out = tuple(rnd((s + pads[i] + pads[k + i] - sp) / st) + 1
                    for i, (s, sp, st) in enumerate(zip(spatial, span, strides)))
        if ceil_mode:
            # a last window that would start in the end padding is dropped (PyTorch's rule,
            # ONNX's since opset 19); the one that remains may hang over the end: pad there too
            out = tuple(o - 1 if (o - 1) * st >= s + pads[i] else o
                        for i, (o, st, s) in enumerate(zip(out, strides, spatial)))
            extra = [max(0, (o - 1) * st + sp - (s + pads[i] + pads[k + i]))
                     for i, (o, st, sp, s) in enumerate(zip(out, strides, span, spatial))]
            pads = pads[:k] + tuple(p + e for p, e in zip(pads[k:], extra))
    if min(out, default=1) < 1:
        raise GraphError(f"window {list(span)} does not fit the padded input {list(spatial)} "
                         f"(pads {list(pads)})", node=node)
    return Geometry(tuple(spatial), kernel, strides, dilations, pads, out)


def pad_spatial(xp, x, geo: Geometry, value=0.0):
    k = geo.k
    if not any(geo.pads):
        return x
    widths = [(0, 0)] * (x.ndim - k) + [(geo.pads[i], geo.pads[k + i]) for i in range(k)]
    return xp.pad(x, widths, mode="constant", constant_values=value)


def windows(xp, xpad, geo: Geometry):
    """A strided view of the padded input: (..., *out, *kernel)."""
    k = geo.k
    st = xpad.strides[-k:]
    shape = xpad.shape[:-k] + geo.out + geo.kernel
    strides = (xpad.strides[:-k] + tuple(s * n for s, n in zip(st, geo.strides))
               + tuple(s * d for s, d in zip(st, geo.dilations)))
    return xp.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides)


def windows_adjoint(xp, dwin, geo: Geometry):
    """Transpose of `windows` (col2im): dwin (..., *out, *kernel) -> gradient of the padded input."""
    k = geo.k
    lead = dwin.shape[:-2 * k]
    dx = xp.zeros(lead + geo.padded, dtype=dwin.dtype)
    for offset in itertools.product(*(range(n) for n in geo.kernel)):  # kernel positions, not pixels
        target = tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                       for o, d, s, n in zip(offset, geo.dilations, geo.strides, geo.out))
        dx[(Ellipsis,) + target] += dwin[(Ellipsis,) + offset]
    return dx


def crop_spatial(dxpad, geo: Geometry):
    k = geo.k
    index = tuple(slice(geo.pads[i], geo.pads[i] + s) for i, s in enumerate(geo.spatial))
    return dxpad[(Ellipsis,) + index] if any(geo.pads) else dxpad


def channel_view(p, k: int):
    """A per-channel vector (C,), maybe with leading batch axes, shaped to broadcast
    against (..., N, C, *spatial): (C, 1..1), or (B, 1, C, 1..1) when batched."""
    lead = p.ndim - 1
    return p.reshape(p.shape[:lead] + (1,) * min(lead, 1) + p.shape[lead:] + (1,) * k)
