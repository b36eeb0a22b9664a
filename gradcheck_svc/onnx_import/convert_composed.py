"""ONNX ops composed at import from registry ops, so no derivative rule is written for them: each
composition's gradient is its parts' (checked by their own rules and oracles).

- CumSum: an einsum with a constant 0/1 triangular matrix along the axis (exclusive and reverse choose
  the triangle); O(n^2) along that axis, which is small in the models that use it (positions, masks).
"""
from __future__ import annotations

import string

import numpy as np

from .context import Unsupported
from .converters import _axis, _ins, _ints, converter


def _const(ctx, what: str, value: np.ndarray) -> str:
    """A float constant of the composition (not a parameter)."""
    return ctx.add_input(ctx.fresh(f"{ctx.onnx_name}/{what}"), value, False, ctx.float_dtype)


@converter("CumSum")
def _cumsum(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    axis_v = np.asarray(ctx.const(node.input[1], "axis"))
    if axis_v.size != 1:
        raise Unsupported(f"CumSum with an axis of shape {list(axis_v.shape)} (one axis)")
    axis = _axis(_ints(axis_v)[0], len(shape))
    n = shape[axis]
    j, i = np.indices((n, n))  # out[..., i, ...] = sum over j of x[..., j, ...] * tri[j, i]
    if a.get("reverse", 0):
        tri = j > i if a.get("exclusive", 0) else j >= i
    else:
        tri = j < i if a.get("exclusive", 0) else j <= i
    letters = string.ascii_letters[:len(shape)]
    z = string.ascii_letters[len(shape)]
    out = letters[:axis] + z + letters[axis + 1:]
    equation = f"{letters},{letters[axis]}{z}->{out}"
    return ctx.emit("einsum", [x, _const(ctx, "triangle", tri.astype(np.float64))], {"equation": equation},
                    name=node.output[0])
