"""Neural-network ops: softmax, log_softmax, logsumexp, cross_entropy, mse_loss, dropout."""
from __future__ import annotations

import zlib

import numpy as np

from ..errors import GraphError
from .base import (FLOAT, INT, REALS, Attr, Case, OpDef, Spec, broadcast_shapes, norm_axis, save_inputs,
                   save_nothing)
from .registry import register


def _infer_axis(node, specs, attrs):
    shape = specs[0].shape
    if not shape:
        if attrs["axis"] in (0, -1) and not isinstance(attrs["axis"], bool):
            # NOTE a 0-d input along dim 0 or -1: PyTorch takes it as one element (softmax 1,
            # log_softmax 0, logsumexp the value itself); axis None says so to the functions below
            return Spec(shape, FLOAT), {"axis": None}
        raise GraphError(f"axis {attrs['axis']} is out of range for a 0-d input (0 or -1 only)", node=node)
    return Spec(shape, FLOAT), {"axis": norm_axis(node, attrs["axis"], len(shape))}


def _scalar_aware(fn):
    """fn(xp, *arrays, axis, **kw) along an axis; for axis None (a 0-d input) along a trailing axis of
    size 1 given to every array, taken off the result(s) again."""
    def wrapped(xp, *arrays, axis, **kw):
        if axis is not None:
            return fn(xp, *arrays, axis=axis, **kw)
        out = fn(xp, *[None if a is None else a[..., None] for a in arrays], axis=-1, **kw)
        return tuple(None if o is None else o[..., 0] for o in out) if isinstance(out, tuple) else out[..., 0]
    return wrapped


def _logsumexp(xp, x, axis, keepdims=True):
    if x.shape[axis] == 0:
        # NumPy and PyTorch: the log of an empty sum is log 0 = -inf (and softmax of nothing is empty);
        # the max shift below has no identity over an empty axis
        out = xp.sum(x, axis=axis, keepdims=True) - np.inf
        return out if keepdims else xp.squeeze(out, axis=axis)
    m = xp.max(x, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)
    out = xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else xp.squeeze(out, axis=axis)


def _log_softmax(xp, x, axis):
    return x - _logsumexp(xp, x, axis)


def _softmax(xp, x, axis):
    # exp(x - max) / sum, not exp(log_softmax): for logits ~1e19 (deep nets with constant
    # weights) logsumexp - x rounds log(n) away and every probability would come out 1
    if x.shape[axis] == 0:  # softmax of nothing is empty (NumPy, PyTorch); max has no identity there
        return xp.exp(x)
    m = xp.max(x, axis=axis, keepdims=True)
    e = xp.exp(x - xp.where(xp.isfinite(m), m, 0.0))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _axis_cases(rng):
    return [Case([REALS.sample(rng, (2, 5))], {"axis": -1}), Case([REALS.sample(rng, (3, 2, 4))], {"axis": 1}),
            Case([REALS.sample(rng, (4,))], {"axis": 0})]


_softmax_vjp = _scalar_aware(lambda xp, g, y, axis: ((g - xp.sum(g * y, axis=axis, keepdims=True)) * y,))
_log_softmax_vjp = _scalar_aware(lambda xp, g, y, axis: (g - xp.exp(y) * xp.sum(g, axis=axis, keepdims=True),))

register(OpDef(
    name="softmax", forward=_scalar_aware(lambda xp, x, axis: _softmax(xp, x, axis)),
    vjp=lambda xp, g, s, axis: _softmax_vjp(xp, g, s[0], axis=axis),
    infer=_infer_axis, arity=1, input_kinds=(FLOAT,), attrs={"axis": Attr("int", -1)},
    save=lambda xs, y, **_: (y,), cases=_axis_cases, doc="exp(x) / sum(exp(x)) along axis, computed stably"))

