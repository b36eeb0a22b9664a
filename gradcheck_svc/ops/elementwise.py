"""Elementwise ops: one table row per op, each with its derivative, its SymPy
formula (used by the symbolic oracle and the op audit, never by the engine),
its smooth domain and its kinks.

Unary rows give `d(xp, x, y)`, dy/dx elementwise, and say whether it needs the
input x, the output y, or both; the vjp is then g * d. Composite ops keep
their own derivative here (no generic autodiff of the forward) so each op is
checked on its own.
"""
from __future__ import annotations

import math

from ..backend import erf
from .base import (
    BOOL,
    FLOAT,
    NONZERO,
    POSITIVE,
    REALS,
    Attr,
    Case,
    Domain,
    Kink,
    OpDef,
    Spec,
    binary_cases,
    broadcast_shapes,
    save_inputs,
    save_nothing,
    unary_case,
)
from .registry import register

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _infer_same(node, specs, attrs):
    return Spec(specs[0].shape, FLOAT), attrs


def _infer_broadcast(node, specs, attrs):
    return Spec(broadcast_shapes(node, [s.shape for s in specs]), FLOAT), attrs


def _abs_distance(point=0.0):
    return lambda xs, attrs: abs(xs[0] - point)


def _rules_none(d):
    return save_nothing, lambda xp, g, saved, **a: (g * d(xp, None, None, **a),)


def _rules_x(d):
    return (lambda xs, y, **_: (xs[0],)), (lambda xp, g, saved, **a: (g * d(xp, saved[0], None, **a),))


def _rules_y(d):
    return (lambda xs, y, **_: (y,)), (lambda xp, g, saved, **a: (g * d(xp, None, saved[0], **a),))


def _rules_xy(d):
    return (lambda xs, y, **_: (xs[0], y)), (lambda xp, g, saved, **a: (g * d(xp, saved[0], saved[1], **a),))


_UNARY_RULES = {"": _rules_none, "x": _rules_x, "y": _rules_y, "xy": _rules_xy}


def unary(name, f, d, *, uses, sympy, domain=REALS, kinks=(), attrs=None, doc="", formula_name=None, numpy=None,
          torch=None, onnx=None, differentiable=None, select=None, frozen=None, held=False, frozen_linear=False):
    """Register an elementwise unary op y = f(x) with dy/dx = d(xp, x, y, **attrs).

    uses: "x", "y" or "xy" -- what the derivative reads, hence what is saved.
    formula_name, numpy, torch, onnx, select, frozen, held, frozen_linear: see OpDef."""

    # one save/vjp pair per `uses`, chosen here rather than on every call: these run
    # once per node per pass, and small-array graphs are dominated by such overhead
    save, vjp = _UNARY_RULES[uses](d)

    register(
        OpDef(
            name=name,
            forward=f,
            vjp=vjp,
            infer=_infer_same,
            arity=1,
            input_kinds=(FLOAT,),
            attrs=attrs or {},
            save=save,
            sympy=sympy,
            domain=(domain,),
            kinks=tuple(kinks),
            cases=lambda rng, dom=domain: unary_case(rng, dom),
            doc=doc,
            formula_name=formula_name,
            numpy=numpy,
            torch=torch,
            onnx=onnx,
            differentiable=differentiable,
            select=select,
            frozen=frozen,
            held=held,
            frozen_linear=frozen_linear,
        )
    )


# --- smooth unary ------------------------------------------------------------------

unary("neg", lambda xp, x: -x, lambda xp, x, y: -1.0, uses="", sympy=lambda sp, x: -x,
      numpy="negative", torch="torch.neg", onnx="Neg", doc='-x')
unary("square", lambda xp, x: x * x, lambda xp, x, y: 2.0 * x, uses="x", sympy=lambda sp, x: x**2,
      numpy="square", torch="torch.square", doc='x * x')
