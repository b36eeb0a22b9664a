"""scatter_elements: ONNX ScatterElements (reduction none or add) with indices known when the graph is
built, so they are an attribute: checked once (range, and no two updates aimed at one element, where
ONNX leaves the result undefined) and turned into flat positions.

    out = data;  out[i][indices[i][j]][k] = updates[i][j][k]   (axis 1; "add": +=)

Gradients: updates read g at the positions written; data gets g except where it was overwritten
(reduction none) or all of g (add).
"""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from .base import FLOAT, REALS, Attr, Case, OpDef, Spec, norm_axis, save_nothing
from .registry import register


def _infer(node, specs, attrs):
    data, upd = specs[0].shape, specs[1].shape
    try:
        raw = np.asarray(attrs["indices"], dtype=np.float64)  # a graph's JSON may carry them as floats
    except (TypeError, ValueError):
        raw = None
    if raw is None or not np.all(np.isfinite(raw) & (raw == np.round(raw))):
        raise GraphError("scatter_elements indices must be a nested list of integers", node=node)
    idx = raw.astype(np.int64)
    if idx.shape != upd or len(upd) != len(data):
        raise GraphError(f"scatter_elements: indices {list(idx.shape)} and updates {list(upd)} must have one "
                         f"shape, of the rank of data {list(data)}", node=node)
    axis = norm_axis(node, attrs["axis"], len(data)) + len(data)
    if any(u > d for i, (u, d) in enumerate(zip(upd, data)) if i != axis):
        raise GraphError(f"scatter_elements updates {list(upd)} exceed data {list(data)} off the axis", node=node)
    n = data[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise GraphError(f"scatter_elements index out of range [-{n}, {n - 1}]", node=node)
    coords = list(np.indices(upd))
    coords[axis] = np.where(idx < 0, idx + n, idx)
    flat = np.ravel_multi_index(coords, data).reshape(-1) if idx.size else np.zeros(0, np.int64)
    targets, inverse = np.unique(flat, return_inverse=True)
    if targets.size != flat.size and attrs["reduction"] != "add":
        raise GraphError("scatter_elements indices aim two updates at one element (ONNX leaves that undefined "
                         "without a reduction)", node=node)
    return Spec(data, FLOAT), {"axis": axis - len(data), "reduction": attrs["reduction"], "indices": attrs["indices"],
                               "flat": tuple(int(f) for f in flat), "data_rank": len(data), "upd_shape": upd,
                               # repeated targets (reduction add): each update's target among the distinct ones
                               "targets": tuple(int(t) for t in targets),
                               "inverse": tuple(int(i) for i in inverse) if targets.size != flat.size else None}


def _forward(xp, data, upd, *, axis, reduction, indices, flat, data_rank, upd_shape, targets, inverse):
    lead = np.broadcast_shapes(data.shape[:data.ndim - data_rank], upd.shape[:upd.ndim - len(upd_shape)])
    shape = tuple(lead) + tuple(data.shape[data.ndim - data_rank:])
    # in the updates' dtype where that is wider (complex128 updates of real data: complex-step differences)
    out = xp.broadcast_to(data, shape).astype(xp.result_type(data.dtype, upd.dtype))
    rows = out.reshape(tuple(lead) + (-1,))
    vals = xp.broadcast_to(upd, tuple(lead) + tuple(upd_shape)).reshape(tuple(lead) + (-1,))
    where = xp.asarray(np.asarray(flat, dtype=np.int64))
    if inverse is not None:  # repeated targets: sum the updates per target (a 0/1 matrix), then add
        to = np.zeros((len(flat), len(targets)))
        to[np.arange(len(flat)), inverse] = 1.0
        where = xp.asarray(np.asarray(targets, dtype=np.int64))
        vals = xp.matmul(vals, xp.asarray(to.astype(data.dtype) if data.dtype != object else to))
    if reduction == "add":
        rows[..., where] = rows[..., where] + vals
    else:
        rows[..., where] = vals
    return out


def _vjp(xp, g, saved, *, axis, reduction, indices, flat, data_rank, upd_shape, targets, inverse):
    where = xp.asarray(np.asarray(flat, dtype=np.int64))
    g_upd = g.reshape(-1)[where].reshape(upd_shape)
    if reduction == "add":
        return g, g_upd
    g_data = g.copy()
    g_data.reshape(-1)[where] = 0.0
    return g_data, g_upd


def _cases(rng):
    return [
        Case([REALS.sample(rng, (3, 3)), REALS.sample(rng, (2, 3))],
             {"axis": 0, "indices": [[1, 0, 2], [0, 2, 1]]}),
        Case([REALS.sample(rng, (2, 4)), REALS.sample(rng, (2, 2))],
             {"axis": 1, "indices": [[3, -4], [0, 2]], "reduction": "add"}),
        Case([REALS.sample(rng, (5,)), REALS.sample(rng, (2,))], {"axis": -1, "indices": [4, 1]}),
        Case([REALS.sample(rng, (2, 3)), REALS.sample(rng, (2, 3))],
             {"axis": 1, "indices": [[1, 1, 0], [2, 2, 2]], "reduction": "add"}),  # repeated targets
    ]


register(OpDef(
    name="scatter_elements", forward=_forward, vjp=_vjp, infer=_infer, arity=2, input_kinds=(FLOAT, FLOAT),
    attrs={"indices": Attr("value", doc="where each update goes along `axis` (same shape as updates)"),
           "axis": Attr("int", 0), "reduction": Attr("str", "none", ("none", "add"))},
    save=save_nothing, cases=_cases,
    doc="ONNX ScatterElements (reduction none or add): data with updates written (added) at indices along axis"))