register(OpDef(
    name="log_softmax", forward=_scalar_aware(lambda xp, x, axis: _log_softmax(xp, x, axis)),
    vjp=lambda xp, g, s, axis: _log_softmax_vjp(xp, g, s[0], axis=axis),
    infer=_infer_axis, arity=1, input_kinds=(FLOAT,), attrs={"axis": Attr("int", -1)},
    save=lambda xs, y, **_: (y,), cases=_axis_cases, doc="x - logsumexp(x) along axis"))


def _infer_lse(node, specs, attrs):
    spec, a = _infer_axis(node, specs, attrs)
    keep = bool(attrs["keepdims"])
    if a["axis"] is None:  # a 0-d input: the value itself, keepdims or not (PyTorch)
        return Spec((), FLOAT), {"axis": None, "keepdims": keep}
    shape = list(spec.shape)
    if keep:
        shape[a["axis"]] = 1
    else:
        del shape[a["axis"]]
    return Spec(tuple(shape), FLOAT), {"axis": a["axis"], "keepdims": keep}


def _lse_forward(xp, x, axis, keepdims):
    if axis is None:  # a 0-d input: one element along a trailing axis
        return _logsumexp(xp, x[..., None], -1, keepdims=False)
    return _logsumexp(xp, x, axis, keepdims)


def _lse_vjp(xp, g, s, axis, keepdims):
    x, y = s
    if axis is not None and not keepdims:
        g, y = xp.expand_dims(g, axis), xp.expand_dims(y, axis)
    return (g * xp.exp(x - y),)


register(OpDef(
    name="logsumexp", forward=_lse_forward, vjp=_lse_vjp, infer=_infer_lse, arity=1, input_kinds=(FLOAT,),
    attrs={"axis": Attr("int", -1), "keepdims": Attr("bool", False)},
    save=lambda xs, y, **_: (xs[0], y), cases=_axis_cases, doc="log(sum(exp(x))) along axis, computed stably"))

# --- losses ------------------------------------------------------------------------


def _infer_ce(node, specs, attrs):
    logits, labels = specs[0].shape, specs[1].shape
    if len(logits) >= 3 and labels == logits[:1] + logits[2:]:
        # K-dimensional (PyTorch): logits [N, C, d1..dk], labels [N, d1..dk]; the mean is over them all
        return Spec((), FLOAT), {"reduction": attrs["reduction"], "n": int(np.prod(labels)), "rank": len(logits)}
    if len(logits) not in (1, 2) or labels != logits[:-1]:
        raise GraphError(
            f"cross_entropy expects logits [N, C] with labels [N] (or [C] with a scalar label, or "
            f"[N, C, d1, ...] with labels [N, d1, ...]), got {list(logits)} and {list(labels)}", node=node)
    n = logits[0] if len(logits) == 2 else 1
    return Spec((), FLOAT), {"reduction": attrs["reduction"], "n": n, "rank": len(logits)}


def _class_last(xp, logits, rank):
    """K-dimensional logits with their class axis (1 of rank; negative, as leading batch axes may
    come first) moved last."""
    return xp.moveaxis(logits, 1 - rank, -1)


def _ce(xp, logits, labels, reduction, n, rank):
    # -log_softmax(logits)[label] = logsumexp(logits) - logits[label], without forming
    # the whole log_softmax; the indexing also serves logits with leading batch axes
    if rank >= 3:
        last = _class_last(xp, logits, rank)
        index = xp.broadcast_to(labels[..., None], last.shape[:-1] + (1,))
        picked = _logsumexp(xp, last, -1, keepdims=False) - xp.take_along_axis(last, index, -1)[..., 0]
        total = xp.sum(picked, axis=tuple(range(1 - rank, 0)))
        return total / n if reduction == "mean" else total
    lse = _logsumexp(xp, logits, -1, keepdims=False)
    rows = (xp.arange(logits.shape[-2]),) if rank == 2 else ()
    picked = lse - logits[(Ellipsis,) + rows + (labels,)]
    total = xp.sum(picked, axis=-1) if rank == 2 else picked
    return total / n if reduction == "mean" else total


