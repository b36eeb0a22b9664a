"""grid_sample_corners and grid_sample: ONNX GridSample (F.grid_sample) on 4-D inputs, bilinear or
nearest, padding zeros / border / reflection, align_corners either way.

Split as TopK is (topk.py): every piecewise decision is made by grid_sample_corners, int64 and of no
gradient (finite differences hold it, the symbolic oracle computes it from float64 values), and grid_sample
reads it and is smooth. Per grid point and axis (x then y, grid's last axis) the corners are [i0, s, o]:
the sampled coordinate is c = s * u + o, u the grid value in pixels (align_corners: (g + 1) / 2 * (size - 1);
else ((g + 1) * size - 1) / 2), s in {-1, 0, 1} and o an integer (reflections and border clipping; zeros
padding: s = 1, o = 0), and i0 = floor(c) (bilinear) or c rounded half to even (nearest, torch's nearbyint).
grid_sample: bilinear, the sum over i0 and i0 + 1 of each axis of the weights (i0 + 1 - c, c - i0) times the
pixel, 0 outside the image; nearest, the pixel at i0. Its gradient to the input scatters g back; to the grid,
through c in the weights (nearest: none).

NOTE kinks: where u crosses an integer or a half-integer the corners change -- floor's jumps (bilinear),
the rounding's (nearest), the clipping and reflection bounds. The convention there is torch's: the corner
is floor(c), and a coordinate exactly on a clipping bound is clipped (s = 0, derivative 0).
"""
from __future__ import annotations

import numpy as np

from ..backend import host as to_host, scatter_add
from ..errors import GraphError
from .base import FLOAT, INT, REALS, Attr, Case, Kink, OpDef, Spec
from .registry import register

ATTRS = {"mode": Attr("str", "bilinear", ("bilinear", "nearest")),
         "padding_mode": Attr("str", "zeros", ("zeros", "border", "reflection")),
         "align_corners": Attr("bool", False)}


def _check(node, specs):
    x, grid = specs[0].shape, specs[1].shape
    if len(x) != 4 or len(grid) != 4 or grid[-1] != 2 or grid[0] != x[0]:
        raise GraphError(f"grid_sample needs an input [N, C, H, W] and a grid [N, Ho, Wo, 2], got {list(x)} and "
                         f"{list(grid)}", node=node)
    return x, grid


def _infer_corners(node, specs, attrs):
    x, grid = _check(node, specs)
    return Spec(tuple(grid[:3]) + (2, 3), INT), {"size": (x[3], x[2]), "mode": attrs["mode"],
                                                  "padding_mode": attrs["padding_mode"],
                                                  "align_corners": bool(attrs["align_corners"])}


def _infer(node, specs, attrs):
    x, grid = _check(node, specs)
    if specs[2].shape != tuple(grid[:3]) + (2, 3):
        raise GraphError(f"grid_sample's corners {list(specs[2].shape)} do not match its grid {list(grid)}",
                         node=node)
    return Spec((x[0], x[1], grid[1], grid[2]), FLOAT), {"mode": attrs["mode"], "padding_mode": attrs["padding_mode"],
                                                         "align_corners": bool(attrs["align_corners"])}


