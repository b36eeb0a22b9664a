"""One converter per ONNX op type: ONNX node -> registry op node(s).

A converter gets the context, the NodeProto, its attributes as a dict and the
model's opset; it returns the gradcheck value name of each output (a str for
one output). The final node of a conversion carries the ONNX output's name,
so reports, --fault and localization speak the model's own value names.
Most converters are a line: the CNN ops take ONNX's attribute names as they
are; the rest map onto existing registry ops (Gemm = matmul/mul/add,
Flatten/Unsqueeze/Reshape = reshape, Sum = add chain, ...). Inputs that
ONNX computes but gradcheck keeps static (shapes, axes, pads, slice bounds)
must be constants by the time the node is reached (folded if need be).
"""
from __future__ import annotations

import math

import numpy as np

from ..ops import all_ops
from .context import Context, Filled, Unsupported

CONVERTERS: dict = {}

# input slots a converter reads as import-time constants, never as graph values (Resize's roi, scales
# and sizes): an initializer read only there is a constant, not a parameter, under the default "weights"
STATIC_INPUTS: dict[str, tuple[int, ...]] = {"Resize": (1, 2, 3), "Upsample": (1,)}


def static_initializers(graph, initializers) -> set[str]:
    """The initializers that every node reading them reads at a STATIC_INPUTS slot."""
    static, dynamic = set(), set()
    for node in graph.node:
        slots = STATIC_INPUTS.get(node.op_type, ())
        for i, name in enumerate(node.input):
            if name in initializers:
                (static if i in slots else dynamic).add(name)
    return static - dynamic


def converter(*op_types):
    def wrap(f):
        for t in op_types:
            CONVERTERS[t] = f
        return f
    return wrap


def _ins(ctx: Context, node) -> list[str]:
    return [ctx.value(n) for n in node.input if n]


def _present(node, i: int) -> bool:
    return len(node.input) > i and bool(node.input[i])


def _ints(v) -> list[int]:
    return [int(e) for e in np.asarray(v).reshape(-1)]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _only_first_output(node, what: str):
    if any(o for o in node.output[1:]):
        raise Unsupported(f"{node.op_type} with its {what} output")


# --- elementwise, mapped to existing ops ---------------------------------------------

# ONNX's operators that are a registry op as they are (OpDef.onnx): the registry says which
UNARY = {op.onnx: op.name for op in all_ops() if op.onnx and op.arity == 1}
BINARY = {op.onnx: op.name for op in all_ops() if op.onnx and op.arity == 2}


@converter(*UNARY)
def _unary(ctx, node, a, opset):
    return ctx.emit(UNARY[node.op_type], _ins(ctx, node), name=node.output[0])


@converter(*BINARY)
def _binary(ctx, node, a, opset):
    x, y = _ins(ctx, node)
    if a.get("broadcast") and "axis" in a:  # opset < 7 broadcasting: B aligned at `axis` of A
        rank, ry = len(ctx.shape(x)), len(ctx.shape(y))
        trailing = rank - _axis(a["axis"], rank) - ry
        if trailing > 0:
            y = ctx.emit("reshape", [y], {"shape": list(ctx.shape(y)) + [1] * trailing})
    return ctx.emit(BINARY[node.op_type], [x, y], name=node.output[0])


@converter("PRelu")
def _prelu(ctx, node, a, opset):
    x, slope = _ins(ctx, node)
    xs, ss = ctx.shape(x), ctx.shape(slope)
    if len(ss) == 1 and len(xs) > 2 and ss[0] == xs[1] and ss[0] != xs[-1]:
        # opset < 7 and PyTorch's exports: a 1-D slope is per channel (axis 1)
        slope = ctx.emit("reshape", [slope], {"shape": [ss[0]] + [1] * (len(xs) - 2)})
    return ctx.emit("prelu", [x, slope], name=node.output[0])


@converter("LeakyRelu")
def _leaky_relu(ctx, node, a, opset):
    return ctx.emit("leaky_relu", _ins(ctx, node), {"negative_slope": a.get("alpha", 0.01)}, name=node.output[0])


@converter("Elu")
def _elu(ctx, node, a, opset):
    return ctx.emit("elu", _ins(ctx, node), {"alpha": a.get("alpha", 1.0)}, name=node.output[0])


