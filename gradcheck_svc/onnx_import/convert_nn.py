"""Today's transformer and MobileNet ops: HardSigmoid, Gelu, LayerNormalization (with its stash outputs),
GatherElements, Trilu, TopK (MoE routing), Resize and Upsample (U-Nets), AffineGrid and GridSample (spatial
transformers). (Erf and HardSwish are registry ops ONNX names as they are: converters.py.)

Where ONNX defines a function body for an op, the converter says whether it follows it.
"""
from __future__ import annotations


import numpy as np

from ..errors import GraphError
from .context import Unsupported
from .converters import _axis, _ins, _ints, _present, converter


def simple_fraction(v: float) -> float:
    """A float32 attribute that is the rounding of a fraction with a small denominator (PyTorch's
    HardSigmoid alpha 1/6, ONNX's default 0.2), read as that fraction: ONNX stores attributes in float32,
    and the exporter's model meant the exact value; any other value is taken as stored."""
    from fractions import Fraction

    f = Fraction(v).limit_denominator(64)
    return float(f) if np.float32(float(f)) == np.float32(v) else v


@converter("HardSigmoid")
def _hard_sigmoid(ctx, node, a, opset):
    attrs = {"alpha": simple_fraction(a.get("alpha", 0.2)), "beta": simple_fraction(a.get("beta", 0.5))}
    return ctx.emit("hard_sigmoid", _ins(ctx, node), attrs, name=node.output[0])


@converter("Gelu")
def _gelu(ctx, node, a, opset):
    """opset 20 Gelu: the registry's gelu (its function body: the erf or the tanh form, the same
    formulas). PyTorch's exporters below opset 20 write the erf form out as Div, Erf, Add, Mul nodes,
    which import op by op."""
    approximate = a.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"Gelu with approximate '{approximate}'")
    return ctx.emit("gelu", _ins(ctx, node), {"approximate": approximate}, name=node.output[0])


@converter("LayerNormalization")
def _layer_norm(ctx, node, a, opset):
    """One layer_norm node (its own derivative rule, not ONNX's function body of ReduceMean, Sub, Pow,
    Sqrt, Div nodes: the same formula). stash_type (the precision of the moments) is the engine's dtype.
    The stash outputs Mean and InvStdDev, when a model reads them, are composed of registry ops."""
    ins = _ins(ctx, node)
    x = ins[0]
    rank = len(ctx.shape(x))
    axis = a.get("axis", -1)
    eps = a.get("epsilon", 1e-5)
    outs = [ctx.emit("layer_norm", ins, {"axis": axis, "epsilon": eps}, name=node.output[0])]
    if any(o for o in node.output[1:]):
        ax = _axis(axis, rank)
        over = {"axis": list(range(ax, rank)), "keepdims": True}
        mean = ctx.emit("mean", [x], over, name=node.output[1] or None)
        centered = ctx.emit("sub", [x, mean])
        var = ctx.emit("mean", [ctx.emit("square", [centered])], over)
        std = ctx.emit("sqrt", [ctx.emit("add", [var, ctx.scalar(eps)])])
        inv = ctx.emit("div", [ctx.scalar(1.0), std], name=node.output[2] if len(node.output) > 2 and
                       node.output[2] else None)
        outs += [mean, inv]
    return outs


