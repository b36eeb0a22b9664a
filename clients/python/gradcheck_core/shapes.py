"""Output shapes of traced ops, without the server: a few generic shape rules.

Which rule an op follows is not decided here: scripts/gen_client_ops.py tries these rules
against the server's own shape inference (every op's test cases, every attribute choice) and
writes the first that agrees into op_values.OPS; tests/client/test_client_ops_drift.py keeps that
table current. A new op whose shapes no rule reproduces fails the generator, by name.

Each rule: (input shapes, attributes with defaults filled in, the op's table entry) -> shape.
"""
from __future__ import annotations

import numpy as np

# a zero-stride array of any shape costs one element: enough to ask NumPy for a result's shape
_KIND_DTYPE = {"float": np.float64, "int64": np.int64, "bool": np.bool_}


def _stand_ins(shapes, kinds):
    return [np.broadcast_to(np.zeros((), _KIND_DTYPE[kinds[min(i, len(kinds) - 1)]]), s)
            for i, s in enumerate(shapes)]


def numpy_rule(shapes, attrs, entry):
    """The op's NumPy function (op_values.VALUES) on stand-ins of the inputs' shapes: once per process for each
    op, input shapes and plain attributes (_SHAPES) -- the stand-ins are the same zeros every time, so is the
    shape; a traced module asks the same few tens of times per check."""
    from .op_values import VALUES

    given = {k: v for k, v in attrs.items() if v is not None}
    key = (entry["name"], repr([tuple(s) for s in shapes]), repr(sorted(given.items()))) \
        if _plain(shapes) and _plain(given) else None
    shape = _SHAPES.get(key) if key is not None else None
    if shape is None:
        with np.errstate(all="ignore"):
            shape = tuple(np.shape(VALUES[entry["name"]](*_stand_ins(shapes, entry["inputs"]), **given)))
        if key is not None:
            if len(_SHAPES) >= _SHAPES_KEPT:
                _SHAPES.clear()
            _SHAPES[key] = shape
    return shape


_SHAPES: dict = {}  # numpy_rule's answers: (op, repr of the shapes, repr of the attributes) -> shape
_SHAPES_KEPT = 4096


def _plain(v) -> bool:
    """Whether repr(v) names v exactly (builtin scalars, strings, None, and lists, tuples, dicts of them -- not an
    array, whose repr elides its middle): only such attributes key numpy_rule's memo."""
    if v is None or type(v) in (int, float, bool, str):
        return True
    if type(v) in (list, tuple):
        return all(_plain(x) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _plain(x) for k, x in v.items())
    return False


def broadcast(shapes, attrs, entry):
    return tuple(np.broadcast_shapes(*shapes))


def same(shapes, attrs, entry):
    return tuple(shapes[0])


def scalar(shapes, attrs, entry):
    return ()


def reduce(shapes, attrs, entry):
    """Input 0 without the `axis` axes (all when None), kept as size 1 with keepdims."""
    shape, axis = tuple(shapes[0]), attrs.get("axis")
    r = len(shape)
    axes = range(r) if axis is None else [axis] if isinstance(axis, int) else axis
    axes = {a % r if r else a for a in axes}
    if attrs.get("keepdims"):
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def constant(shapes, attrs, entry):
    return tuple(np.shape(np.asarray(attrs["value"], dtype=np.float64)))


def onnx_slice(shapes, attrs, entry):
    """starts/ends/axes/steps, each entry a Python slice on its axis."""
    shape = tuple(shapes[0])
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = attrs.get("axes") or list(range(len(starts)))
    steps = attrs.get("steps") or [1] * len(starts)
    index = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        index[ax] = slice(st, en, sp)
    return tuple(len(range(*s.indices(d))) for s, d in zip(index, shape))


def attr_shape(shapes, attrs, entry):
    """The `shape` attribute (constant_of_shape)."""
    return tuple(attrs["shape"])


def padded(shapes, attrs, entry):
    """Input 0 grown by `pads` (begins then ends per axis, ONNX order)."""
    shape, pads = tuple(shapes[0]), list(attrs["pads"])
    r = len(shape)
    return tuple(d + pads[i] + pads[r + i] for i, d in enumerate(shape))


