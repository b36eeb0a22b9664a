"""top_k and top_k_indices: ONNX TopK's two outputs (the k largest or smallest values along an
axis, sorted, and where they came from), as MoE routers use them.

top_k is a selection: each output element is one input element, so its gradient is g scattered
back to the selected positions (the rest get exactly 0). Its forward is a sort (xp.sort), which the
symbolic oracle runs as a network of binary Max/Min (oracles/sympy_arrays.py), so SymPy
differentiates the same function without a vjp. top_k_indices is piecewise constant (int64, no
gradient), read by take_along_axis (a MoE's gather of its chosen experts).

NOTE ties: as ONNX specifies, of equal values the lower index comes first (a stable sort); so at
a tie between the k-th and the (k+1)-th value the lower index is selected and gets the gradient,
and equal selected values take g in index order. PyTorch's topk leaves the order of ties
unspecified: only away from ties do the two have to agree (a kink, with its distance).
"""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from .base import FLOAT, INT, Attr, Case, Kink, OpDef, Spec, norm_axis, save_inputs
from .registry import register

ATTRS = {"k": Attr("int", doc="how many values to keep"), "axis": Attr("int", -1),
         "largest": Attr("bool", True, doc="the largest values (else the smallest)")}


def _infer(kind):
    def infer(node, specs, attrs):
        shape = specs[0].shape
        if not shape:
            raise GraphError("top_k needs an input of rank >= 1", node=node)
        axis = norm_axis(node, attrs["axis"], len(shape))
        k = attrs["k"]
        if not 0 <= k <= shape[axis]:
            raise GraphError(f"top_k: k = {k} is outside [0, {shape[axis]}] (the length of axis {axis})", node=node)
        out = list(shape)
        out[axis] = k
        return Spec(tuple(out), kind), {"k": k, "axis": axis, "largest": bool(attrs["largest"])}
    return infer


def _order(xp, moved, k, largest):
    """Positions of the k selected elements along the last axis, in output order (stable: ties by index)."""
    return xp.argsort(-moved if largest else moved, axis=-1, kind="stable")[..., :k]


def _values(xp, x, k, axis, largest):
    s = xp.sort(xp.moveaxis(x, axis, -1), axis=-1)
    s = s[..., ::-1][..., :k] if largest else s[..., :k]
    return xp.moveaxis(s, -1, axis)


def _indices(xp, x, k, axis, largest):
    return xp.moveaxis(_order(xp, xp.moveaxis(x, axis, -1), k, largest), -1, axis)


def _frozen_values(xp, idx, x, k, axis, largest):
    """The values at the positions the unperturbed forward selected (idx: _indices'), for finite differences'
    frozen branches (ops/base.py): x may carry leading batch axes."""
    lead = x.ndim - idx.ndim
    return xp.take_along_axis(x, xp.broadcast_to(idx, x.shape[:lead] + idx.shape), axis=axis % idx.ndim + lead)


def _values_vjp(xp, g, saved, k, axis, largest):
    (x,) = saved
    moved = xp.moveaxis(x, axis, -1)
    idx = _order(xp, moved, k, largest)
    grid = list(xp.indices(idx.shape, sparse=True))
    grid[-1] = idx
    z = xp.zeros(moved.shape, dtype=g.dtype)
    z[tuple(grid)] = xp.moveaxis(g, axis, -1)  # distinct positions per row: a plain assignment
    return (xp.moveaxis(z, -1, axis),)


def _tie_gap(xs, attrs):
    """Per output element, the smallest gap between neighbours among its row's k+1 extreme values."""
    k, axis = attrs["k"], attrs["axis"]
    s = np.sort(np.moveaxis(np.asarray(xs[0], dtype=np.float64), axis, -1), axis=-1)
    s = s[..., ::-1] if attrs["largest"] else s
    top = s[..., :k + 1]
    gap = np.min(np.abs(np.diff(top, axis=-1)), axis=-1) if top.shape[-1] > 1 else np.full(top.shape[:-1], np.inf)
    return np.moveaxis(np.broadcast_to(gap[..., None], s.shape[:-1] + (k,)), -1, axis)


def _distinct(rng, shape):
    """Values at least 0.3 apart: no near-tie (a kink) by chance."""
    n = int(np.prod(shape))
    return ((rng.permutation(n) + rng.uniform(0.0, 0.2)) * 0.3 - 0.15 * n).reshape(shape)


def _cases(rng):
    return [Case([_distinct(rng, (3, 5))], {"k": 2}),
            Case([_distinct(rng, (4, 2, 3))], {"k": 3, "axis": 0, "largest": False}),
            Case([_distinct(rng, (6,))], {"k": 6}),
            Case([_distinct(rng, (2, 4))], {"k": 1, "axis": 1})]


TIES = Kink("ties among the k+1 extreme values of a row", "the lower index first (ONNX's stable order)", _tie_gap)

register(OpDef(
    name="top_k", forward=_values, vjp=_values_vjp, infer=_infer(FLOAT), arity=1, input_kinds=(FLOAT,),
    attrs=ATTRS, save=save_inputs, kinks=(TIES,), cases=_cases, select=_indices, frozen=_frozen_values,
    doc="ONNX TopK's values: the k largest (smallest) values along axis, sorted, as torch.topk"))

register(OpDef(
    name="top_k_indices", forward=_indices, vjp=None, infer=_infer(INT), arity=1, input_kinds=(FLOAT,),
    attrs=ATTRS, kinks=(TIES,), cases=_cases, held=True,  # perturbed forwards keep the selection
    doc="ONNX TopK's indices (int64, no gradient): where top_k's values are along axis"))