unary("sqrt", lambda xp, x: xp.sqrt(x), lambda xp, x, y: 0.5 / y, uses="y",
      sympy=lambda sp, x: sp.sqrt(x), domain=POSITIVE, formula_name="sqrt", numpy="sqrt", torch="torch.sqrt",
      onnx="Sqrt",       doc='square root, for x > 0')
unary("exp", lambda xp, x: xp.exp(x), lambda xp, x, y: y, uses="y", sympy=lambda sp, x: sp.exp(x),
      formula_name="exp", numpy="exp", torch="torch.exp", onnx="Exp", doc='e ** x')
unary("log", lambda xp, x: xp.log(x), lambda xp, x, y: 1.0 / x, uses="x",
      sympy=lambda sp, x: sp.log(x), domain=POSITIVE, formula_name="log", numpy="log", torch="torch.log",
      onnx="Log",       doc='natural logarithm, for x > 0')
unary("log1p", lambda xp, x: xp.log1p(x), lambda xp, x, y: 1.0 / (1.0 + x), uses="x",
      sympy=lambda sp, x: sp.log(1 + x), domain=Domain(-0.8, 3.0),
      formula_name="log1p", numpy="log1p", torch="torch.log1p", doc='log(1 + x), accurate near 0, for x > -1')
unary("sin", lambda xp, x: xp.sin(x), lambda xp, x, y: xp.cos(x), uses="x", sympy=lambda sp, x: sp.sin(x),
      formula_name="sin", numpy="sin", torch="torch.sin", onnx="Sin", doc='sine (radians)')
unary("cos", lambda xp, x: xp.cos(x), lambda xp, x, y: -xp.sin(x), uses="x", sympy=lambda sp, x: sp.cos(x),
      formula_name="cos", numpy="cos", torch="torch.cos", onnx="Cos", doc='cosine (radians)')
unary("tanh", lambda xp, x: xp.tanh(x), lambda xp, x, y: 1.0 - y * y, uses="y",
      sympy=lambda sp, x: sp.tanh(x), formula_name="tanh", numpy="tanh", torch="torch.tanh", onnx="Tanh",
      doc='hyperbolic tangent')


def _logaddexp0(xp, x):
    """log(1 + exp(x)) without overflow. On complex128 (complex-step differences, which NumPy's logaddexp
    does not take) the same shift by the real part's max: the real part picks the branch."""
    if getattr(x, "dtype", None) is not None and x.dtype.kind == "c":
        m = xp.maximum(x.real, 0.0)
        return m + xp.log(xp.exp(-m) + xp.exp(x - m))
    return xp.logaddexp(0.0, x)


def _sigmoid(xp, x):
    # exp(-softplus(-x)): no overflow for any x, 4 array passes instead of 9; relative
    # error <= 4e-15 for |x| < 50 and 1.4e-14 up to |x| = 745 (checked against mpmath)
    return xp.exp(-_logaddexp0(xp, -x))


unary("sigmoid", _sigmoid, lambda xp, x, y: y * (1.0 - y), uses="y",
      sympy=lambda sp, x: 1 / (1 + sp.exp(-x)), formula_name="sigmoid", torch="torch.sigmoid", onnx="Sigmoid",
      doc='logistic function 1 / (1 + exp(-x))')


def _softplus(xp, x):
    return _logaddexp0(xp, x) if hasattr(xp, "logaddexp") else xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


unary("softplus", _softplus, lambda xp, x, y: _sigmoid(xp, x), uses="x",
      sympy=lambda sp, x: sp.log(1 + sp.exp(x)), doc="log(1 + exp(x)), computed stably",
      formula_name="softplus", torch="torch.nn.functional.softplus", onnx="Softplus")


def _gelu(xp, x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + xp.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + erf(xp, x * INV_SQRT_2))


def _gelu_grad(xp, x, y, approximate="none"):
    if approximate == "tanh":
        u = SQRT_2_OVER_PI * (x + 0.044715 * x**3)
        t = xp.tanh(u)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
    return 0.5 * (1.0 + erf(xp, x * INV_SQRT_2)) + x * INV_SQRT_2PI * xp.exp(-0.5 * x * x)


