"""Neural-network ops: softmax, log_softmax, logsumexp, cross_entropy, mse_loss."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from .base import FLOAT, INT, REALS, Attr, Case, OpDef, Spec, broadcast_shapes, norm_axis, save_inputs
from .registry import register


def _infer_axis(node, specs, attrs):
    shape = specs[0].shape
    if not shape:
        raise GraphError("input must have at least 1 dimension", node=node)
    return Spec(shape, FLOAT), {"axis": norm_axis(node, attrs["axis"], len(shape))}


# Axes up to this long are reduced by elementwise passes over their slices: NumPy's
# reductions over a short axis cost ~10x more per element (max over the 5 classes of a
# [3200, 16, 5] stack: 2.0 ms vs 0.2 ms), and the finite-difference oracle's stacked
# batches are exactly that shape. Same additions in the same order as NumPy's sum.
SHORT_AXIS = 8


def _reduce_keep(xp, x, axis, pair, full):
    """full(x, axis, keepdims=True), as pair(pair(x0, x1), x2)... when the axis is short."""
    n = x.shape[axis]
    if not 1 < n <= SHORT_AXIS:
        return full(x, axis=axis, keepdims=True)
    tail = (slice(None),) * (x.ndim - 1 - axis if axis >= 0 else -axis - 1)
    out = pair(x[(Ellipsis, slice(0, 1)) + tail], x[(Ellipsis, slice(1, 2)) + tail])
    for i in range(2, n):
        pair(out, x[(Ellipsis, slice(i, i + 1)) + tail], out=out)
    return out


def _logsumexp(xp, x, axis, keepdims=True):
    m = _reduce_keep(xp, x, axis, xp.maximum, xp.max)
    m = xp.where(xp.isfinite(m), m, 0.0)
    out = xp.log(_reduce_keep(xp, xp.exp(x - m), axis, xp.add, xp.sum)) + m
    return out if keepdims else xp.squeeze(out, axis=axis)


def _log_softmax(xp, x, axis):
    return x - _logsumexp(xp, x, axis)


def _softmax(xp, x, axis):
    return xp.exp(_log_softmax(xp, x, axis))


def _axis_cases(rng):
    return [Case([REALS.sample(rng, (2, 5))], {"axis": -1}), Case([REALS.sample(rng, (3, 2, 4))], {"axis": 1}),
            Case([REALS.sample(rng, (4,))], {"axis": 0})]


register(OpDef(
    name="softmax", forward=_softmax,
    vjp=lambda xp, g, s, axis: ((g - xp.sum(g * s[0], axis=axis, keepdims=True)) * s[0],),
    infer=_infer_axis, arity=1, input_kinds=(FLOAT,), attrs={"axis": Attr("int", -1)},
    save=lambda xs, y, **_: (y,), cases=_axis_cases, doc="exp(x) / sum(exp(x)) along axis, computed stably"))

register(OpDef(
    name="log_softmax", forward=_log_softmax,
    vjp=lambda xp, g, s, axis: (g - xp.exp(s[0]) * xp.sum(g, axis=axis, keepdims=True),),
    infer=_infer_axis, arity=1, input_kinds=(FLOAT,), attrs={"axis": Attr("int", -1)},
    save=lambda xs, y, **_: (y,), cases=_axis_cases, doc="x - logsumexp(x) along axis"))


def _infer_lse(node, specs, attrs):
    spec, a = _infer_axis(node, specs, attrs)
    keep = bool(attrs["keepdims"])
    shape = list(spec.shape)
    if keep:
        shape[a["axis"]] = 1
    else:
        del shape[a["axis"]]
    return Spec(tuple(shape), FLOAT), {"axis": a["axis"], "keepdims": keep}


def _lse_vjp(xp, g, s, axis, keepdims):
    x, y = s
    if not keepdims:
        g, y = xp.expand_dims(g, axis), xp.expand_dims(y, axis)
    return (g * xp.exp(x - y),)


register(OpDef(
    name="logsumexp", forward=_logsumexp, vjp=_lse_vjp, infer=_infer_lse, arity=1, input_kinds=(FLOAT,),
    attrs={"axis": Attr("int", -1), "keepdims": Attr("bool", False)},
    save=lambda xs, y, **_: (xs[0], y), cases=_axis_cases, doc="log(sum(exp(x))) along axis, computed stably"))

# --- losses ------------------------------------------------------------------------


def _infer_ce(node, specs, attrs):
    logits, labels = specs[0].shape, specs[1].shape
    if len(logits) not in (1, 2) or labels != logits[:-1]:
        raise GraphError(
            f"cross_entropy expects logits [N, C] with labels [N] (or [C] with a scalar label), "
            f"got {list(logits)} and {list(labels)}", node=node)
    n = logits[0] if len(logits) == 2 else 1
    return Spec((), FLOAT), {"reduction": attrs["reduction"], "n": n, "rank": len(logits)}


def _ce(xp, logits, labels, reduction, n, rank):
    # -log_softmax(logits)[label] = logsumexp(logits) - logits[label], without forming
    # the whole log_softmax; the indexing also serves logits with leading batch axes
    lse = _logsumexp(xp, logits, -1, keepdims=False)
    rows = (xp.arange(logits.shape[-2]),) if rank == 2 else ()
    picked = lse - logits[(Ellipsis,) + rows + (labels,)]
    total = xp.sum(picked, axis=-1) if rank == 2 else picked
    return total / n if reduction == "mean" else total


def _ce_vjp(xp, g, s, reduction, n, rank):
    logits, labels = s
    p = _softmax(xp, logits, -1)
    onehot = (xp.arange(logits.shape[-1]) == labels[..., None]).astype(p.dtype)
    scale = g / n if reduction == "mean" else g
    return (scale * (p - onehot), None)


def _ce_cases(rng):
    return [Case([REALS.sample(rng, (4, 3)), rng.integers(0, 3, size=4)], {"reduction": "mean"}),
            Case([REALS.sample(rng, (2, 5)), rng.integers(0, 5, size=2)], {"reduction": "sum"}),
            Case([REALS.sample(rng, (3,)), np.array(2)], {})]


register(OpDef(
    name="cross_entropy", forward=_ce, vjp=_ce_vjp, infer=_infer_ce, arity=2, input_kinds=(FLOAT, INT),
    attrs={"reduction": Attr("str", "mean", ("mean", "sum"))}, save=save_inputs, cases=_ce_cases,
    doc="softmax cross-entropy of logits [N, C] against int64 class labels [N]"))


def _infer_mse(node, specs, attrs):
    shape = broadcast_shapes(node, [s.shape for s in specs])
    n = int(np.prod(shape)) if shape else 1
    return Spec((), FLOAT), {"reduction": attrs["reduction"], "n": n, "rank": len(shape)}


def _mse(xp, a, b, reduction, n, rank):
    d = a - b
    total = xp.sum(d * d, axis=tuple(range(-rank, 0))) if rank else d * d
    return total / n if reduction == "mean" else total


def _mse_vjp(xp, g, s, reduction, n, rank):
    a, b = s
    d = (a - b) * (2.0 * (g / n if reduction == "mean" else g))
    return d, -d


register(OpDef(
    name="mse_loss", forward=_mse, vjp=_mse_vjp, infer=_infer_mse, arity=2, input_kinds=(FLOAT, FLOAT),
    attrs={"reduction": Attr("str", "mean", ("mean", "sum"))}, save=save_inputs, broadcast=True,
    cases=lambda rng: [Case([REALS.sample(rng, (3, 2)), REALS.sample(rng, (3, 2))]),
                       Case([REALS.sample(rng, (4,)), REALS.sample(rng, ())], {"reduction": "sum"})],
    doc="mean (or sum) of squared differences, inputs broadcast"))
