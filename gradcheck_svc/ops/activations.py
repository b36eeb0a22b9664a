"""The activations of today's exported models that elementwise.py lacks: erf (the exact GELU's
decomposition by PyTorch's exporters), hard_sigmoid and hard_swish (MobileNetV3).

Each is one `unary` row like those in elementwise.py: forward, derivative, SymPy form, domain, kinks.
"""
from __future__ import annotations

import math

from ..backend import erf
from .base import FLOAT, Attr, Case, Domain, Kink, OpDef, unary_case
from .elementwise import _UNARY_RULES, _infer_same, unary
from .registry import register

TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

unary("erf", lambda xp, x: erf(xp, x), lambda xp, x, y: TWO_OVER_SQRT_PI * xp.exp(-x * x), uses="x",
      sympy=lambda sp, x: sp.erf(x), torch="torch.erf", onnx="Erf", doc="the error function erf(x)")


# NOTE hard_sigmoid: derivative alpha strictly inside 0 < alpha*x + beta < 1 and 0 at both corners
# (as torch.nn.functional.hardsigmoid's backward, whose corners are x = -3 and x = 3).
def _hard_sigmoid(xp, x, alpha=0.2, beta=0.5):
    return xp.minimum(xp.maximum(alpha * x + beta, 0.0), 1.0)


def _hard_sigmoid_grad(xp, x, y, alpha=0.2, beta=0.5):
    u = alpha * x + beta
    return (alpha * ((u > 0) & (u < 1))).astype(x.dtype)


def _hard_sigmoid_select(xp, x, alpha=0.2, beta=0.5):
    """The piece: -1 on the flat 0 (u <= 0), 1 on the flat 1 (u >= 1), 0 on the slope; the corners
    belong to the flat pieces, as the derivative convention 0 there."""
    u = alpha * x + beta
    return (u >= 1).astype(xp.int8) - (u <= 0).astype(xp.int8)


def _hard_sigmoid_frozen(xp, s, x, alpha=0.2, beta=0.5):
    return xp.where(s < 0, 0.0, xp.where(s > 0, 1.0, alpha * x + beta))


def _corner_distance(alpha, beta):
    """|x - corner| for the two corners alpha*x + beta = 0 and = 1."""
    def distance(xs, attrs):
        import numpy as np

        a, b = attrs.get("alpha", alpha), attrs.get("beta", beta)
        return np.minimum(np.abs(xs[0] + b / a), np.abs(xs[0] - (1.0 - b) / a))
    return distance


_WIDE = Domain(-4.0, 4.0, avoid=(-2.5, 2.5, -3.0, 3.0))  # the default corners first


def _hard_sigmoid_cases(rng):
    # ONNX's defaults (corners -2.5, 2.5) and PyTorch's alpha = 1/6 (corners -3, 3)
    inside = Domain(-2.4, 2.4)  # mostly on the slope: every point has a non-zero gradient
    return unary_case(rng, inside) + [Case([_WIDE.sample(rng, (2, 5))], {"alpha": 1.0 / 6.0})]


_hs_save, _hs_vjp = _UNARY_RULES["x"](_hard_sigmoid_grad)
register(OpDef(
    name="hard_sigmoid", forward=_hard_sigmoid, vjp=_hs_vjp, save=_hs_save, infer=_infer_same, arity=1,
    input_kinds=(FLOAT,), attrs={"alpha": Attr("float", 0.2), "beta": Attr("float", 0.5)},
    sympy=lambda sp, x, alpha=0.2, beta=0.5: sp.Min(sp.Max(sp.Float(alpha) * x + sp.Float(beta), 0), 1),
    domain=(_WIDE,), cases=_hard_sigmoid_cases, select=_hard_sigmoid_select, frozen=_hard_sigmoid_frozen,
    kinks=(Kink("alpha*x + beta == 0 or == 1", "derivative 0 (as PyTorch)", _corner_distance(0.2, 0.5)),),
    doc="max(0, min(1, alpha * x + beta)) (ONNX HardSigmoid; PyTorch's is alpha = 1/6)"))


# NOTE hard_swish: derivative x/3 + 1/2 on the closed interval [-3, 3], 0 below, 1 above
# (as PyTorch's hardswish backward: -1/2 at x = -3 and 3/2 at x = 3).
def _hard_swish(xp, x):
    return x * xp.minimum(xp.maximum(x + 3.0, 0.0), 6.0) / 6.0


def _hard_swish_grad(xp, x, y):
    return xp.where(x < -3.0, 0.0, xp.where(x <= 3.0, x / 3.0 + 0.5, 1.0)).astype(x.dtype)


def _hard_swish_select(xp, x):
    """The piece: -1 below -3, 1 above 3, 0 on the closed interval (the convention's x/3 + 1/2 at both)."""
    return (x > 3.0).astype(xp.int8) - (x < -3.0).astype(xp.int8)


def _hard_swish_frozen(xp, s, x):
    return xp.where(s < 0, 0.0, xp.where(s > 0, x * 6.0 / 6.0, x * (x + 3.0) / 6.0))


unary("hard_swish", _hard_swish, _hard_swish_grad, uses="x", select=_hard_swish_select, frozen=_hard_swish_frozen,
      sympy=lambda sp, x: x * sp.Min(sp.Max(x + 3, 0), 6) / 6,
      domain=Domain(-4.5, 4.5, avoid=(-3.0, 3.0)),
      kinks=[Kink("x == -3 or x == 3", "derivative x/3 + 1/2 at both (as PyTorch)",
                  lambda xs, attrs: __import__("numpy").minimum(abs(xs[0] + 3.0), abs(xs[0] - 3.0)))],
      torch="torch.nn.functional.hardswish", onnx="HardSwish", doc="x * relu6(x + 3) / 6 (MobileNetV3)")