@converter("Selu")
def _selu(ctx, node, a, opset):  # ONNX's defaults, as float32 values
    attrs = {"alpha": a.get("alpha", 1.67326319217681884765625), "scale": a.get("gamma", 1.05070102214813232421875)}
    return ctx.emit("elu", _ins(ctx, node), attrs, name=node.output[0])


@converter("Reciprocal")
def _reciprocal(ctx, node, a, opset):
    return ctx.emit("div", [ctx.scalar(1.0)] + _ins(ctx, node), name=node.output[0])


@converter("Clip")
def _clip(ctx, node, a, opset):
    if opset < 11:
        lo, hi = a.get("min"), a.get("max")
    else:
        lo = float(ctx.const(node.input[1], "min")) if _present(node, 1) else None
        hi = float(ctx.const(node.input[2], "max")) if _present(node, 2) else None
    attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None and math.isfinite(v)}
    return ctx.emit("clip", [ctx.value(node.input[0])], attrs, name=node.output[0])


@converter("Identity", "Dropout")
def _identity(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    if node.op_type == "Dropout":
        if _present(node, 2) and bool(ctx.const(node.input[2], "training_mode")):
            raise Unsupported("Dropout in training mode")
        if len(node.output) > 1 and node.output[1]:  # inference: the mask keeps everything
            ctx.consts[node.output[1]] = np.ones(ctx.shape(x), dtype=bool)
    return x  # inference dropout is the identity: an alias, no node


def _chain(ctx, node, op, names):
    acc = names[0]
    for i, n in enumerate(names[1:]):
        last = i == len(names) - 2
        acc = ctx.emit(op, [acc, n], name=node.output[0] if last else None)
    return acc


@converter("Sum", "Max", "Min")
def _nary(ctx, node, a, opset):
    names = _ins(ctx, node)
    if len(names) == 1:
        return names[0]
    return _chain(ctx, node, {"Sum": "add", "Max": "maximum", "Min": "minimum"}[node.op_type], names)


@converter("Mean")
def _mean(ctx, node, a, opset):
    names = _ins(ctx, node)
    total = names[0]
    for n in names[1:]:
        total = ctx.emit("add", [total, n])
    return ctx.emit("mul", [total, ctx.scalar(1.0 / len(names))], name=node.output[0])


# --- linear algebra -----------------------------------------------------------------------


@converter("MatMul")
def _matmul(ctx, node, a, opset):
    return ctx.emit("matmul", _ins(ctx, node), name=node.output[0])


@converter("Gemm")
def _gemm(ctx, node, a, opset):
    x, w = ctx.value(node.input[0]), ctx.value(node.input[1])
    if a.get("transA"):
        x = ctx.emit("transpose", [x])
    if a.get("transB"):
        w = ctx.emit("transpose", [w])
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    has_c = _present(node, 2) and beta != 0.0
    y = ctx.emit("matmul", [x, w], name=None if (has_c or alpha != 1.0) else node.output[0])
    if alpha != 1.0:
        y = ctx.emit("mul", [y, ctx.scalar(alpha)], name=None if has_c else node.output[0])
    if has_c:
        c = ctx.value(node.input[2])
        if beta != 1.0:
            c = ctx.emit("mul", [c, ctx.scalar(beta)])
        y = ctx.emit("add", [y, c], name=node.output[0])
    return y


# --- convolution, pooling, normalization (registry ops with ONNX's attribute names) --------

WINDOW_KEYS = ("kernel_shape", "strides", "pads", "dilations", "auto_pad")


def _window_attrs(a, extra=()):
    return {k: a[k] for k in WINDOW_KEYS + tuple(extra) if k in a}


@converter("Conv")
def _conv(ctx, node, a, opset):
    attrs = _window_attrs(a, ("group",))
    return ctx.emit("conv", _ins(ctx, node), attrs, name=node.output[0])


@converter("ConvTranspose")
def _conv_transpose(ctx, node, a, opset):
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise Unsupported(f"ConvTranspose with auto_pad {a['auto_pad']}")
    if "output_shape" in a:  # the pads it implies are left to the exporter to write out
        raise Unsupported("ConvTranspose with output_shape")
    attrs = {k: a[k] for k in ("kernel_shape", "strides", "pads", "dilations", "group", "output_padding") if k in a}
    return ctx.emit("conv_transpose", _ins(ctx, node), attrs, name=node.output[0])


@converter("MaxPool")
def _max_pool(ctx, node, a, opset):
    _only_first_output(node, "Indices")
    if a.get("storage_order", 0):
        raise Unsupported("MaxPool with storage_order 1")
    attrs = _window_attrs(a)
    attrs["ceil_mode"] = bool(a.get("ceil_mode", 0))
    return ctx.emit("max_pool", _ins(ctx, node), attrs, name=node.output[0])


@converter("AveragePool")
def _avg_pool(ctx, node, a, opset):
    attrs = _window_attrs(a)
    attrs["ceil_mode"] = bool(a.get("ceil_mode", 0))
    attrs["count_include_pad"] = bool(a.get("count_include_pad", 0))
    return ctx.emit("avg_pool", _ins(ctx, node), attrs, name=node.output[0])


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    axes = list(range(2, len(ctx.shape(x))))
    op = "mean" if node.op_type == "GlobalAveragePool" else "max"
    return ctx.emit(op, [x], {"axis": axes, "keepdims": True}, name=node.output[0])


@converter("BatchNormalization")
def _batch_norm(ctx, node, a, opset):
    _only_first_output(node, "running statistics")
    if a.get("training_mode", 0) or (opset < 9 and not a.get("spatial", 1)) or a.get("is_test", 1) == 0:
        raise Unsupported("BatchNormalization in training mode or non-spatial")
    return ctx.emit("batch_norm", _ins(ctx, node), {"epsilon": a.get("epsilon", 1e-5)}, name=node.output[0])


@converter("InstanceNormalization")
def _instance_norm(ctx, node, a, opset):
    """scale * (x - mean) / sqrt(var + epsilon) + B with the moments of each sample and channel (over
    the spatial axes), composed of registry ops so each piece keeps its own derivative rule."""
    x, scale, bias = _ins(ctx, node)
    rank = len(ctx.shape(x))
    spatial = {"axis": list(range(2, rank)), "keepdims": True}
    centered = ctx.emit("sub", [x, ctx.emit("mean", [x], spatial)])
    var = ctx.emit("mean", [ctx.emit("square", [centered])], spatial)
    std = ctx.emit("sqrt", [ctx.emit("add", [var, ctx.scalar(a.get("epsilon", 1e-5))])])
    per_channel = {"shape": [ctx.shape(scale)[0]] + [1] * (rank - 2)}
    y = ctx.emit("mul", [ctx.emit("div", [centered, std]), ctx.emit("reshape", [scale], per_channel)])
    return ctx.emit("add", [y, ctx.emit("reshape", [bias], per_channel)], name=node.output[0])


@converter("LRN")
def _lrn(ctx, node, a, opset):
    attrs = {k: a[k] for k in ("size", "alpha", "beta", "bias") if k in a}
    return ctx.emit("lrn", _ins(ctx, node), attrs, name=node.output[0])


@converter("Softmax", "LogSoftmax")
def _softmax(ctx, node, a, opset):
    op = "softmax" if node.op_type == "Softmax" else "log_softmax"
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    if opset >= 13:
        return ctx.emit(op, [x], {"axis": a.get("axis", -1)}, name=node.output[0])
    # before opset 13: the input is seen as 2-D, [prod(shape[:axis]), prod(shape[axis:])]
    axis = _axis(a.get("axis", 1), len(shape))
    flat = ctx.emit("reshape", [x], {"shape": [math.prod(shape[:axis]), math.prod(shape[axis:])]})
    y = ctx.emit(op, [flat], {"axis": -1})
    return ctx.emit("reshape", [y], {"shape": list(shape)}, name=node.output[0])


@converter("Pad")
def _pad(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    rank = len(ctx.shape(x))
    mode = a.get("mode", "constant")
    if opset < 11:
        pads, value = a.get("pads", a.get("paddings")), a.get("value", 0.0)
    else:
        pads = _ints(ctx.const(node.input[1], "pads"))
        value = float(ctx.const(node.input[2], "constant_value")) if _present(node, 2) else 0.0
        if _present(node, 3):  # opset 18: pads for some axes only
            axes = [_axis(v, rank) for v in _ints(ctx.const(node.input[3], "axes"))]
            full = [0] * (2 * rank)
            for i, ax in enumerate(axes):
                full[ax], full[rank + ax] = pads[i], pads[len(axes) + i]
            pads = full
    if min(pads, default=0) < 0:
        raise Unsupported("Pad with negative pads (cropping)")
    return ctx.emit("pad", [x], {"pads": list(pads), "mode": mode, "value": value}, name=node.output[0])


# --- shape ops ---------------------------------------------------------------------------


def _reshape_to(ctx, node, x, shape):
    return ctx.emit("reshape", [x], {"shape": [int(d) for d in shape]}, name=node.output[0])


@converter("Reshape")
def _reshape(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    target = a["shape"] if opset < 5 else _ints(ctx.const(node.input[1], "shape"))
    src = ctx.shape(x)
    if a.get("allowzero", 0) and 0 in target:
        raise Unsupported("Reshape with allowzero")
    return _reshape_to(ctx, node, x, [src[i] if d == 0 else d for i, d in enumerate(target)])


@converter("Flatten")
def _flatten(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    axis = _axis(a.get("axis", 1), len(shape))
    return _reshape_to(ctx, node, x, [math.prod(shape[:axis]), math.prod(shape[axis:])])


def _axes_of(ctx, node, a, opset, since: int, index: int = 1):
    """Axes from the attribute (before `since`) or from a constant input."""
    if opset < since:
        return a.get("axes")
    return _ints(ctx.const(node.input[index], "axes")) if _present(node, index) else None


@converter("Unsqueeze")
def _unsqueeze(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = list(ctx.shape(x))
    axes = _axes_of(ctx, node, a, opset, 13)
    rank = len(shape) + len(axes)
    inserted = sorted(_axis(v, rank) for v in axes)
    if x in ctx.indices_of:
        return _unsqueeze_indices(ctx, node, x, inserted)
    return _reshape_to(ctx, node, x, _inserted(shape, inserted, 1))


def _unsqueeze_indices(ctx, node, idx: str, inserted: list[int]) -> str:
    src, attrs = ctx.indices_of[idx]
    rank = len(ctx.shape(src))
    marks = _inserted(list(range(rank)), inserted, None)  # where each source axis lands
    moved = ctx.emit("reshape", [src], {"shape": _inserted(list(ctx.shape(src)), inserted, 1)})
    return _indices_again(ctx, node, moved, {**attrs, "axis": marks.index(attrs["axis"] + rank) - len(marks)})


def _inserted(items: list, at: list[int], fill) -> list:
    items = list(items)
    for ax in at:
        items.insert(ax, fill)
    return items


def _indices_again(ctx, node, src: str, attrs: dict) -> str:
    """Computed indices after a shape op (Unsqueeze, Expand: a MoE's gather of its chosen experts) are
    the same op on their float source, indexed again: top_k_indices of copies of a row are copies of its
    indices (and no int value ever needs a shape op of its own)."""
    out = ctx.emit("top_k_indices", [src], attrs, name=node.output[0])
    ctx.indices_of[out] = (src, attrs)
    return out


@converter("Squeeze")
def _squeeze(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    axes = _axes_of(ctx, node, a, opset, 13)
    return ctx.emit("squeeze", [x], {"axis": axes}, name=node.output[0])


@converter("Transpose")
def _transpose(ctx, node, a, opset):
    return ctx.emit("transpose", _ins(ctx, node), {"axes": a.get("perm")}, name=node.output[0])


@converter("Concat")
def _concat(ctx, node, a, opset):
    return ctx.emit("concat", _ins(ctx, node), {"axis": a.get("axis", 1)}, name=node.output[0])


@converter("Expand")
def _expand(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    if ctx.dtype(x) != "float" and x not in ctx.indices_of:
        raise Unsupported(f"Expand of a computed {ctx.dtype(x)} value")
    target = np.broadcast_shapes(ctx.shape(x), tuple(_ints(ctx.const(node.input[1], "shape"))))
    if x in ctx.indices_of:
        return _expand_indices(ctx, node, x, list(target))
    return ctx.emit("broadcast_to", [x], {"shape": list(target)}, name=node.output[0])


def _expand_indices(ctx, node, idx: str, target: list[int]) -> str:
    src, attrs = ctx.indices_of[idx]
    axis = attrs["axis"]  # negative: the same axis after a broadcast
    if target[axis] != ctx.shape(idx)[axis]:
        raise Unsupported("Expand of TopK's indices along their top-k axis")
    shape = list(target)
    shape[axis] = ctx.shape(src)[axis]
    lifted = ctx.emit("reshape", [src], {"shape": [1] * (len(target) - len(ctx.shape(src))) + list(ctx.shape(src))})
    return _indices_again(ctx, node, ctx.emit("broadcast_to", [lifted], {"shape": shape}), attrs)


@converter("Tile")
def _tile(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    return ctx.emit("tile", [x], {"reps": _ints(ctx.const(node.input[1], "repeats"))}, name=node.output[0])


@converter("Slice")
def _slice(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    if opset < 10:
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = _ints(ctx.const(node.input[1], "starts")), _ints(ctx.const(node.input[2], "ends"))
        axes = _ints(ctx.const(node.input[3], "axes")) if _present(node, 3) else None
        steps = _ints(ctx.const(node.input[4], "steps")) if _present(node, 4) else None
    attrs = {"starts": list(starts), "ends": list(ends)}
    if axes is not None:
        attrs["axes"] = list(axes)
    if steps is not None:
        attrs["steps"] = list(steps)
    return ctx.emit("slice", [x], attrs, name=node.output[0])


@converter("Split")
def _split(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    axis = _axis(a.get("axis", 0), len(shape))
    n_out = len(node.output)
    if opset >= 13 and _present(node, 1):
        sizes = _ints(ctx.const(node.input[1], "split"))
    elif opset < 13 and "split" in a:
        sizes = list(a["split"])
    elif opset < 2 and _present(node, 1):
        sizes = _ints(ctx.const(node.input[1], "split"))
    else:  # equal parts (opset 18: num_outputs, the last one smaller)
        part = math.ceil(shape[axis] / n_out)
        sizes = [min(part, shape[axis] - i * part) for i in range(n_out)]
    outs, start = [], 0
    for out, size in zip(node.output, sizes):
        name = out or ctx.fresh(f"{node.output[0]}/unused")
        outs.append(ctx.emit("slice", [x], {"starts": [start], "ends": [start + size], "axes": [axis]}, name=name))
        start += size
    return outs


@converter("Gather")
def _gather(ctx, node, a, opset):
    return ctx.emit("take", _ins(ctx, node), {"axis": a.get("axis", 0)}, name=node.output[0])


REDUCE = {"ReduceSum": ("sum", 13), "ReduceMean": ("mean", 18), "ReduceMax": ("max", 18),
          "ReduceMin": ("min", 18)}


@converter(*REDUCE)
def _reduce(ctx, node, a, opset):
    op, since = REDUCE[node.op_type]
    x = ctx.value(node.input[0])
    axes = _axes_of(ctx, node, a, opset, since)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return x
        axes = None
    return ctx.emit(op, [x], {"axis": axes, "keepdims": bool(a.get("keepdims", 1))}, name=node.output[0])


# --- constants -----------------------------------------------------------------------------


def constant_value(node, a):
    """The value of a Constant node as a NumPy array."""
    from onnx import numpy_helper

    if "value" in a:
        return numpy_helper.to_array(a["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in a:
            return np.asarray(a[key], dtype=dtype)
    raise Unsupported("Constant with a sparse or string value")


def constant_of_shape(ctx: Context, node, a):
    """ConstantOfShape's value: a Filled (float, emitted as a node, never as data) or an int array."""
    from onnx import numpy_helper

    shape = tuple(_ints(ctx.const(node.input[0], "shape")))
    fill = numpy_helper.to_array(a["value"]).reshape(-1) if "value" in a else np.zeros(1, np.float32)
    if fill.dtype.kind == "f":
        return Filled(shape, float(fill[0]))
    return np.full(shape, fill[0], dtype=fill.dtype)

