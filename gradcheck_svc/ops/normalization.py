"""batch_norm (inference form, as exported) and lrn (local response normalization).

Both normalize along the channel axis, axis 1 of (N, C, *spatial); it is
addressed from the end (-(rank-1)) so a leading batch axis passes through.
"""
from __future__ import annotations

from ..errors import GraphError
from .base import FLOAT, POSITIVE, REALS, Attr, Case, OpDef, Spec, save_inputs
from .registry import register
from .windows import channel_view

# --- batch_norm --------------------------------------------------------------------------


def _infer_bn(node, specs, attrs):
    if len(specs) != 5:
        raise GraphError(f"batch_norm takes X, scale, B, mean, var; got {len(specs)} inputs", node=node)
    x = specs[0].shape
    if len(x) < 2:
        raise GraphError(f"batch_norm expects (N, C, ...), got {list(x)}", node=node)
    for what, s in zip(("scale", "B", "mean", "var"), specs[1:]):
        if s.shape != (x[1],):
            raise GraphError(f"batch_norm {what} must have shape [{x[1]}], got {list(s.shape)}", node=node)
    if attrs["epsilon"] <= 0:
        raise GraphError("batch_norm epsilon must be positive", node=node)
    return Spec(x, FLOAT), {"epsilon": attrs["epsilon"], "k": len(x) - 2}


def _batch_norm(xp, x, scale, b, mean, var, epsilon, k):
    inv = 1.0 / xp.sqrt(var + epsilon)
    return (x - channel_view(mean, k)) * channel_view(scale * inv, k) + channel_view(b, k)


def _batch_norm_vjp(xp, g, saved, epsilon, k):
    x, scale, _, mean, var = saved
    inv = 1.0 / xp.sqrt(var + epsilon)
    axes = (0,) + tuple(range(2, 2 + k))
    centered = x - channel_view(mean, k)
    g_sum = xp.sum(g, axis=axes)
    g_centered = xp.sum(g * centered, axis=axes)
    return (g * channel_view(scale * inv, k),
            g_centered * inv,
            g_sum,
            -g_sum * scale * inv,
            -0.5 * g_centered * scale * inv ** 3)


def _bn_cases(rng):
    def case(shape, eps):
        c = shape[1]
        return Case([REALS.sample(rng, shape), REALS.sample(rng, (c,)), REALS.sample(rng, (c,)),
                     REALS.sample(rng, (c,)), POSITIVE.sample(rng, (c,))], {"epsilon": eps})
    return [case((2, 3, 4, 2), 1e-5), case((3, 2), 0.1), case((1, 2, 5), 1e-3)]


register(OpDef(
    name="batch_norm", forward=_batch_norm, vjp=_batch_norm_vjp, infer=_infer_bn, arity=5,
    input_kinds=(FLOAT,), attrs={"epsilon": Attr("float", 1e-5)}, save=save_inputs,
    domain=(REALS, REALS, REALS, REALS, POSITIVE), cases=_bn_cases,
    doc="inference batch normalization: (x - mean) / sqrt(var + epsilon) * scale + B, per channel"))

# --- lrn --------------------------------------------------------------------------------


def _infer_lrn(node, specs, attrs):
    x = specs[0].shape
    if len(x) < 2:
        raise GraphError(f"lrn expects (N, C, ...), got {list(x)}", node=node)
    size = attrs["size"]
    if size < 1:
        raise GraphError("lrn size must be positive", node=node)
    # ONNX: channels c - floor((size-1)/2) .. c + ceil((size-1)/2)
    return Spec(x, FLOAT), {"alpha": attrs["alpha"], "beta": attrs["beta"], "bias": attrs["bias"], "size": size,
                            "axis": 1 - len(x), "before": (size - 1) // 2, "after": size - 1 - (size - 1) // 2}


def _channel_window_sum(xp, a, axis, before, after):
    """out[c] = sum of a[c - before .. c + after] along `axis` (zeros beyond the ends)."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (before, after)
    p = xp.moveaxis(xp.pad(a, widths), axis, -1)
    n = a.shape[axis]
    out = sum(p[..., i:i + n] for i in range(before + after + 1))  # loop over the window's few channels
    return xp.moveaxis(out, -1, axis)


def _lrn_denominator(xp, x, alpha, bias, size, axis, before, after):
    return bias + (alpha / size) * _channel_window_sum(xp, x * x, axis, before, after)


def _lrn(xp, x, alpha, beta, bias, size, axis, before, after):
    return x * _lrn_denominator(xp, x, alpha, bias, size, axis, before, after) ** -beta


def _lrn_vjp(xp, g, saved, alpha, beta, bias, size, axis, before, after):
    (x,) = saved
    d = _lrn_denominator(xp, x, alpha, bias, size, axis, before, after)
    # x[j] enters the denominators of the channels whose window holds j: the transposed window
    t = g * x * d ** (-beta - 1.0)
    spread = _channel_window_sum(xp, t, axis, after, before)
    return (g * d ** -beta - (2.0 * beta * alpha / size) * x * spread,)


register(OpDef(
    name="lrn", forward=_lrn, vjp=_lrn_vjp, infer=_infer_lrn, arity=1, input_kinds=(FLOAT,),
    attrs={"size": Attr("int"), "alpha": Attr("float", 1e-4), "beta": Attr("float", 0.75),
           "bias": Attr("float", 1.0)},
    save=save_inputs,
    cases=lambda rng: [Case([REALS.sample(rng, (2, 5, 3))], {"size": 3, "alpha": 0.5, "beta": 0.75}),
                       Case([REALS.sample(rng, (1, 4, 2, 2))], {"size": 2, "alpha": 1.0, "beta": 0.5,
                                                                "bias": 2.0})],
    doc="ONNX LRN: x / (bias + alpha/size * sum of x^2 over `size` neighbouring channels)^beta"))