def _gelu_sympy(sp, x, approximate="none"):
    if approximate == "tanh":
        return x / 2 * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (x + sp.Rational(44715, 1000000) * x**3)))
    return x / 2 * (1 + sp.erf(x / sp.sqrt(2)))


unary("gelu", _gelu, _gelu_grad, uses="x", sympy=_gelu_sympy,
      attrs={"approximate": Attr("str", "none", ("none", "tanh"), "erf form or tanh approximation")},
      torch="torch.nn.functional.gelu", doc='Gaussian error linear unit x * Phi(x) (exact erf form)')

# --- unary with kinks (each NOTE says the convention at the kink) -------------------

# NOTE relu: derivative 0 at x == 0 (as PyTorch); saves the output, whose sign is enough.
# The derivative stays a bool mask: the vjp g * mask (the same values as g * float mask: NaN, inf
# and all) makes two passes over the activations, where a float copy of the mask made three.
def _positive(xp, x, **_):
    """The piece of relu-like ops: x > 0 (at x == 0 the left piece, as their derivative convention)."""
    return x > 0


unary("relu", lambda xp, x: xp.maximum(x, 0.0), lambda xp, x, y: y > 0, uses="y",
      select=_positive, frozen=lambda xp, s, x: xp.where(s, x, 0.0), frozen_linear=True,
      sympy=lambda sp, x: sp.Piecewise((x, x > 0), (0, True)),
      domain=Domain(avoid=(0.0,)), kinks=[Kink("x == 0", "derivative 0", _abs_distance())],
      formula_name="relu", torch="torch.relu", onnx="Relu", doc='max(x, 0)')

# NOTE leaky_relu: derivative negative_slope at x == 0 (as PyTorch).
unary("leaky_relu",
      lambda xp, x, negative_slope=0.01: xp.where(x > 0, x, x * negative_slope),
      lambda xp, x, y, negative_slope=0.01: xp.where(x > 0, 1.0, negative_slope).astype(x.dtype),
      uses="x", select=_positive, frozen=lambda xp, s, x, negative_slope=0.01: xp.where(s, x, x * negative_slope),
      frozen_linear=True,
      sympy=lambda sp, x, negative_slope=0.01: sp.Piecewise((x, x > 0), (sp.Float(negative_slope) * x, True)),
      attrs={"negative_slope": Attr("float", 0.01)},
      domain=Domain(avoid=(0.0,)), kinks=[Kink("x == 0", "derivative negative_slope", _abs_distance())],
      torch="torch.nn.functional.leaky_relu", doc='x for x > 0, negative_slope * x otherwise')

# NOTE elu: derivative alpha * scale at x == 0 (the left one, as PyTorch); smooth there when alpha == 1.
# One op serves ONNX Elu (scale 1) and Selu (its alpha, and gamma as the scale).
unary("elu",
      lambda xp, x, alpha=1.0, scale=1.0: scale * xp.where(x > 0, x, alpha * (xp.exp(xp.minimum(x, 0.0)) - 1)),
      lambda xp, x, y, alpha=1.0, scale=1.0: scale * xp.where(x > 0, 1.0, alpha * xp.exp(xp.minimum(x, 0.0))),
      uses="x", select=_positive,
      frozen=lambda xp, s, x, alpha=1.0, scale=1.0: scale * xp.where(s, x, alpha * (xp.exp(xp.where(s, 0.0, x)) - 1)),
      sympy=lambda sp, x, alpha=1.0, scale=1.0: sp.Float(scale) * sp.Piecewise(
          (x, x > 0), (sp.Float(alpha) * (sp.exp(x) - 1), True)),
      attrs={"alpha": Attr("float", 1.0), "scale": Attr("float", 1.0)},
      domain=Domain(avoid=(0.0,)), kinks=[Kink("x == 0", "derivative alpha * scale (the left one)", _abs_distance())],
      doc='scale * (x for x > 0, alpha * (exp(x) - 1) otherwise): ELU, and SELU with its alpha and scale')

