"""resize: ONNX Resize (and Upsample) in modes nearest and linear (bilinear, trilinear), with the
coordinate transformations nn.Upsample / F.interpolate export: half_pixel, pytorch_half_pixel,
align_corners and asymmetric.

Both modes are linear in x and separable: along each resized axis the output is M @ x with a
static interpolation matrix M (out x in; nearest: one 1 per row; linear: the two neighbours'
weights 1 - t and t), built once by `infer` from the shapes, scales and modes. The forward applies
each axis's M, the vjp its transpose, and the symbolic oracle runs the same forward over SymPy
arrays. Coordinates outside the input are clamped to its edge, as ONNX's reference and PyTorch do.

NOTE nearest: the output is x at a position chosen by the shapes alone, so it is smooth in x; its
kinks are in the coordinates, which are not inputs.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from .base import FLOAT, REALS, Attr, Case, OpDef, Spec, save_nothing
from .registry import register

MODES = ("nearest", "linear")
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_coordinate(mode: str, out: np.ndarray, n_in: int, scale: float) -> np.ndarray:
    """ONNX's x_original of each output position x_resized (its coordinate_transformation_mode), with
    ONNX's length_resized = n_in * scale (unrounded, as its reference evaluator reads the spec)."""
    length = n_in * scale
    if mode == "half_pixel":
        return (out + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (out + 0.5) / scale - 0.5 if length != 1 else np.full_like(out, -0.5)
    if mode == "align_corners":
        return out * (n_in - 1) / (length - 1) if length != 1 else np.zeros_like(out)
    return out / scale  # asymmetric


def _nearest_index(src: np.ndarray, rule: str) -> np.ndarray:
    frac = src - np.floor(src)
    if rule == "floor":
        return np.floor(src)
    if rule == "ceil":
        return np.ceil(src)
    half = np.isclose(frac, 0.5, rtol=0.0, atol=1e-9)
    rounded = np.floor(src + 0.5)
    return np.where(half, np.floor(src) if rule == "round_prefer_floor" else np.ceil(src), rounded)


def interpolation_matrix(n_in: int, n_out: int, scale: float, attrs: dict) -> np.ndarray:
    """The (n_out, n_in) matrix of one axis: output = M @ input along it."""
    src = source_coordinate(attrs["coordinate_transformation_mode"], np.arange(n_out, dtype=np.float64), n_in, scale)
    m = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    if attrs["mode"] == "nearest":
        m[rows, np.clip(_nearest_index(src, attrs["nearest_mode"]), 0, n_in - 1).astype(np.int64)] = 1.0
        return m
    lo = np.floor(src)
    t = src - lo
    np.add.at(m, (rows, np.clip(lo, 0, n_in - 1).astype(np.int64)), 1.0 - t)
    np.add.at(m, (rows, np.clip(lo + 1, 0, n_in - 1).astype(np.int64)), t)
    return m


def _infer(node, specs, attrs):
    shape = specs[0].shape
    sizes, scales = attrs["sizes"], attrs["scales"]
    for key, choices in (("mode", MODES), ("coordinate_transformation_mode", TRANSFORMS),
                         ("nearest_mode", NEAREST)):
        if attrs[key] not in choices:
            raise GraphError(f"resize: {key} '{attrs[key]}' is not one of {', '.join(choices)}", node=node)
    if (sizes is None) == (scales is None):
        raise GraphError("resize needs exactly one of 'sizes' and 'scales'", node=node)
    given = sizes if sizes is not None else scales
    if len(given) != len(shape):
        raise GraphError(f"resize: {len(given)} {'sizes' if sizes is not None else 'scales'} for an input of "
                         f"rank {len(shape)}", node=node)
    if scales is not None:
        if any(not s > 0 for s in scales):
            raise GraphError(f"resize: scales must be positive, got {list(scales)}", node=node)
        out = tuple(math.floor(n * s) for n, s in zip(shape, scales))  # ONNX: floor(input * scale)
    else:
        out = tuple(int(d) for d in sizes)
        scales = [o / n if n else 1.0 for o, n in zip(out, shape)]
    if min(out, default=1) < 1:
        raise GraphError(f"resize: output shape {list(out)} has an empty axis", node=node)
    maps = []
    for i, (n, o, s) in enumerate(zip(shape, out, scales)):
        m = interpolation_matrix(n, o, float(s), attrs)
        if m.shape != (n, n) or not np.array_equal(m, np.eye(n)):
            maps.append((i - len(shape), m))
    return Spec(out, FLOAT), {"maps": tuple(maps)}


def _along(xp, x, axis, m):
    """m applied along axis: out[..., j, ...] = sum_i m[j, i] x[..., i, ...]."""
    moved = xp.moveaxis(x, axis, -1)
    return xp.moveaxis(xp.matmul(moved, xp.asarray(m.T, dtype=x.dtype)), -1, axis)


def _resize(xp, x, maps):
    for axis, m in maps:
        x = _along(xp, x, axis, m)
    return x


def _resize_vjp(xp, g, saved, maps):
    for axis, m in reversed(maps):
        g = _along(xp, g, axis, m.T)
    return (g,)


def _cases(rng):
    x4, x3 = REALS.sample(rng, (1, 2, 3, 4)), REALS.sample(rng, (2, 1, 5))
    return [
        Case([x4], {"scales": [1.0, 1.0, 2.0, 2.0], "mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                    "nearest_mode": "floor"}),
        Case([x4], {"sizes": [1, 2, 5, 7], "mode": "linear", "coordinate_transformation_mode": "half_pixel"}),
        Case([x4], {"sizes": [1, 2, 6, 3], "mode": "linear", "coordinate_transformation_mode": "align_corners"}),
        Case([x3], {"scales": [1.0, 1.0, 1.5], "mode": "linear",
                    "coordinate_transformation_mode": "pytorch_half_pixel"}),
        Case([x3], {"sizes": [2, 1, 3], "mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                    "nearest_mode": "round_prefer_ceil"}),
        Case([x3], {"sizes": [2, 1, 8], "mode": "linear", "coordinate_transformation_mode": "asymmetric"}),
    ]


register(OpDef(
    name="resize", forward=_resize, vjp=_resize_vjp, infer=_infer, arity=1, input_kinds=(FLOAT,),
    attrs={"sizes": Attr("ints", None, doc="the output shape (one of sizes, scales)"),
           "scales": Attr("value", None, doc="per axis, output / input (one of sizes, scales)"),
           "mode": Attr("str", "nearest", MODES),
           "coordinate_transformation_mode": Attr("str", "half_pixel", TRANSFORMS),
           "nearest_mode": Attr("str", "round_prefer_floor", NEAREST)},
    save=save_nothing, cases=_cases,
    doc="ONNX Resize, nearest or (multi)linear, as nn.Upsample / F.interpolate export it"))