def _ce_vjp(xp, g, s, reduction, n, rank):
    logits, labels = s
    if rank >= 3:
        last = _class_last(xp, logits, rank)
        p = _softmax(xp, last, -1)
        onehot = (xp.arange(last.shape[-1]) == labels[..., None]).astype(p.dtype)
        g = xp.asarray(g / n if reduction == "mean" else g)
        scale = xp.reshape(g, g.shape + (1,) * rank)
        return (xp.moveaxis(scale * (p - onehot), -1, 1 - rank), None)
    p = _softmax(xp, logits, -1)
    onehot = (xp.arange(logits.shape[-1]) == labels[..., None]).astype(p.dtype)
    scale = g / n if reduction == "mean" else g
    return (scale * (p - onehot), None)


def _ce_cases(rng):
    return [Case([REALS.sample(rng, (4, 3)), rng.integers(0, 3, size=4)], {"reduction": "mean"}),
            Case([REALS.sample(rng, (2, 5)), rng.integers(0, 5, size=2)], {"reduction": "sum"}),
            Case([REALS.sample(rng, (3,)), np.array(2)], {}),
            Case([REALS.sample(rng, (2, 3, 4)), rng.integers(0, 3, size=(2, 4))], {"reduction": "mean"}),
            Case([REALS.sample(rng, (2, 3, 2, 2)), rng.integers(0, 3, size=(2, 2, 2))], {"reduction": "sum"})]


register(OpDef(
    name="cross_entropy", forward=_ce, vjp=_ce_vjp, infer=_infer_ce, arity=2, input_kinds=(FLOAT, INT),
    attrs={"reduction": Attr("str", "mean", ("mean", "sum"))}, save=save_inputs, cases=_ce_cases,
    doc="softmax cross-entropy of logits [N, C] against int64 class labels [N] (or [N, C, d1, ...] against "
        "[N, d1, ...], the mean over all of them)"))


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

# --- randomness ----------------------------------------------------------------------


def _infer_dropout(node, specs, attrs):
    p, seed = attrs["p"], attrs["seed"]
    if not 0.0 <= p < 1.0:
        raise GraphError(f"attribute 'p' must be in [0, 1), got {p!r}", node=node)
    if seed < 0:
        raise GraphError(f"attribute 'seed' must be non-negative, got {seed}", node=node)
    # the node's name joins the seed: two dropout nodes with one seed still draw different masks
    return Spec(specs[0].shape, FLOAT), {"p": p, "seed": seed, "stream": zlib.crc32(node.encode()),
                                         "shape": specs[0].shape}


def _dropout_scale(xp, dtype, p, seed, stream, shape):
    """mask / (1 - p), a pure function of (seed, node): drawn on the host from a generator seeded
    with both, so every evaluation -- first forward, checkpoint recompute, finite differences,
    either backend -- applies the same mask. Static shape: batched inputs broadcast against it."""
    keep = np.random.default_rng([seed, stream]).random(shape) >= p
    return xp.asarray(keep / (1.0 - p), dtype=dtype)


register(OpDef(
    name="dropout",
    forward=lambda xp, x, **a: x * _dropout_scale(xp, x.dtype, **a),
    vjp=lambda xp, g, s, **a: (g * _dropout_scale(xp, g.dtype, **a),),
    infer=_infer_dropout, arity=1, input_kinds=(FLOAT,),
    attrs={"p": Attr("float", 0.5, doc="probability of zeroing an element"),
           "seed": Attr("int", 0, doc="with the node's name, determines the mask")},
    save=save_nothing,  # the vjp redraws the mask from (seed, node) instead of keeping it
    cases=lambda rng: [Case([REALS.sample(rng, (6,))], {"p": 0.5, "seed": 3}),
                       Case([REALS.sample(rng, (2, 3, 4))], {"p": 0.25, "seed": 11}),
                       Case([REALS.sample(rng, ())], {"p": 0.0})],
    doc="inverted dropout x * mask / (1 - p), mask ~ Bernoulli(1 - p) drawn from (seed, node name): "
        "the same mask on every evaluation, so checkpoint recomputes and finite differences replay it"))
