"""Masks: comparisons of float values (equal, less, greater, less_equal, greater_equal), the logic of
bool masks (logical_not, logical_and, logical_or, logical_xor) and isnan / isinf.

Each produces a bool tensor, read by `where` (elementwise.py). A mask is piecewise constant in its
inputs: its derivative is 0 wherever it is defined, so these ops have no vjp (no gradient flows
through them; a parameter read only through a mask gets an exact zero) and a comparison's ties are
its kinks, where finite differences see a step. Their SymPy forms give the mask as 0/1 (the symbolic
oracle evaluates them and reads the result as index data) so the audit checks their forward values.
"""
from __future__ import annotations

from .base import BOOL, FLOAT, REALS, Case, Kink, OpDef, Spec, binary_cases, broadcast_shapes, unary_case
from .registry import register


def _infer_mask(node, specs, attrs):
    return Spec(broadcast_shapes(node, [s.shape for s in specs]), BOOL), attrs


def _mask(name, forward, sympy, *, arity, input_kind, cases, doc, numpy=None, torch=None, onnx=None, kinks=()):
    register(OpDef(
        name=name, forward=forward, vjp=None, infer=_infer_mask, arity=arity, input_kinds=(input_kind,) * arity,
        broadcast=arity > 1, sympy=sympy, cases=cases, kinks=tuple(kinks), doc=doc, held=True,
        numpy=numpy, torch=torch, onnx=onnx))


def _tie(xs, attrs):
    return abs(xs[0] - xs[1])


def _comparison_cases(rng):
    cases = binary_cases(rng, REALS, REALS)
    a = REALS.sample(rng, (2, 4))
    b = a.copy()
    b[0, 1] += 0.5  # ties (equal values) and non-ties in one case: the mask is not all one value
    b[1, 2] -= 0.5
    return cases + [Case([a, b])]


# NOTE comparisons: no gradient (a step function); at a tie the mask flips, a kink of derivative 0.
for _name, _op, _onnx, _np in (("equal", "==", "Equal", "equal"), ("less", "<", "Less", "less"),
                               ("greater", ">", "Greater", "greater"),
                               ("less_equal", "<=", "LessOrEqual", "less_equal"),
                               ("greater_equal", ">=", "GreaterOrEqual", "greater_equal")):
    _mask(_name, (lambda op: lambda xp, a, b: {"==": a == b, "<": a < b, ">": a > b, "<=": a <= b,
                                               ">=": a >= b}[op])(_op),
          (lambda op: lambda sp, a, b: sp.Piecewise((1, sp.Rel(a, b, op)), (0, True)))(_op),
          arity=2, input_kind=FLOAT, cases=_comparison_cases, onnx=_onnx, numpy=_np,
          kinks=[Kink("a == b", "the mask steps; derivative 0 on both sides", _tie)],
          doc=f"the bool mask a {_op} b, broadcast (no gradient)")


def _bool_cases(arity):
    def cases(rng):
        shapes = [((2, 3),) * arity, ((3,), (2, 1))[:arity], ((4,), ())[:arity]]
        return [Case([rng.random(s) > 0.5 for s in pair]) for pair in shapes]
    return cases


# on 0/1 values: not, and, or, xor as arithmetic (the symbolic oracle reads bool inputs as 0/1)
_mask("logical_not", lambda xp, a: ~a, lambda sp, a: 1 - a, arity=1, input_kind=BOOL, cases=_bool_cases(1),
      onnx="Not", numpy="logical_not", doc="the negation of a bool mask")
_mask("logical_and", lambda xp, a, b: a & b, lambda sp, a, b: a * b, arity=2, input_kind=BOOL,
      cases=_bool_cases(2), onnx="And", numpy="logical_and", doc="a and b, bool masks, broadcast")
_mask("logical_or", lambda xp, a, b: a | b, lambda sp, a, b: a + b - a * b, arity=2, input_kind=BOOL,
      cases=_bool_cases(2), onnx="Or", numpy="logical_or", doc="a or b, bool masks, broadcast")
_mask("logical_xor", lambda xp, a, b: a ^ b, lambda sp, a, b: a + b - 2 * a * b, arity=2, input_kind=BOOL,
      cases=_bool_cases(2), onnx="Xor", numpy="logical_xor", doc="a xor b, bool masks, broadcast")

# isnan / isinf: their SymPy form is 0 (SymPy's symbols stand for finite reals), so the registry's
# points are finite; ONNX's node tests (tests/onnx/test_onnx_node_tests.py) check NaN and infinities.
_mask("isnan", lambda xp, x: xp.isnan(x), lambda sp, x: sp.Integer(0), arity=1, input_kind=FLOAT,
      cases=lambda rng: unary_case(rng, REALS), onnx="IsNaN", numpy="isnan", doc="the bool mask of NaN elements")
_mask("isinf", lambda xp, x: xp.isinf(x), lambda sp, x: sp.Integer(0), arity=1, input_kind=FLOAT,
      cases=lambda rng: unary_case(rng, REALS), numpy="isinf", doc="the bool mask of infinite elements (either sign)")