@converter("GatherElements")
def _gather_elements(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    axis = _axis(a.get("axis", 0), len(shape))
    if not ctx.is_const(node.input[1]):  # computed indices (TopK's), non-negative, checked when they are made
        return ctx.emit("take_along_axis", [x, ctx.value(node.input[1])], {"axis": axis}, name=node.output[0])
    idx = np.asarray(ctx.const(node.input[1], "indices")).astype(np.int64)
    n = shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise Unsupported(f"GatherElements with an index out of range [-{n}, {n - 1}]")
    idx = np.where(idx < 0, idx + n, idx)  # ONNX allows negative indices; take_along_axis's vjp does not
    name = ctx.add_input(ctx.fresh(f"{node.output[0]}/indices"), idx, False, "int64")
    return ctx.emit("take_along_axis", [x, name], {"axis": axis}, name=node.output[0])


@converter("GatherND")
def _gather_nd(ctx, node, a, opset):
    """Constant indices (CLIP's pooled token: each row's position of its largest id, from the int input): each
    index tuple is one position of data's first axes, so data's first b + k axes flattened into one, then
    `take` at the flat positions (batch_dims b: each batch element's own coordinates prepended)."""
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    idx = np.asarray(ctx.const(node.input[1], "indices")).astype(np.int64)
    b = int(a.get("batch_dims", 0))
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or b < 0 or b >= idx.ndim or b + k > len(shape) or tuple(idx.shape[:b]) != tuple(shape[:b]):
        raise GraphError(f"GatherND node {ctx.onnx_name!r}: indices {list(idx.shape)} (batch_dims {b}) do not fit "
                         f"data {list(shape)}", field="model")
    bounds = np.asarray(shape[b:b + k], dtype=np.int64)
    if idx.size and (np.any(idx < -bounds) or np.any(idx >= bounds)):
        raise GraphError(f"GatherND node {ctx.onnx_name!r}: an index is out of range for data {list(shape)}",
                         field="model")
    idx = np.where(idx < 0, idx + bounds, idx)
    batch = [np.broadcast_to(g, idx.shape[:-1]) for g in np.indices(idx.shape[:b], sparse=True)] if b else []
    coords = batch + [idx[..., j] for j in range(k)]
    flat = np.ravel_multi_index(coords, shape[:b + k]) if coords else np.zeros(idx.shape[:-1], np.int64)
    rows = ctx.emit("reshape", [x], {"shape": [int(np.prod(shape[:b + k], dtype=np.int64))] + list(shape[b + k:])})
    at = ctx.add_input(ctx.fresh(f"{node.output[0]}/indices"), np.asarray(flat, dtype=np.int64), False, "int64")
    return ctx.emit("take", [rows, at], {"axis": 0}, name=node.output[0])


@converter("Trilu")
def _trilu(ctx, node, a, opset):
    """The kept triangle as a constant mask: where(mask, x, 0) (the k-th diagonal and below for
    upper=0, on and above for upper=1; x's leading axes are a batch of matrices)."""
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    if len(shape) < 2:
        raise Unsupported("Trilu of a value of rank < 2")
    k = np.asarray(ctx.const(node.input[1], "k")).reshape(-1) if _present(node, 1) else np.zeros(1, np.int64)
    if k.size != 1 or k.dtype.kind not in "iu":
        raise GraphError(f"Trilu node {node.name or node.output[0]!r}: k must be one integer, not {k.size} "
                         f"{k.dtype} values", field="model")
    n, m = shape[-2:]
    # a diagonal beyond the matrix keeps all of it or none, as the nearest one past its edge does (and NumPy
    # overflows on k = -2**63): the same mask, exactly
    k = int(min(max(int(k[0]), -n), m))
    keep = np.triu(np.ones((n, m), bool), k) if a.get("upper", 1) else np.tril(np.ones((n, m), bool), k)
    mask = ctx.add_input(ctx.fresh(f"{node.output[0]}/mask"), keep, False, "bool")
    return ctx.emit("where", [mask, x, ctx.scalar(0.0)], name=node.output[0])




@converter("Range")
def _range(ctx, node, a, opset):
    """Constant float bounds: the values, as a constant (int ones are folded before any converter);
    computed bounds would set the output's length by their values."""
    if not all(ctx.is_const(n) for n in node.input):
        raise Unsupported("Range of computed values (its length would depend on them)")
    start, limit, delta = (np.asarray(ctx.const(n)).reshape(()) for n in node.input)
    if delta == 0 or not np.isfinite([start, limit, delta]).all():
        raise GraphError(f"Range node '{ctx.onnx_name}': delta {delta} from {start} to {limit} has no length",
                         node=ctx.onnx_name)
    # ONNX's length, max(ceil((limit - start) / delta), 0), known before a value is made
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    ctx.charge(n, f"the output of Range node '{ctx.onnx_name}'")
    values = np.arange(start, limit, delta, dtype=np.result_type(start, limit, delta))
    return ctx.add_input(node.output[0], values, False, ctx.float_dtype)


@converter("Einsum")
def _einsum(ctx, node, a, opset):
    return ctx.emit("einsum", _ins(ctx, node), {"equation": a["equation"]}, name=node.output[0])


@converter("ScatterElements")
def _scatter_elements(ctx, node, a, opset):
    """Constant indices (an attribute of the registry op, checked there); computed ones (TopK's: a MoE's
    `zeros_like(p).scatter(-1, topi, topv)`) an int64 input of put_along_axis, checked as they are computed;
    reduction none or add. The gradient reaches data and updates, never the indices."""
    reduction = a.get("reduction", "none")
    if reduction not in ("none", "add"):
        raise Unsupported(f"ScatterElements with reduction {reduction}")
    data, upd = ctx.value(node.input[0]), ctx.value(node.input[2])
    if not ctx.is_const(node.input[1]):
        idx = ctx.value(node.input[1])
        attrs = {"axis": _axis(a.get("axis", 0), len(ctx.shape(data))), "reduction": reduction}
        return ctx.emit("put_along_axis", [data, idx, upd], attrs, name=node.output[0])
    indices = np.asarray(ctx.const(node.input[1], "indices")).astype(np.int64).tolist()
    attrs = {"axis": a.get("axis", 0), "indices": indices, "reduction": reduction}
    return ctx.emit("scatter_elements", [data, upd], attrs, name=node.output[0])


# --- sequences of a static length (the dynamo exporter's split without its optimizer) ----------------


@converter("SplitToSequence")
def _split_to_sequence(ctx, node, a, opset):
    """Slices of the input along `axis`, kept as a list of values (no node of its own)."""
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    axis = _axis(a.get("axis", 0), len(shape))
    n = shape[axis]
    if _present(node, 1):
        split = np.asarray(ctx.const(node.input[1], "split")).astype(np.int64)
        sizes = [int(split)] * (n // int(split)) + ([n % int(split)] if n % int(split) else []) \
            if split.ndim == 0 else [int(v) for v in split]
    else:
        sizes = [1] * n
    if sum(sizes) != n:
        raise Unsupported(f"SplitToSequence with split sizes {sizes} for an axis of {n}")
    keep = a.get("keepdims", 1) or _present(node, 1)  # keepdims applies only without `split`
    parts, start = [], 0
    for size in sizes:
        part = ctx.emit("slice", [x], {"starts": [start], "ends": [start + size], "axes": [axis]})
        if not keep:
            part = ctx.emit("squeeze", [part], {"axis": [axis]})
        parts.append(part)
        start += size
    ctx.sequences[node.output[0]] = parts
    return [None]


@converter("SequenceEmpty")
def _sequence_empty(ctx, node, a, opset):
    ctx.sequences[node.output[0]] = []
    return [None]


@converter("SequenceInsert")
def _sequence_insert(ctx, node, a, opset):
    """A tensor appended (or inserted at a constant position) to a sequence held here as a list (an unrolled
    Loop's carried sequence: loops.py)."""
    parts = ctx.sequences.get(node.input[0])
    if parts is None:
        raise Unsupported("SequenceInsert into a sequence not made by SequenceEmpty or SplitToSequence")
    parts = list(parts)
    at = int(np.asarray(ctx.const(node.input[2], "position")).reshape(-1)[0]) if _present(node, 2) else len(parts)
    if not -len(parts) <= at <= len(parts):
        raise Unsupported(f"SequenceInsert position {at} into a sequence of {len(parts)}")
    parts.insert(at if at >= 0 else at + len(parts), ctx.value(node.input[1]))
    ctx.sequences[node.output[0]] = parts
    return [None]


@converter("ConcatFromSequence")
def _concat_from_sequence(ctx, node, a, opset):
    parts = ctx.sequences.get(node.input[0])
    if not parts:
        raise Unsupported("ConcatFromSequence of an empty sequence or one not made here")
    axis = a["axis"]
    if a.get("new_axis", 0):
        axis = _axis(axis, len(ctx.shape(parts[0])) + 1)
        parts = [ctx.emit("reshape", [p], {"shape": [*ctx.shape(p)[:axis], 1, *ctx.shape(p)[axis:]]}) for p in parts]
    return ctx.emit("concat", parts, {"axis": axis}, name=node.output[0])


@converter("SequenceAt")
def _sequence_at(ctx, node, a, opset):
    parts = ctx.sequences.get(node.input[0])
    if parts is None:
        raise Unsupported("SequenceAt of a sequence not made by SplitToSequence")
    i = int(np.asarray(ctx.const(node.input[1], "position")).reshape(-1)[0])
    if not -len(parts) <= i < len(parts):
        raise Unsupported(f"SequenceAt position {i} of a sequence of {len(parts)}")
    part = parts[i]  # a node under the output's name (an alias would leave the name to another value)
    return ctx.emit("reshape", [part], {"shape": list(ctx.shape(part))}, name=node.output[0])


@converter("TopK")
def _top_k(ctx, node, a, opset):
    """Values: top_k (the gradient flows to the selected elements); indices: top_k_indices (int64, no
    gradient), read by Gather / GatherElements. sorted=0 leaves the order open: the sorted one is one."""
    x = ctx.value(node.input[0])
    k = int(a["k"]) if opset < 10 else int(np.asarray(ctx.const(node.input[1], "K")).reshape(-1)[0])
    rank = len(ctx.shape(x))
    attrs = {"k": k, "axis": _axis(a.get("axis", -1), rank) - rank, "largest": bool(a.get("largest", 1))}
    values = ctx.emit("top_k", [x], attrs, name=node.output[0] or ctx.fresh(f"{ctx.onnx_name}/values"))
    indices = None
    if _present_out(node, 1):
        indices = ctx.emit("top_k_indices", [x], attrs, name=node.output[1])
        ctx.indices_of[indices] = (x, attrs)
    return [values, indices]


def _present_out(node, i: int) -> bool:
    return len(node.output) > i and bool(node.output[i])


RESIZE_TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


@converter("Resize", "Upsample")
def _resize(ctx, node, a, opset):
    """nearest and linear (bilinear, trilinear) with the coordinate transformations PyTorch exports; cubic,
    antialias, tf_crop_and_resize and a kept aspect ratio are refused by name. Upsample (opset 7-9) is
    Resize with asymmetric coordinates and floor rounding (ONNX's own reading: a repeat)."""
    x = ctx.value(node.input[0])
    rank = len(ctx.shape(x))
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise Unsupported(f"{node.op_type} with mode {mode}")
    if node.op_type == "Upsample":
        transform, rounding = "asymmetric", "floor"
        scales = a["scales"] if "scales" in a else _floats(ctx.const(node.input[1], "scales"))
        sizes = None
    else:
        if opset < 11:
            raise Unsupported("Resize before opset 11 (its coordinate mapping is not stated)")
        transform = a.get("coordinate_transformation_mode", "half_pixel")
        rounding = a.get("nearest_mode", "round_prefer_floor")
        for bad, why in ((transform not in RESIZE_TRANSFORMS, f"coordinate_transformation_mode {transform}"),
                         (a.get("antialias", 0), "antialias"),
                         (a.get("keep_aspect_ratio_policy", "stretch") != "stretch",
                          f"keep_aspect_ratio_policy {a.get('keep_aspect_ratio_policy')}")):
            if bad:
                raise Unsupported(f"Resize with {why}")
        scales = _floats(ctx.const(node.input[2], "scales")) if _present(node, 2) else None
        sizes = _ints(ctx.const(node.input[3], "sizes")) if _present(node, 3) else None
        scales = scales or None  # opset 11-12 pass an empty scales beside sizes
        axes = [_axis(v, rank) for v in a["axes"]] if a.get("axes") else None
        if axes is not None:  # opset 18: scales or sizes for these axes only
            full_scales, full_sizes = [1.0] * rank, list(ctx.shape(x))
            for i, ax in enumerate(axes):
                if scales:
                    full_scales[ax] = scales[i]
                if sizes:
                    full_sizes[ax] = sizes[i]
            scales, sizes = (full_scales, None) if scales else (None, full_sizes)
    attrs = {"mode": mode, "coordinate_transformation_mode": transform, "nearest_mode": rounding}
    attrs.update({"sizes": sizes} if sizes else {"scales": scales})
    return ctx.emit("resize", [x], attrs, name=node.output[0])


@converter("GridSample")
def _grid_sample(ctx, node, a, opset):
    """F.grid_sample (spatial transformers), 4-D: grid_sample_corners (int64, no gradient: where each grid
    point falls and how padding maps it) and grid_sample, which reads them (ops/grid_sample.py). bicubic
    (opset 20: cubic) and 5-D inputs are refused by name."""
    x, grid = _ins(ctx, node)
    mode = {"linear": "bilinear"}.get(a.get("mode", "bilinear"), a.get("mode", "bilinear"))
    padding = a.get("padding_mode", "zeros")
    if mode not in ("bilinear", "nearest") or padding not in ("zeros", "border", "reflection"):
        raise Unsupported(f"GridSample with mode {a.get('mode')} and padding_mode {padding}")
    if len(ctx.shape(x)) != 4:
        raise Unsupported(f"GridSample of a rank-{len(ctx.shape(x))} input (only 4-D: [N, C, H, W])")
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": bool(a.get("align_corners", 0))}
    corners = ctx.emit("grid_sample_corners", [x, grid], attrs)
    return ctx.emit("grid_sample", [x, grid, corners], attrs, name=node.output[0])


@converter("AffineGrid")
def _affine_grid(ctx, node, a, opset):
    """F.affine_grid (2-D): the base grid [x, y, 1] of each output pixel (a constant) times theta transposed,
    a matmul, so theta's gradient is the matmul's. The size must be a constant; 3-D (a 5-D size) is refused."""
    theta = ctx.value(node.input[0])
    size = _ints(ctx.const(node.input[1], "size"))
    if len(size) != 4 or ctx.shape(theta) != (size[0], 2, 3):
        raise Unsupported(f"AffineGrid of theta {list(ctx.shape(theta))} and size {size} (only 2-D: [N, 2, 3], "
                          "[N, C, H, W])")
    n, _, h, w = size

    def line(k):  # pixel centres in [-1, 1] (align_corners: the corner pixels' centres at -1 and 1)
        return np.linspace(-1.0, 1.0, k) if a.get("align_corners", 0) else (np.arange(k) * 2.0 + 1.0) / k - 1.0
    ys, xs = np.meshgrid(line(h), line(w), indexing="ij")
    base = np.stack([xs, ys, np.ones_like(xs)], axis=-1).reshape(h * w, 3)
    base = ctx.add_input(ctx.fresh(f"{ctx.onnx_name}/base"), base, False, ctx.float_dtype)
    grid = ctx.emit("matmul", [base, ctx.emit("transpose", [theta], {"axes": [0, 2, 1]})])
    return ctx.emit("reshape", [grid], {"shape": [n, h, w, 2]}, name=node.output[0])


def _floats(v) -> list[float]:
    return [float(e) for e in np.asarray(v).reshape(-1)]