# NOTE abs: derivative sign(x), 0 at x == 0 (as PyTorch).
unary("abs", lambda xp, x: xp.abs(x), lambda xp, x, y: xp.sign(x), uses="x",
      select=lambda xp, x: xp.sign(x), frozen=lambda xp, s, x: s * x, frozen_linear=True,  # sign(x) x, 0 at 0
      sympy=lambda sp, x: sp.Abs(x), domain=Domain(avoid=(0.0,)),
      kinks=[Kink("x == 0", "derivative 0", _abs_distance())], formula_name="abs", numpy="abs", torch="torch.abs", onnx="Abs",
      doc='absolute value |x|')


# NOTE clip: derivative 1 on the closed interval [min, max], 0 outside (as torch.clamp).
def _clip(xp, x, min=None, max=None):
    if min is not None:
        x = xp.maximum(x, min)
    if max is not None:
        x = xp.minimum(x, max)
    return x


def _clip_grad(xp, x, y, min=None, max=None):
    inside = xp.ones(x.shape, dtype=bool)
    if min is not None:
        inside &= x >= min
    if max is not None:
        inside &= x <= max
    return inside.astype(x.dtype)


def _clip_sympy(sp, x, min=None, max=None):
    e = x
    if min is not None:
        e = sp.Max(e, sp.Float(min))
    if max is not None:
        e = sp.Min(e, sp.Float(max))
    return e


def _clip_select(xp, x, min=None, max=None):
    """The piece: -1 below min, 1 above max, 0 on the closed interval (the bounds are inside). In NumPy's
    order, min first: with min > max every element ends at max (piece 1), between them too."""
    raised = xp.maximum(x, min) if min is not None else x
    above = raised > max if max is not None else xp.zeros(x.shape, dtype=bool)
    below = (x < min) & ~above if min is not None else xp.zeros(x.shape, dtype=bool)
    return above.astype(xp.int8) - below.astype(xp.int8)


def _clip_frozen(xp, s, x, min=None, max=None):
    y = x
    if min is not None:
        y = xp.where(s < 0, min, y)
    if max is not None:
        y = xp.where(s > 0, max, y)
    return y


def _clip_distance(xs, attrs):
    import numpy as np

    d = np.full(np.shape(xs[0]), np.inf)
    for b in (attrs.get("min"), attrs.get("max")):
        if b is not None:
            d = np.minimum(d, np.abs(xs[0] - b))
    return d


def _clip_cases(rng):
    dom = Domain(-1.0, 1.2, avoid=(-0.5, 0.7))
    return [Case([dom.sample(rng, s)], a) for s, a in
            [((5,), {"min": -0.5, "max": 0.7}), ((2, 3), {"min": -0.5}), ((4,), {"max": 0.7})]]


register(OpDef(
    name="clip", forward=_clip,
    vjp=lambda xp, g, saved, **a: (g * _clip_grad(xp, saved[0], None, **a),),
    infer=_infer_same, arity=1, input_kinds=(FLOAT,),
    attrs={"min": Attr("float", None), "max": Attr("float", None)},
    save=save_inputs, sympy=_clip_sympy, domain=(Domain(avoid=(-0.5, 0.7)),), select=_clip_select,
    frozen=_clip_frozen,
    kinks=(Kink("x == min or x == max", "derivative 1 at the bounds", _clip_distance),),
    cases=_clip_cases, doc="clip(x, min, max); either bound may be omitted", torch="torch.clamp"))

# --- binary ------------------------------------------------------------------------


def binary(name, f, grads, *, sympy, domain=(REALS, REALS), kinks=(), save=save_inputs, doc="", formula_name=None,
           numpy=None, torch=None, onnx=None, select=None, frozen=None, complex_step=True, linear=False):
    """Register a broadcasting binary op; grads(xp, g, saved) -> (ga, gb) in the broadcast shape.
    Binary ops take no attributes, so grads is the vjp itself (no wrapper call per backward step)."""
    register(OpDef(
        name=name, forward=f, vjp=grads,
        infer=_infer_broadcast, arity=2, input_kinds=(FLOAT, FLOAT), save=save,
        broadcast=True, sympy=sympy, domain=tuple(domain), kinks=tuple(kinks),
        cases=lambda rng, d=domain: binary_cases(rng, *d), doc=doc,
        formula_name=formula_name, numpy=numpy, torch=torch, onnx=onnx, select=select, frozen=frozen,
        complex_step=complex_step, linear=linear))