def _pixels(g, size: int, align_corners: bool):
    """The grid value g (-1 .. 1 spans the image) in pixel coordinates, as torch's grid_sampler_unnormalize."""
    return (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2


def _reflect(u, size: int, align_corners: bool):
    """(s, o) with s * u + o torch's reflect_coordinates(u): reflections about lo and lo + span."""
    lo, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
    if span == 0:
        return np.zeros_like(u), np.zeros_like(u)
    sign = np.where(u - lo < 0, -1.0, 1.0)
    flips = np.floor(np.abs(u - lo) / span)
    even = flips % 2 == 0
    s = np.where(even, sign, -sign)
    o = np.where(even, lo - sign * lo - flips * span, lo + sign * lo + (flips + 1) * span)
    return s, o


def _axis_corners(u, size: int, mode: str, padding_mode: str, align_corners: bool):
    s, o = np.ones_like(u), np.zeros_like(u)
    if padding_mode == "reflection":
        s, o = _reflect(u, size, align_corners)
    if padding_mode != "zeros":  # then clipped to the image, a bound itself clipped (torch: derivative 0)
        c = s * u + o
        s = np.where((c <= 0) | (c >= size - 1), 0.0, s)
        o = np.where(c <= 0, 0.0, np.where(c >= size - 1, size - 1.0, o))
    c = s * u + o
    i0 = np.floor(c) if mode == "bilinear" else np.rint(c)
    return np.stack([np.clip(i0, -2, size + 1), s, o], axis=-1)  # beyond -1 or size every tap reads 0


def _corners(xp, x, grid, *, size, mode, padding_mode, align_corners):
    g = (grid if isinstance(grid, np.ndarray) else to_host(xp, grid)).real  # (complex steps: the base point)
    if not np.all(np.isfinite(g)) or np.any(np.abs(g) > 2.0 ** 40):
        raise ValueError("grid_sample: a grid value is not finite or too far outside the image (|g| > 2**40)")
    out = np.stack([_axis_corners(_pixels(g[..., a].astype(np.float64), size[a], align_corners), size[a], mode,
                                  padding_mode, align_corners) for a in (0, 1)], axis=-2).astype(np.int64)
    return out if isinstance(grid, np.ndarray) else xp.asarray(out)


def _taps(xp, grid, corners, size, mode, align_corners, lead):
    """Per tap (corner of the 2 x 2 cell; nearest: one): the flat pixel index [B, N, P], in-image mask, the
    weight [B, N, P] and its derivatives by grid x and y (None for nearest)."""
    k = corners if isinstance(corners, np.ndarray) else to_host(xp, corners)
    k = np.broadcast_to(k, lead + k.shape[-5:]).reshape((-1, k.shape[-5], k.shape[-4] * k.shape[-3], 2, 3))
    g = xp.broadcast_to(grid, lead + grid.shape[-4:]).reshape(k.shape[:3] + (2,))
    per_axis = []
    for a in (0, 1):
        i0, s, o = k[..., a, 0], k[..., a, 1], k[..., a, 2]
        if mode == "nearest":
            per_axis.append([(i0, None, None)])
            continue
        scale = (size[a] - 1) / 2 if align_corners else size[a] / 2  # d u / d g
        w1 = xp.asarray(s) * _pixels(g[..., a], size[a], align_corners) + xp.asarray(o - i0)
        ds = xp.asarray(s * scale)
        per_axis.append([(i0, 1 - w1, -ds), (i0 + 1, w1, ds)])
    taps = []
    for iy, wy, dy in per_axis[1]:
        for ix, wx, dx in per_axis[0]:
            inside = (iy >= 0) & (iy < size[1]) & (ix >= 0) & (ix < size[0])
            flat = np.clip(iy, 0, size[1] - 1) * size[0] + np.clip(ix, 0, size[0] - 1)
            if wx is None:  # nearest: the pixel itself, no weight
                taps.append((flat, inside, None, None))
            else:
                taps.append((flat, inside, wx * wy, (wy * dx, dy * wx)))
    return taps


def _lead(x, grid, corners):
    return tuple(np.broadcast_shapes(x.shape[:-4], grid.shape[:-4], corners.shape[:-5]))


def _pixel_rows(xp, x, lead):
    """x [..., N, C, H, W] as [B, N, H * W, C]: a pixel per row, to gather and scatter whole rows."""
    n, c, h, w = x.shape[-4:]
    return xp.moveaxis(xp.broadcast_to(x, lead + x.shape[-4:]), -3, -1).reshape((-1, n, h * w, c))


def _forward(xp, x, grid, corners, *, mode, padding_mode, align_corners):  # padding: in the corners
    n, c, h, w = x.shape[-4:]
    lead = _lead(x, grid, corners)
    rows = _pixel_rows(xp, x, lead)
    b, m = np.arange(rows.shape[0])[:, None, None], np.arange(n)[None, :, None]
    out = 0
    for flat, inside, weight, _ in _taps(xp, grid, corners, (w, h), mode, align_corners, lead):
        term = rows[tuple(xp.asarray(i) for i in np.broadcast_arrays(b, m, flat))]
        term = term if weight is None else term * weight[..., None]
        out = out + xp.where(xp.asarray(inside[..., None]), term, 0.0)
    out = xp.broadcast_to(out, rows.shape[:2] + (grid.shape[-3] * grid.shape[-2], c))
    return xp.moveaxis(out.reshape(lead + (n, grid.shape[-3], grid.shape[-2], c)), -1, -3)


def _vjp(xp, g, saved, *, mode, padding_mode, align_corners):
    x, grid, corners = saved
    n, c, h, w = x.shape[-4:]
    lead = _lead(g, grid, corners)  # g [..., N, C, Ho, Wo]: the rank of x
    points = grid.shape[-3] * grid.shape[-2]
    gr = xp.moveaxis(xp.broadcast_to(g, lead + g.shape[-4:]), -3, -1).reshape((-1, n, points, c))
    rows = _pixel_rows(xp, x, lead)
    b, m = np.arange(gr.shape[0])[:, None, None], np.arange(n)[None, :, None]
    g_rows = xp.zeros(rows.shape, dtype=gr.dtype)
    g_grid = [0.0, 0.0]
    for flat, inside, weight, grads in _taps(xp, grid, corners, (w, h), mode, align_corners, lead):
        mask = xp.asarray(inside[..., None])
        where = tuple(xp.asarray(i) for i in np.broadcast_arrays(b, m, flat))
        scatter_add(xp, g_rows, where, xp.where(mask, gr if weight is None else gr * weight[..., None], 0.0))
        if grads is not None:
            seen = xp.sum(xp.where(mask, gr * rows[where], 0.0), axis=-1)
            g_grid = [g_grid[a] + seen * grads[a] for a in (0, 1)]
    g_x = _summed(xp, xp.moveaxis(g_rows.reshape(lead + (n, h, w, c)), -1, -3), x.ndim)
    if mode == "nearest":  # piecewise constant in the grid
        return g_x, xp.zeros(grid.shape, dtype=gr.dtype), None
    return g_x, _summed(xp, xp.stack(g_grid, axis=-1).reshape(lead + grid.shape[-4:]), grid.ndim), None


def _summed(xp, g, ndim: int):
    """g summed over the leading axes its input did not have (broadcast batch axes)."""
    return xp.sum(g, axis=tuple(range(g.ndim - ndim))) if g.ndim > ndim else g


def _kink_distance(grid, size, mode, padding_mode, align_corners):
    """Per grid point [N, Ho, Wo]: how far its pixel coordinate u is, over both axes, from where the corners
    change -- integers for bilinear (floor's jumps, the clipping bounds, align_corners' reflection bounds),
    half-integers for nearest (the rounding's) and for reflection without align_corners (its bounds)."""
    grid = np.asarray(grid, dtype=np.float64)
    out = np.full(grid.shape[:-1], np.inf)
    for a in (0, 1):
        u = _pixels(grid[..., a], size[a], align_corners)
        half = np.abs(u - 0.5 - np.round(u - 0.5))
        d = half if mode == "nearest" else np.abs(u - np.round(u))
        if padding_mode == "reflection" and not align_corners:
            d = np.minimum(d, half)
        out = np.minimum(out, d)
    return out


def _corners_distance(xs, attrs):
    d = _kink_distance(xs[1], attrs["size"], attrs["mode"], attrs["padding_mode"], attrs["align_corners"])
    return np.broadcast_to(d[..., None, None], d.shape + (2, 3))


def _sample_distance(xs, attrs):
    x = np.shape(xs[0])
    d = _kink_distance(xs[1], (x[-1], x[-2]), attrs["mode"], attrs["padding_mode"], attrs["align_corners"])
    return np.broadcast_to(d[..., None, :, :], d.shape[:-2] + (x[-3],) + d.shape[-2:])


def _kink(distance):
    return Kink("a grid point whose pixel coordinate is an integer (bilinear: floor's jumps, the clipping "
              "bounds) or a half-integer (nearest's rounding, reflection bounds without align_corners)",
              "the corner is floor(c) (nearest: c rounded half to even); on a clipping bound the coordinate is "
              "clipped, derivative 0 (as torch)", distance)


def _grid(rng, shape, size, attrs):
    """A grid a little beyond [-1, 1], its points at least 0.05 pixel from every kink."""
    g = rng.uniform(-1.3, 1.3, shape)
    for _ in range(100):
        near = _kink_distance(g, size, attrs["mode"], attrs["padding_mode"], attrs["align_corners"]) < 0.05
        if not near.any():
            return g
        g[near] = rng.uniform(-1.3, 1.3, g[near].shape)
    raise AssertionError("no grid away from the kinks")


CASE_ATTRS = [{"mode": "bilinear", "padding_mode": "zeros", "align_corners": False},
              {"mode": "bilinear", "padding_mode": "border", "align_corners": True},
              {"mode": "bilinear", "padding_mode": "reflection", "align_corners": False},
              {"mode": "bilinear", "padding_mode": "reflection", "align_corners": True},
              {"mode": "nearest", "padding_mode": "zeros", "align_corners": True}]


def _corner_cases(rng):  # a batch of 2: each sample reads its own image
    return [Case([REALS.sample(rng, (2, 2, 3, 4)), _grid(rng, (2, 2, 3, 2), (4, 3), a)], dict(a)) for a in CASE_ATTRS]


def _cases(rng):
    out = []
    for case in _corner_cases(rng):
        a = case.attrs
        k = _corners(np, *case.inputs, size=(4, 3), **a)
        out.append(Case(case.inputs + [k], dict(a)))
    return out


register(OpDef(
    name="grid_sample_corners", forward=_corners, vjp=None, infer=_infer_corners, arity=2,
    input_kinds=(FLOAT, FLOAT), attrs=ATTRS, kinks=(_kink(_corners_distance),),
    cases=_corner_cases, held=True,
    doc="ONNX GridSample's sampling corners (int64 [N, Ho, Wo, 2, 3], no gradient): per grid point and axis "
        "(x, y) the corner i0 and the coordinate's map s * u + o (padding) that grid_sample reads"))

register(OpDef(
    name="grid_sample", forward=_forward, vjp=_vjp, infer=_infer, arity=3, input_kinds=(FLOAT, FLOAT, INT),
    attrs=ATTRS, kinks=(_kink(_sample_distance),), cases=_cases,
    doc="ONNX GridSample (F.grid_sample, 4-D): input sampled at grid's points, bilinear or nearest, with the "
        "corners grid_sample_corners computed; gradients to the input and (bilinear) the grid"))
