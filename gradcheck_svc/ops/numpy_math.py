"""The NumPy functions people write that no composition of other ops gives exactly: arctan, arctan2, expm1,
sign, floor, ceil, prod, and the square-matrix functions inv, det and solve (numpy.linalg).

The tracer composes the rest (var, std, tan, sinh, dot, einsum, stack, ...: clients/python/
gradcheck_core/numpy_compose.py) from registry ops; these need a derivative rule of their own.
"""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from .base import FLOAT, REALS, Case, Domain, Kink, OpDef, Spec, save_inputs
from .elementwise import _abs_distance, binary, unary
from .reduce import REDUCE_ATTRS, _cases as _reduce_cases
from .reduce import _infer_reduce, _keep
from .registry import register

unary("arctan", lambda xp, x: xp.arctan(x), lambda xp, x, y: 1.0 / (1.0 + x * x), uses="x",
      sympy=lambda sp, x: sp.atan(x), numpy="arctan", torch="torch.atan", onnx="Atan", doc="arctangent (radians)")
unary("arcsin", lambda xp, x: xp.arcsin(x), lambda xp, x, y: 1.0 / xp.sqrt(1.0 - x * x), uses="x",
      sympy=lambda sp, x: sp.asin(x), domain=Domain(-0.9, 0.9), numpy="arcsin", torch="torch.asin", onnx="Asin",
      doc="arcsine (radians), defined on [-1, 1]; its derivative is infinite at the ends")
unary("expm1", lambda xp, x: xp.expm1(x), lambda xp, x, y: y + 1.0, uses="y",
      sympy=lambda sp, x: sp.exp(x) - 1, numpy="expm1", torch="torch.expm1", doc="exp(x) - 1, accurate near 0")


def _integer_distance(xs, attrs):
    x = np.asarray(xs[0])
    return np.abs(x - np.round(x))


# NOTE sign, floor, ceil: derivative 0 everywhere, at their jumps too (as PyTorch and autograd): the step's
# derivative is zero almost everywhere, and at a jump no finite number is right. Their input is marked not
# differentiable, so no gradient flows through them (the same zero, without a node of zeros to check).
_STEPS = Domain(-2.0, 2.0, avoid=(-2.0, -1.0, 0.0, 1.0, 2.0), gap=0.1)
unary("sign", lambda xp, x: xp.sign(x), lambda xp, x, y: 0.0 * x, uses="x",
      sympy=lambda sp, x: sp.Piecewise((1, x > 0), (-1, x < 0), (0, True)),
      domain=Domain(avoid=(0.0,)), kinks=[Kink("x == 0", "derivative 0 (a jump)", _abs_distance())],
      numpy="sign", torch="torch.sign", onnx="Sign", differentiable=(False,), held=True,
      doc="-1, 0 or 1 by the sign of x (derivative 0)")


def _step_sympy(base):
    """SymPy's floor/ceiling with derivative 0 (SymPy leaves theirs unevaluated, which no evaluator can
    compute). The class keeps SymPy's name, so printers and the mpmath walker resolve it as SymPy's own."""
    import sympy as sp

    cls = _STEP_CLASSES.get(base)
    if cls is None:
        cls = _STEP_CLASSES[base] = type(getattr(sp, base).__name__, (getattr(sp, base),),
                                         {"fdiff": lambda self, argindex=1: sp.S.Zero})
    return cls


_STEP_CLASSES: dict = {}
unary("floor", lambda xp, x: xp.floor(x), lambda xp, x, y: 0.0 * x, uses="x",
      sympy=lambda sp, x: _step_sympy("floor")(x),
      domain=_STEPS, kinks=[Kink("x an integer", "derivative 0 (a jump)", _integer_distance)],
      numpy="floor", torch="torch.floor", onnx="Floor", differentiable=(False,), held=True,
      doc="largest integer <= x (derivative 0)")
unary("ceil", lambda xp, x: xp.ceil(x), lambda xp, x, y: 0.0 * x, uses="x",
      sympy=lambda sp, x: _step_sympy("ceiling")(x),
      domain=_STEPS, kinks=[Kink("x an integer", "derivative 0 (a jump)", _integer_distance)],
      numpy="ceil", torch="torch.ceil", onnx="Ceil", differentiable=(False,), held=True,
      doc="smallest integer >= x (derivative 0)")


def _arctan2_grads(xp, g, s):
    y, x = s
    r2 = x * x + y * y
    return g * x / r2, -g * y / r2


# NOTE arctan2: at the origin the angle is not even continuous (no kink convention can hold): 0/0 gives NaN
# there, as in PyTorch; the test domain keeps away from it.
def _arctan2(xp, y, x):
    """On complex128 (complex-step differences; NumPy's arctan2 takes no complex): the real parts' angle plus
    the analytic angle of (x, y) from it, arctan(cross / dot), whose real part is exactly 0."""
    if getattr(y, "dtype", None) is None or (y.dtype.kind != "c" and x.dtype.kind != "c"):
        return xp.arctan2(y, x)
    yr, xr = xp.real(y), xp.real(x)
    return xp.arctan2(yr, xr) + xp.arctan((y * xr - x * yr) / (x * xr + y * yr))


