"""Masks and casts: ONNX's comparisons and logic (registry mask ops, mapped by OpDef.onnx in
converters.py), Where, IsInf's sign options, Cast and CastLike between float and bool.

A mask computed from float values is a bool value of the graph (no gradient flows through it; a
parameter read only through a mask gets an exact zero). Casts between int and float of computed values
are refused: the engine runs one float dtype, and int values exist only as import-time constants.
"""
from __future__ import annotations

import numpy as np

from ..ops.base import BOOL, FLOAT, INT
from .context import Filled, Unsupported
from .converters import _ins, converter


@converter("Where")
def _where(ctx, node, a, opset):
    cond, x, y = _ins(ctx, node)
    if ctx.dtype(cond) != BOOL or FLOAT not in (ctx.dtype(x), ctx.dtype(y)):
        raise Unsupported("Where on non-float values of a computed value")
    x, y = (_as_float(ctx, v) for v in (x, y))
    return ctx.emit("where", [cond, x, y], name=node.output[0])


def _as_float(ctx, name):
    if ctx.dtype(name) == FLOAT:
        return name
    raise Unsupported("Where with an int branch beside a computed float branch")


@converter("IsInf")
def _isinf(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    neg, pos = a.get("detect_negative", 1), a.get("detect_positive", 1)
    if neg and pos:
        return ctx.emit("isinf", [x], name=node.output[0])
    if not (neg or pos):  # ONNX: neither sign detected: all false
        return ctx.emit("logical_and", [ctx.emit("isinf", [x]), ctx.emit("isnan", [x])], name=node.output[0])
    side = ctx.emit("less" if neg else "greater", [x, ctx.scalar(0.0)])
    return ctx.emit("logical_and", [ctx.emit("isinf", [x]), side], name=node.output[0])


def _cast_to(ctx, node, x: str, to: np.dtype):
    """x (a computed value) cast to `to`: float <-> float is an alias, bool <-> float a mask op."""
    src = ctx.dtype(x)
    if to.kind == "f":
        if src == FLOAT:
            return x  # float -> float: the engine runs one float dtype
        if src == BOOL:  # a mask as 0.0 / 1.0
            return ctx.emit("where", [x, ctx.scalar(1.0), ctx.scalar(0.0)], name=node.output[0])
    elif to.kind in "iu" and src == INT and to.itemsize == 8:  # int64 -> int64 (TopK's indices): an alias
        return x
    elif to.kind == "b":
        if src == BOOL:
            return x
        if src == FLOAT:  # nonzero (NaN included, as NumPy's and ONNX's reference cast)
            return ctx.emit("logical_not", [ctx.emit("equal", [x, ctx.scalar(0.0)])], name=node.output[0])
    raise Unsupported(f"{node.op_type} of a computed {src} value to {to}")


def _cast_constant(ctx, node, to: np.dtype):
    """A constant cast is a constant (the importer folds only non-float work itself): [None], the output
    stored; None when the input is computed."""
    v = ctx.consts.get(node.input[0])  # (a parameter is no constant: it is not in consts)
    if v is None:
        return None
    if isinstance(v, Filled):
        if to.kind != "f":
            v = v.materialize(np.float64)
        else:
            ctx.consts[node.output[0]] = v
            return [None]
    with np.errstate(invalid="ignore"):  # -inf to an integer, as the model asks (masked later: T5's buckets)
        ctx.consts[node.output[0]] = np.asarray(v).astype(np.float64 if to.kind == "f" else to)
    return [None]


@converter("Cast")
def _cast(ctx, node, a, opset):
    from onnx import helper

    to = np.dtype(helper.tensor_dtype_to_np_dtype(a.get("to")))
    return _cast_constant(ctx, node, to) or _cast_to(ctx, node, ctx.value(node.input[0]), to)


@converter("CastLike")
def _cast_like(ctx, node, a, opset):
    """Cast to the type of the second input, a constant (its dtype) or a computed value (its class)."""
    target = node.input[1]
    if ctx.is_const(target):
        to = np.asarray(ctx.const(target)).dtype
    else:
        to = np.dtype({FLOAT: np.float64, BOOL: np.bool_}.get(ctx.dtype(ctx.value(target)), np.int64))
    return _cast_constant(ctx, node, to) or _cast_to(ctx, node, ctx.value(node.input[0]), to)


COMPARISONS = {"Equal": "equal", "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
               "GreaterOrEqual": "greater_equal"}


@converter(*COMPARISONS)
def _comparison(ctx, node, a, opset):
    """Of float values: the mask op; Equal of two masks: not xor. (Int values are import-time constants,
    folded before any converter.)"""
    x, y = _ins(ctx, node)
    kinds = {ctx.dtype(x), ctx.dtype(y)}
    if kinds == {FLOAT}:
        return ctx.emit(COMPARISONS[node.op_type], [x, y], name=node.output[0])
    if kinds == {BOOL} and node.op_type == "Equal":
        return ctx.emit("logical_not", [ctx.emit("logical_xor", [x, y])], name=node.output[0])
    raise Unsupported(f"{node.op_type} of {' and '.join(sorted(kinds))} values")