binary("add", lambda xp, a, b: a + b, lambda xp, g, s: (g, g), sympy=lambda sp, a, b: a + b, save=save_nothing,
       numpy="add", torch="torch.add", onnx="Add", doc='a + b, broadcast', linear=True)
binary("sub", lambda xp, a, b: a - b, lambda xp, g, s: (g, -g), sympy=lambda sp, a, b: a - b, save=save_nothing,
       numpy="subtract", torch="torch.sub", onnx="Sub", doc='a - b, broadcast', linear=True)
binary("mul", lambda xp, a, b: a * b, lambda xp, g, s: (g * s[1], g * s[0]), sympy=lambda sp, a, b: a * b,
       numpy="multiply", torch="torch.mul", onnx="Mul", doc='a * b, broadcast')
binary("div", lambda xp, a, b: a / b, lambda xp, g, s: (g / s[1], -g * s[0] / (s[1] * s[1])),
       sympy=lambda sp, a, b: a / b, domain=(REALS, NONZERO), numpy="divide", torch="torch.div",
       onnx="Div", doc='a / b, broadcast')


# NOTE pow at a == 0 (as PyTorch's pow_backward): d/da a**b = 0 where b == 0 (x**0 is the constant 1, not
# 0 * 0**-1 = NaN), and d/db a**b = 0 where a == 0 and b >= 0 (0**b is 0 or 1 there, not 0 * log 0 = NaN).
def _pow_grads(xp, g, s):
    a, b, y = s
    da = xp.where(b == 0, 0.0, b * a ** (b - 1.0))
    db = xp.where((a == 0) & (b >= 0), 0.0, y * xp.log(a))
    return g * da, g * db


def _pow_zero_distance(xs, attrs):
    import numpy as np

    return np.broadcast_to(np.abs(xs[0]), np.broadcast_shapes(np.shape(xs[0]), np.shape(xs[1])))


def _pow_complex(xs, attrs) -> bool:
    import numpy as np

    return bool(np.all(np.asarray(xs[0]) > 0))


def _pow_sympy(sp, a, b):
    """a ** b, with the convention at a == 0 written into the formula, so that SymPy's derivatives are the
    engine's there (SymPy's own give 0 * log 0 = NaN): where a == 0 and b == 0 or b >= 1, a piece linear
    in a whose value is 0 ** b and whose slope is PyTorch's b * 0 ** (b - 1) (0 at b == 0), constant in b.
    Elsewhere (where 0 ** b or its slope is infinite) SymPy's own a ** b. Folds to a ** b for a known
    nonzero base."""
    ordinary = sp.Ne(a, 0) | (b < 0) | ((b > 0) & (b < 1))
    at_zero = sp.Piecewise((1, sp.Eq(b, 0)), (0, True)) + a * sp.Piecewise((1, sp.Eq(b, 1)), (0, True))
    return sp.Piecewise((a**b, ordinary), (at_zero, True))


# pow saves its output too: d/db = y * log(a) reuses it.
binary("pow", lambda xp, a, b: a**b, _pow_grads, sympy=_pow_sympy,
       save=lambda xs, y, **_: (xs[0], xs[1], y), domain=(POSITIVE, Domain(-2.0, 2.0)),
       kinks=[Kink("a == 0", "d/da = 0 where b == 0; d/db = 0 where b >= 0 (as PyTorch; the symbolic reference "
                   "has it where b == 0 or b >= 1, and NaN for 0 < b < 1, where d/da is infinite)",
                   _pow_zero_distance)],
       # complex steps only where a > 0: a == 0 is the kink (the kink analysis decides there), and for a < 0
       # the real forward is defined only at integer b, where d/db is not (complex log of a < 0 would give one)
       complex_step=_pow_complex,
       doc="a ** b for a > 0 (both differentiable); at a == 0 PyTorch's convention", numpy="power",
       torch="torch.pow", onnx="Pow")