def window(shapes, attrs, entry):
    """Sliding windows over the spatial axes of X (N, C, *S): conv (channels from W's first axis,
    kernel from W) and pooling (channels kept, kernel from kernel_shape); ONNX's pads, strides,
    dilations, auto_pad and ceil_mode."""
    x = tuple(shapes[0])
    conv = len(shapes) > 1
    spatial = x[2:]
    k = len(spatial)
    kernel = tuple(attrs.get("kernel_shape") or shapes[1][2:])
    strides = tuple(attrs.get("strides") or (1,) * k)
    dilations = tuple(attrs.get("dilations") or (1,) * k)
    span = [d * (n - 1) + 1 for d, n in zip(dilations, kernel)]
    auto = attrs.get("auto_pad") or "NOTSET"
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(-(-s // st) for s, st in zip(spatial, strides))
    else:
        pads = (0,) * (2 * k) if auto == "VALID" or attrs.get("pads") is None else tuple(attrs["pads"])
        ceil = bool(attrs.get("ceil_mode"))
        out = []
        for i, (s, sp, st) in enumerate(zip(spatial, span, strides)):
            room = s + pads[i] + pads[k + i] - sp
            o = (-(-room // st) if ceil else room // st) + 1
            if ceil and (o - 1) * st >= s + pads[i]:
                o -= 1  # a last window starting in the end padding is dropped
            out.append(o)
        out = tuple(out)
    return (x[0], shapes[1][0] if conv else x[1]) + out


def transposed_window(shapes, attrs, entry):
    """conv_transpose: X (N, C, *S), W (C, M/group, *K) -> (N, M, *out), out = (S - 1) * stride - pads
    + dilation * (K - 1) + output_padding + 1 per axis."""
    x, w = tuple(shapes[0]), tuple(shapes[1])
    k = len(x) - 2
    strides = tuple(attrs.get("strides") or (1,) * k)
    dilations = tuple(attrs.get("dilations") or (1,) * k)
    pads = tuple(attrs.get("pads") or (0,) * (2 * k))
    extra = tuple(attrs.get("output_padding") or (0,) * k)
    out = tuple((n - 1) * s - pads[i] - pads[k + i] + d * (kk - 1) + e + 1
                for i, (n, s, d, kk, e) in enumerate(zip(x[2:], strides, dilations, w[2:], extra)))
    return (x[0], w[1] * int(attrs.get("group") or 1)) + out


def einsum(shapes, attrs, entry):
    """The output letters' sizes (implicit form: the letters that appear once, sorted)."""
    lhs, arrow, out = attrs["equation"].replace(" ", "").partition("->")
    ins = lhs.split(",")
    dims = {c: d for sub, shape in zip(ins, shapes) for c, d in zip(sub, shape)}
    if not arrow:
        letters = "".join(ins)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return tuple(dims[c] for c in out)


def top_k(shapes, attrs, entry):
    """Input 0 with `k` along `axis` (top_k, top_k_indices)."""
    shape = list(shapes[0])
    shape[attrs["axis"]] = attrs["k"]
    return tuple(shape)


def resized(shapes, attrs, entry):
    """`sizes`, or floor(input * scales) per axis, as ONNX Resize (resize)."""
    import math

    if attrs.get("sizes") is not None:
        return tuple(int(d) for d in attrs["sizes"])
    return tuple(math.floor(d * s) for d, s in zip(shapes[0], attrs["scales"]))


def grid_sampled(shapes, attrs, entry):
    """X [N, C, H, W] sampled at grid [N, Ho, Wo, 2]: [N, C, Ho, Wo] (grid_sample)."""
    return tuple(shapes[0][:2]) + tuple(shapes[1][1:3])


def grid_corners(shapes, attrs, entry):
    """Per grid point [N, Ho, Wo] and axis, three integers: [N, Ho, Wo, 2, 3] (grid_sample_corners)."""
    return tuple(shapes[1][:3]) + (2, 3)


RULES = {"numpy": numpy_rule, "broadcast": broadcast, "same": same, "scalar": scalar, "reduce": reduce,
         "constant": constant, "slice": onnx_slice, "attr_shape": attr_shape, "padded": padded, "window": window,
         "transposed_window": transposed_window, "einsum": einsum, "top_k": top_k, "resized": resized,
         "grid_sampled": grid_sampled, "grid_corners": grid_corners}


def output_shape(entry: dict, shapes: list, attrs: dict) -> tuple:
    return RULES[entry["shape"]](shapes, attrs, entry)
