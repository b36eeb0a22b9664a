"""ONNX ops composed at import from registry ops, so no derivative rule is written for them: each
composition's gradient is its parts' (checked by their own rules and oracles).

- CumSum: prefix sums in log2(n) steps (Hillis-Steele, as the client tracer's numpy.cumsum:
  gradcheck_core/numpy_compose.py): y += y shifted by 1, 2, 4, ... along the axis (a slice padded with
  zeros); exclusive shifts x by one first, reverse shifts toward the start. Linear: its gradient is exact,
  n log n elements and no constant (a triangular matrix would be n^2 of request data).
- ReduceL2 = the registry's norm (its gradient 0 where a slice is all zeros, as torch's); ReduceProd = the
  registry's prod; ReduceLogSumExp = the registry's
  stable logsumexp along one axis (several axes moved last and merged into one first). Axes as ONNX
  defines them by opset (an attribute before 18, an input from 18 on); noop_with_empty_axes with no axes
  reduces over nothing (x itself), as ONNX's reference does -- except ReduceL2, where ONNX's spec (x) and
  reference (|x|) differ: refused.
- Celu(x) = alpha * elu(x / alpha).
- DepthToSpace and SpaceToDepth (modes DCR and CRD): reshape, transpose, reshape.
"""
from __future__ import annotations

import numpy as np

from .context import Unsupported
from .converters import _axes_of, _axis, _ins, _ints, converter


@converter("CumSum")
def _cumsum(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    axis_v = np.asarray(ctx.const(node.input[1], "axis"))
    if axis_v.size != 1 or not -len(shape) <= _ints(axis_v)[0] < len(shape):
        raise Unsupported(f"CumSum with axis {_ints(axis_v)} for a rank-{len(shape)} input (one axis within it)")
    axis = _axis(_ints(axis_v)[0], len(shape))
    n, reverse = shape[axis], bool(a.get("reverse", 0))
    if a.get("exclusive", 0) and n:
        x = _shifted(ctx, x, axis, 1, reverse)
    step = 1
    while step < n:
        x = ctx.emit("add", [x, _shifted(ctx, x, axis, step, reverse)],
                     name=node.output[0] if 2 * step >= n else None)
        step *= 2
    return x


def _shifted(ctx, x: str, axis: int, step: int, reverse: bool) -> str:
    """x moved `step` places along the axis, zeros where it moved from: toward the end (or, reverse, the
    start)."""
    shape = ctx.shape(x)
    n, rank = shape[axis], len(shape)
    starts, ends = ([step], [n]) if reverse else ([0], [n - step])
    kept = ctx.emit("slice", [x], {"starts": starts, "ends": ends, "axes": [axis]})
    pads = [0] * (2 * rank)
    pads[axis + rank if reverse else axis] = step
    return ctx.emit("pad", [kept], {"pads": pads})


def _reduce_axes(ctx, node, a, opset, rank: int):
    """The axes reduced (non-negative, sorted); [] when noop_with_empty_axes and no axes are given."""
    axes = _axes_of(ctx, node, a, opset, 18)
    if not axes:
        if not a.get("noop_with_empty_axes", 0):
            return list(range(rank))
        if node.op_type == "ReduceL2":
            raise Unsupported("ReduceL2 with noop_with_empty_axes and no axes (ONNX's spec says x, its reference |x|)")
        return []
    return sorted({_axis(int(ax), rank) for ax in axes})


def _kept_shape(shape, axes, keepdims: bool) -> list[int]:
    return [1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes]


@converter("ReduceL2")
def _reduce_l2(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    axes = _reduce_axes(ctx, node, a, opset, len(ctx.shape(x)))
    return ctx.emit("norm", [x], {"axis": axes, "keepdims": bool(a.get("keepdims", 1))}, name=node.output[0])


@converter("ReduceProd")
def _reduce_prod(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    axes = _reduce_axes(ctx, node, a, opset, len(ctx.shape(x)))
    if not axes:
        return x
    return ctx.emit("prod", [x], {"axis": axes, "keepdims": bool(a.get("keepdims", 1))}, name=node.output[0])


@converter("ReduceLogSumExp")
def _reduce_logsumexp(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = list(ctx.shape(x))
    axes = _reduce_axes(ctx, node, a, opset, len(shape))
    if not axes:
        return x
    kept = [i for i in range(len(shape)) if i not in axes]
    if axes != list(range(len(shape) - len(axes), len(shape))):
        x = ctx.emit("transpose", [x], {"axes": kept + axes})
    merged = ctx.emit("reshape", [x], {"shape": [shape[i] for i in kept] + [-1]})
    y = ctx.emit("logsumexp", [merged], {"axis": -1, "keepdims": False})
    return ctx.emit("reshape", [y], {"shape": _kept_shape(shape, axes, bool(a.get("keepdims", 1)))},
                    name=node.output[0])


@converter("Celu")
def _celu(ctx, node, a, opset):
    alpha = float(a.get("alpha", 1.0))
    (x,) = _ins(ctx, node)
    if alpha == 1.0:
        return ctx.emit("elu", [x], {"alpha": 1.0}, name=node.output[0])
    y = ctx.emit("elu", [ctx.emit("div", [x, ctx.scalar(alpha)])], {"alpha": 1.0})
    return ctx.emit("mul", [y, ctx.scalar(alpha)], name=node.output[0])


def _nchw(ctx, node, x):
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise Unsupported(f"{node.op_type} of a rank-{len(shape)} input (ONNX defines it for N, C, H, W)")
    return shape


def _mode(node, a) -> str:
    mode = a.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("DCR", "CRD"):
        raise Unsupported(f"{node.op_type} with mode '{mode}' (DCR or CRD)")
    return mode


@converter("DepthToSpace")
def _depth_to_space(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    (n, c, h, w), b = _nchw(ctx, node, x), int(a["blocksize"])
    mode = _mode(node, a)
    if mode == "DCR":
        split, perm = [n, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2]
    else:
        split, perm = [n, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3]
    if c % (b * b):
        raise Unsupported(f"DepthToSpace of {c} channels with blocksize {b} (channels must divide by {b * b})")
    moved = ctx.emit("transpose", [ctx.emit("reshape", [x], {"shape": split})], {"axes": perm})
    return ctx.emit("reshape", [moved], {"shape": [n, c // (b * b), h * b, w * b]}, name=node.output[0])


@converter("SpaceToDepth")
def _space_to_depth(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    (n, c, h, w), b = _nchw(ctx, node, x), int(a["blocksize"])
    if h % b or w % b:
        raise Unsupported(f"SpaceToDepth of {h}x{w} with blocksize {b} (both must divide by it)")
    split = ctx.emit("reshape", [x], {"shape": [n, c, h // b, b, w // b, b]})
    perm = [0, 3, 5, 1, 2, 4] if _mode(node, a) == "DCR" else [0, 1, 3, 5, 2, 4]  # its mode: opset 25 on
    moved = ctx.emit("transpose", [split], {"axes": perm})
    return ctx.emit("reshape", [moved], {"shape": [n, c * b * b, h // b, w // b]}, name=node.output[0])