binary("arctan2", _arctan2, _arctan2_grads, sympy=lambda sp, y, x: sp.atan2(y, x),
       domain=(Domain(0.3, 2.0, signed_magnitude=True), Domain(0.3, 2.0)),
       numpy="arctan2", torch="torch.atan2", doc="the angle of the point (x, y): arctan2(y, x), radians")


# --- prod --------------------------------------------------------------------------------------------


def _prod(xp, x, axes, keepdims, **_):
    return xp.prod(x, axis=axes, keepdims=keepdims)


def _prod_vjp(xp, g, s, axes, keepdims, in_shape, **_):
    """d prod / d x_i = the product of the others, from exclusive running products on both sides: exact where
    some x_j are zero (g * prod / x would divide by them)."""
    (x,) = s
    moved_axes = [a + x.ndim for a in axes]
    kept = [i for i in range(x.ndim) if i not in moved_axes]
    order = kept + moved_axes
    flat = xp.transpose(x, order).reshape(tuple(x.shape[i] for i in kept) + (-1,))
    ones = xp.ones(flat.shape[:-1] + (1,), dtype=x.dtype)
    left = xp.cumprod(xp.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
    right = xp.flip(xp.cumprod(xp.flip(xp.concatenate([flat[..., 1:], ones], axis=-1), axis=-1), axis=-1), axis=-1)
    others = (left * right).reshape(tuple(x.shape[i] for i in order))
    others = xp.transpose(others, list(np.argsort(order)))
    return (others * _keep(xp, g, axes, keepdims),)


register(OpDef(
    name="prod", forward=_prod, vjp=_prod_vjp, infer=_infer_reduce, arity=1, input_kinds=(FLOAT,),
    attrs=REDUCE_ATTRS, save=save_inputs, cases=_reduce_cases, numpy="prod",  # torch.prod: one dim at a time
    doc="product over axes (numpy.prod); its gradient is the product of the other elements, zeros included"))


# --- numpy.linalg: inv, det, solve --------------------------------------------------------------------


def _square(node, shape, what):
    if len(shape) != 2 or shape[0] != shape[1]:
        raise GraphError(f"{what} needs a square matrix, got shape {list(shape)}", node=node)


def _infer_inv(node, specs, attrs):
    _square(node, specs[0].shape, "inv")
    return Spec(specs[0].shape, FLOAT), {}


def _infer_det(node, specs, attrs):
    _square(node, specs[0].shape, "det")
    return Spec((), FLOAT), {}


def _infer_solve(node, specs, attrs):
    a, b = specs[0].shape, specs[1].shape
    _square(node, a, "solve")
    if len(b) != 2 or b[0] != a[0]:
        raise GraphError(f"solve needs b of shape [{a[0]}, k] for a of shape {list(a)}, got {list(b)}", node=node)
    return Spec(b, FLOAT), {}


def _mT(xp, m):
    return xp.swapaxes(m, -1, -2)


def _invertible_cases(rng, n=3):
    return REALS.sample(rng, (n, n)) * 0.3 + 2.0 * np.eye(n)  # well conditioned


# NOTE inv/det/solve: defined for invertible matrices (det's rule uses the inverse, so a singular matrix
# gives inf/NaN there, where its true gradient is the adjugate).
register(OpDef(
    name="inv", forward=lambda xp, a: xp.linalg.inv(a),
    vjp=lambda xp, g, s: (-_mT(xp, s[0]) @ g @ _mT(xp, s[0]),), infer=_infer_inv, arity=1, input_kinds=(FLOAT,),
    save=lambda xs, y, **_: (y,), numpy="linalg.inv", torch="torch.linalg.inv",
    cases=lambda rng: [Case([_invertible_cases(rng)]), Case([_invertible_cases(rng, 1)])],
    doc="matrix inverse (numpy.linalg.inv), for an invertible square matrix"))
register(OpDef(
    name="det", forward=lambda xp, a: xp.linalg.det(a),
    vjp=lambda xp, g, s: (xp.asarray(g)[..., None, None] * s[1][..., None, None] * _mT(xp, xp.linalg.inv(s[0])),),
    infer=_infer_det, arity=1, input_kinds=(FLOAT,), save=lambda xs, y, **_: (xs[0], y), numpy="linalg.det",
    torch="torch.linalg.det", cases=lambda rng: [Case([_invertible_cases(rng)]), Case([_invertible_cases(rng, 2)])],
    doc="determinant (numpy.linalg.det); its gradient det * inv(a)^T needs a invertible"))
register(OpDef(
    name="solve", forward=lambda xp, a, b: xp.linalg.solve(a, b),
    vjp=lambda xp, g, s: _solve_vjp(xp, g, s), infer=_infer_solve, arity=2, input_kinds=(FLOAT, FLOAT),
    save=lambda xs, y, **_: (xs[0], y), numpy="linalg.solve", torch="torch.linalg.solve",
    cases=lambda rng: [Case([_invertible_cases(rng), REALS.sample(rng, (3, 2))])],
    doc="x with a @ x = b (numpy.linalg.solve), b of shape [n, k], for an invertible a"))


def _solve_vjp(xp, g, s):
    a, x = s
    gb = xp.linalg.solve(_mT(xp, a), g)
    return -gb @ _mT(xp, x), gb