# NOTE prelu: derivative slope at x == 0 (as PyTorch); slope broadcasts to x (ONNX PRelu).
binary("prelu", lambda xp, x, slope: xp.where(x > 0, x, x * slope),
       lambda xp, g, s: (g * xp.where(s[0] > 0, 1.0, s[1]), g * xp.where(s[0] > 0, 0.0, s[0])),
       sympy=lambda sp, x, slope: sp.Piecewise((x, x > 0), (slope * x, True)),
       select=lambda xp, x, slope: x > 0, frozen=lambda xp, s, x, slope: xp.where(s, x, x * slope),
       domain=(Domain(avoid=(0.0,)), REALS), kinks=[Kink("x == 0", "derivative slope", _abs_distance())],
       doc="x where x > 0, else slope * x (slope broadcast)")

def _tie_distance(xs, attrs):
    return abs(xs[0] - xs[1])


# NOTE maximum/minimum: at a tie the gradient is split evenly, g/2 to each (as PyTorch).
def _extremum_grads(pick):
    def grads(xp, g, s):
        a, b = s
        win_a = pick(a, b).astype(g.dtype) + 0.5 * (a == b).astype(g.dtype)
        return g * win_a, g * (1.0 - win_a)

    return grads


def _winner(pick):
    """The piece of maximum/minimum: 1 where a wins, 0 where b does, 0.5 at a tie (their mean there, as
    the convention splits the gradient)."""
    return lambda xp, a, b: pick(a, b) + 0.5 * (a == b)


def _extremum_frozen(xp, s, a, b):
    return xp.where(s == 1, a, xp.where(s == 0, b, 0.5 * (a + b)))


binary("maximum", lambda xp, a, b: xp.maximum(a, b), _extremum_grads(lambda a, b: a > b),
       sympy=lambda sp, a, b: sp.Max(a, b), select=_winner(lambda a, b: a > b), frozen=_extremum_frozen,
       kinks=[Kink("a == b", "gradient split evenly between a and b", _tie_distance)],
      formula_name="max", numpy="maximum", torch="torch.maximum", doc='elementwise larger of a and b, broadcast')
binary("minimum", lambda xp, a, b: xp.minimum(a, b), _extremum_grads(lambda a, b: a < b),
       sympy=lambda sp, a, b: sp.Min(a, b), select=_winner(lambda a, b: a < b), frozen=_extremum_frozen,
       kinks=[Kink("a == b", "gradient split evenly between a and b", _tie_distance)],
      formula_name="min", numpy="minimum", torch="torch.minimum", doc='elementwise smaller of a and b, broadcast')


# --- where -------------------------------------------------------------------------


def _where_cases(rng):
    return [
        Case([rng.random((2, 3)) > 0.5, REALS.sample(rng, (2, 3)), REALS.sample(rng, (2, 3))]),
        Case([rng.random((3,)) > 0.5, REALS.sample(rng, (2, 1)), REALS.sample(rng, ())]),
    ]


register(OpDef(
    name="where",
    forward=lambda xp, c, a, b: xp.where(c, a, b),
    vjp=lambda xp, g, s, **_: (None, xp.where(s[0], g, 0.0), xp.where(s[0], 0.0, g)),
    infer=_infer_broadcast, arity=3, input_kinds=(BOOL, FLOAT, FLOAT),
    save=lambda xs, y, **_: (xs[0],), broadcast=True,
    sympy=lambda sp, c, a, b: sp.Piecewise((a, sp.Ne(c, 0)), (b, True)),
    cases=_where_cases, doc="where(cond, a, b): a where cond is true, else b",
    numpy="where", torch="torch.where"))
