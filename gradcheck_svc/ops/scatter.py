"""scatter_elements: ONNX ScatterElements (reduction none or add) with indices known when the graph is
built, so they are an attribute: checked once (range, and no two updates aimed at one element, where
ONNX leaves the result undefined) and turned into flat positions.

    out = data;  out[i][indices[i][j]][k] = updates[i][j][k]   (axis 1; "add": +=)

Gradients: updates read g at the positions written; data gets g except where it was overwritten
(reduction none) or all of g (add).
"""
from __future__ import annotations

import numpy as np

from ..backend import host as to_host, scatter_add
from ..errors import GraphError
from .base import FLOAT, INT, REALS, Attr, Case, OpDef, Spec, norm_axis, save_nothing
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
    out = xp.broadcast_to(data, shape).astype(np.result_type(data.dtype, upd.dtype))  # dtypes: host-side
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


# --- put_along_axis: indices computed by the graph (TopK's: a MoE's `zeros_like(p).scatter(-1, topi, topv)`) ---


def _infer_put(node, specs, attrs):
    data, idx, upd = (s.shape for s in specs)
    if not (len(data) == len(idx) == len(upd)) or idx != upd:
        raise GraphError(f"put_along_axis: indices {list(idx)} and updates {list(upd)} must have one shape, of the "
                         f"rank of data {list(data)}", node=node)
    axis = norm_axis(node, attrs["axis"], len(data))
    if any(u != d for i, (u, d) in enumerate(zip(upd, data)) if i - len(data) != axis):
        raise GraphError(f"put_along_axis: updates {list(upd)} must match data {list(data)} off the axis", node=node)
    return Spec(data, FLOAT), {"axis": axis, "reduction": attrs["reduction"], "rank": len(data)}


def _put_grid(xp, idx, n: int, axis: int, reduction: str) -> tuple:
    """Where each update goes, as an index of the output (the indices made non-negative, checked in range and,
    without a reduction, distinct along the axis: ONNX leaves two updates aimed at one element undefined). The
    indices are a value of the graph, so they are checked here, on the host, when they are computed."""
    host = (idx if isinstance(idx, np.ndarray) else to_host(xp, idx)).astype(np.int64)  # the symbolic module: numpy
    host = np.where(host < 0, host + n, host)
    if host.size and (host.min() < 0 or host.max() >= n):
        raise IndexError(f"put_along_axis: an index is out of range for an axis of {n}")
    if reduction == "none" and host.shape[axis] > 1 and np.any(np.diff(np.sort(host, axis=axis), axis=axis) == 0):
        raise IndexError("put_along_axis: two updates aimed at one element (undefined without a reduction)")
    grid = list(np.indices(host.shape, sparse=True))
    grid[axis] = host
    grid = [np.broadcast_to(g, host.shape) for g in grid]
    return tuple(grid) if isinstance(idx, np.ndarray) else tuple(xp.asarray(g) for g in grid)


def _lead(xp, rank: int, *arrays):
    """The arrays broadcast over their leading (batch) axes: the engine evaluates a batch of directions at once."""
    lead = tuple(np.broadcast_shapes(*(a.shape[:a.ndim - rank] for a in arrays)))
    return [xp.broadcast_to(a, lead + a.shape[a.ndim - rank:]) for a in arrays]


def _put_forward(xp, data, idx, upd, *, axis, reduction, rank):
    data, idx, upd = _lead(xp, rank, data, idx, upd)
    where = _put_grid(xp, idx, data.shape[axis], axis, reduction)
    out = data.astype(np.result_type(data.dtype, upd.dtype))  # a copy, complex where the updates are (a complex step)
    if reduction == "add" and out.dtype == object:  # the symbolic oracle's arrays of formulas
        np.add.at(out, where, upd)
    elif reduction == "add":
        scatter_add(xp, out, where, upd)
    else:
        out[where] = upd
    return out


def _put_vjp(xp, g, saved, *, axis, reduction, rank):
    (idx,) = saved
    g, idx = _lead(xp, rank, g, idx)
    where = _put_grid(xp, idx, g.shape[axis], axis, "add")
    g_upd = g[where]
    if reduction == "add":
        return g, None, g_upd
    g_data = g.copy()
    g_data[where] = 0.0  # overwritten: no gradient to data there
    return g_data, None, g_upd


def _put_cases(rng):
    return [
        Case([REALS.sample(rng, (3, 4)), np.array([[1, 3], [0, 2], [3, -4]]), REALS.sample(rng, (3, 2))],
             {"axis": 1}),
        Case([REALS.sample(rng, (3, 2)), np.array([[2, 0], [0, 1]]), REALS.sample(rng, (2, 2))],
             {"axis": 0, "reduction": "add"}),
        Case([REALS.sample(rng, (2, 3)), np.array([[1, 1], [0, 2]]), REALS.sample(rng, (2, 2))],
             {"axis": -1, "reduction": "add"}),  # repeated targets accumulate
    ]


register(OpDef(
    name="put_along_axis", forward=_put_forward, vjp=_put_vjp, infer=_infer_put, arity=3,
    input_kinds=(FLOAT, INT, FLOAT), attrs={"axis": Attr("int"), "reduction": Attr("str", "none", ("none", "add"))},
    save=lambda xs, y, **_: (xs[1],), cases=_put_cases,
    doc="ONNX ScatterElements with indices the graph computes (int64 input, no gradient): data with updates "
        "written (reduction none: distinct along the axis, checked) or added at them along axis"))
