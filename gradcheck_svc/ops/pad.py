"""pad: ONNX Pad with static pads (begins then ends, one pair per axis) and the
constant, reflect, edge and wrap modes.

The VJP of a non-constant mode is the adjoint of a gather: along each padded
axis the output reads input index np.pad(arange(n), mode), so the gradient is
a scatter-add of g over those indices (repeated reads accumulate).
"""
from __future__ import annotations

import numpy as np

from ..backend import scatter_add
from ..errors import GraphError
from .base import FLOAT, REALS, Attr, Case, OpDef, Spec, lead_of, save_nothing
from .registry import register

MODES = ("constant", "reflect", "edge", "wrap")


def _infer(node, specs, attrs):
    x = specs[0].shape
    r = len(x)
    pads = list(attrs["pads"])
    if len(pads) != 2 * r or min(pads, default=0) < 0:
        raise GraphError(f"pad needs {2 * r} non-negative pads (begins then ends), got {pads}", node=node)
    widths = tuple((pads[i], pads[r + i]) for i in range(r))
    if attrs["mode"] == "reflect" and any(max(w) >= n for w, n in zip(widths, x)):
        raise GraphError(f"reflect padding {pads} must be smaller than the input {list(x)}", node=node)
    if attrs["mode"] in ("edge", "wrap") and any(max(w) > 0 and n == 0 for w, n in zip(widths, x)):
        raise GraphError("edge/wrap padding of an empty axis", node=node)
    out = tuple(n + b + e for n, (b, e) in zip(x, widths))
    return Spec(out, FLOAT), {"widths": widths, "mode": attrs["mode"], "value": attrs["value"], "in_shape": x}


def _pad(xp, x, widths, mode, value, in_shape):
    full = [(0, 0)] * lead_of(x, len(in_shape)) + list(widths)
    if mode == "constant":
        return xp.pad(x, full, mode="constant", constant_values=value)
    return xp.pad(x, full, mode=mode)


def _pad_vjp(xp, g, saved, widths, mode, value, in_shape):
    if mode == "constant":
        return (g[tuple(slice(b, b + n) for (b, _), n in zip(widths, in_shape))],)
    for axis, ((b, e), n) in enumerate(zip(widths, in_shape)):
        if not b and not e:
            continue
        idx = xp.asarray(np.pad(np.arange(n), (b, e), mode=mode))
        moved = xp.moveaxis(g, axis, 0)
        z = xp.zeros((n,) + moved.shape[1:], dtype=g.dtype)
        g = xp.moveaxis(scatter_add(xp, z, idx, moved), 0, axis)
    return (g,)


def _cases(rng):
    s = REALS.sample
    return [Case([s(rng, (2, 3))], {"pads": [1, 0, 0, 2], "value": 0.5}),
            Case([s(rng, (1, 2, 4, 3))], {"pads": [0, 0, 2, 1, 0, 0, 1, 2], "mode": "reflect"}),
            Case([s(rng, (3, 2))], {"pads": [2, 1, 1, 3], "mode": "edge"}),
            Case([s(rng, (4,))], {"pads": [3, 2], "mode": "wrap"})]


register(OpDef(
    name="pad", forward=_pad, vjp=_pad_vjp, infer=_infer, arity=1, input_kinds=(FLOAT,),
    attrs={"pads": Attr("ints", doc="begins then ends, one per axis"),
           "mode": Attr("str", "constant", MODES), "value": Attr("float", 0.0, doc="constant mode's fill")},
    save=save_nothing, cases=_cases, doc="ONNX Pad with static pads: constant, reflect, edge or wrap"))
