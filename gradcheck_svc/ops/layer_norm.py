"""layer_norm: ONNX LayerNormalization (opset 17) and torch.nn.functional.layer_norm.

y = (x - mean) / sqrt(var + epsilon) * scale + bias, the moments taken over the axes from `axis` to
the last (the "normalized shape"), var the biased (population) variance. scale and bias broadcast to
the normalized shape; bias may be omitted.

The backward reads x and scale (saved) and recomputes the per-row mean and 1/std from x; ONNX's stash
outputs Mean and InvStdDev are separate nodes of the converter when a model reads them.
"""
from __future__ import annotations

import math

from ..errors import GraphError
from .base import FLOAT, REALS, Attr, Case, OpDef, Spec, norm_axis
from .registry import register


def _infer(node, specs, attrs):
    if len(specs) not in (2, 3):
        raise GraphError(f"layer_norm takes X, scale and an optional bias; got {len(specs)} inputs", node=node)
    x = specs[0].shape
    if not x:
        raise GraphError("layer_norm needs an input of rank >= 1", node=node)
    axis = norm_axis(node, attrs["axis"], len(x))
    normalized = x[axis + len(x):]
    for what, s in zip(("scale", "bias"), specs[1:]):
        if len(s.shape) > len(normalized) or any(d not in (1, n) for d, n in
                                                 zip(s.shape[::-1], normalized[::-1])):
            raise GraphError(f"layer_norm {what} of shape {list(s.shape)} does not broadcast to the "
                             f"normalized shape {list(normalized)}", node=node)
    if not attrs["epsilon"] > 0:
        raise GraphError("layer_norm epsilon must be positive", node=node)
    return Spec(x, FLOAT), {"axis": axis, "epsilon": attrs["epsilon"], "x_rank": len(x),
                            "p_ranks": [len(s.shape) for s in specs[1:]]}


def _aligned(p, rank, x_rank):
    """A scale or bias with leading batch axes (finite differences), shaped to broadcast against x."""
    lead = p.ndim - rank
    return p.reshape(p.shape[:lead] + (1,) * (x_rank - rank) + p.shape[lead:]) if lead else p


def _moments(xp, x, axis, epsilon):
    axes = tuple(range(axis, 0))
    n = math.prod(x.shape[axis:])
    mean = xp.sum(x, axis=axes, keepdims=True) / n
    d = x - mean
    inv_std = 1.0 / xp.sqrt(xp.sum(d * d, axis=axes, keepdims=True) / n + epsilon)
    return mean, inv_std


def _forward(xp, x, scale, bias=None, *, axis, epsilon, x_rank, p_ranks):
    mean, inv_std = _moments(xp, x, axis, epsilon)
    y = (x - mean) * inv_std * _aligned(scale, p_ranks[0], x_rank)
    return y if bias is None else y + _aligned(bias, p_ranks[1], x_rank)


def _save(xs, y, **_):
    return xs[0], xs[1]  # the moments are recomputed in the backward (two passes over x)


def _vjp(xp, g, saved, *, axis, epsilon, x_rank, p_ranks):
    x, scale = saved
    mean, inv_std = _moments(xp, x, axis, epsilon)
    axes = tuple(range(axis, 0))
    n = math.prod(x.shape[axis:])
    xhat = (x - mean) * inv_std
    gh = g * scale
    gx = inv_std * (gh - xp.sum(gh, axis=axes, keepdims=True) / n
                    - xhat * (xp.sum(gh * xhat, axis=axes, keepdims=True) / n))
    grads = (gx, g * xhat)  # scale's (and bias's) gradient in x's shape: the engine sums it back
    return grads + (g,) if len(p_ranks) == 2 else grads


def _cases(rng):
    def case(shape, axis, pshape, bias=True, eps=1e-5):
        ins = [REALS.sample(rng, shape), REALS.sample(rng, pshape)]
        if bias:
            ins.append(REALS.sample(rng, pshape))
        return Case(ins, {"axis": axis, "epsilon": eps})
    return [case((2, 3, 4), -1, (4,)), case((2, 3, 4), 1, (3, 4), eps=0.1), case((3, 5), -1, (5,), bias=False),
            case((2, 2, 3), -2, (1, 3))]


register(OpDef(
    name="layer_norm", forward=_forward, vjp=_vjp, infer=_infer, arity=None, input_kinds=(FLOAT,),
    attrs={"axis": Attr("int", -1, doc="first normalized axis; the moments are over axis..last"),
           "epsilon": Attr("float", 1e-5)},
    save=_save, cases=_cases,
    doc="layer normalization (x - mean) / sqrt(var + epsilon) * scale + bias over the axes from `axis` on"))
