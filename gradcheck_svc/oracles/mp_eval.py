"""Evaluate a SymPy expression tree numerically in mpmath, at high precision.

Why our own walker rather than `evalf(subs=...)` or `lambdify`: evalf is
slow on thousands of small expressions, lambdify compiles Python source per
expression; a walker over the tree with a memo shared by every expression of
one graph node evaluates each shared subexpression once, at the precision of
a private mpmath context (thread-safe: the global `mpmath.mp` is not touched).

Functions resolve to mpmath's by the names lambdify would use (no table of
ours); tests/ops/test_function_tables.py checks every function our ops, the
formula parser and SymPy's derivatives of them produce. Anything else raises
Unsupported, which the callers turn into a `skipped` oracle or a failed audit
row, never a guess. (bench/bench_tree_eval.py measures this walker against
lambdify(modules="mpmath"); BENCHMARKS.md has the numbers.)
"""
from __future__ import annotations

import threading

import mpmath
import sympy as sp
from sympy.utilities.lambdify import MPMATH_TRANSLATIONS


class Unsupported(Exception):
    """The tree holds a SymPy object this evaluator has no rule for."""


_contexts = threading.local()  # per thread: digits -> its private MPContext


def make_context(digits: int) -> mpmath.MPContext:
    """A private context at `digits`, one per thread and precision: building one costs about a
    millisecond (mpmath wraps all its functions), more than a small graph's whole oracle. Private
    to the thread, it is never shared between concurrent verifications; no caller changes its
    precision."""
    cache = getattr(_contexts, "by_digits", None)
    if cache is None:
        cache = _contexts.by_digits = {}
    ctx = cache.get(digits)
    if ctx is None:
        ctx = cache[digits] = mpmath.MPContext()
        ctx.dps = digits
    return ctx


class MpEvaluator:
    def __init__(self, ctx: mpmath.MPContext):
        self.ctx = ctx
        c = ctx
        half = c.mpf(1) / 2
        # Rules of our own only where mpmath has no function of the name, or where a derivative
        # meets a kink; every other SymPy function resolves to mpmath's (see `function`).
        self.functions = {
            sp.Max: lambda *a: max(a), sp.Min: lambda *a: min(a),
            sp.Heaviside: lambda x, h0=half: c.one if x > 0 else (c.zero if x < 0 else h0),
            sp.DiracDelta: lambda x, *k: c.zero if x != 0 else c.nan,
        }

    def function(self, func):
        """The context's function for a SymPy function class: mpmath's function of the name
        lambdify would print for it (SymPy's MPMATH_TRANSLATIONS: Abs -> fabs, ...), so no
        table of ours lists exp, log, erf, ... again."""
        f = self.functions.get(func)
        if f is None:
            f = getattr(self.ctx, MPMATH_TRANSLATIONS.get(func.__name__, func.__name__), None)
            if not callable(f):
                raise Unsupported(f"function {func.__name__}")
            self.functions[func] = f
        return f

    def value(self, expr, env: dict, memo: dict):
        """expr at env (Symbol -> mpf); memo caches subexpressions between calls with the same env."""
        hit = memo.get(expr)
        if hit is not None:
            return hit
        v = self._value(expr, env, memo)
        memo[expr] = v
        return v

    def _value(self, e, env, memo):
        c = self.ctx
        if e.is_Symbol:
            try:
                return env[e]
            except KeyError:
                raise Unsupported(f"free symbol {e}") from None
        if e.is_Number or e.is_NumberSymbol:
            return self._number(e)
        if e is sp.true:
            return True
        if e is sp.false:
            return False
        if e.is_Add:
            return c.fsum(self.value(a, env, memo) for a in e.args)
        if e.is_Mul:
            return c.fprod(self.value(a, env, memo) for a in e.args)
        if e.is_Pow:
            return self._power(e, env, memo)
        if e.is_Piecewise:
            for piece, cond in e.args:
                if self.value(cond, env, memo):
                    return self.value(piece, env, memo)
            return c.nan
        if e.is_Relational:
            lhs, rhs = self.value(e.lhs, env, memo), self.value(e.rhs, env, memo)
            return {"<": lhs < rhs, "<=": lhs <= rhs, ">": lhs > rhs, ">=": lhs >= rhs,
                    "==": lhs == rhs, "!=": lhs != rhs}[e.rel_op]
        if isinstance(e, sp.And):
            return all(self.value(a, env, memo) for a in e.args)
        if isinstance(e, sp.Or):
            return any(self.value(a, env, memo) for a in e.args)
        if isinstance(e, sp.Not):
            return not self.value(e.args[0], env, memo)
        if e.func not in self.functions and not isinstance(e, sp.Function):  # not a function: Tuple, Integral...
            raise Unsupported(f"{type(e).__name__} {e}")
        f = self.function(e.func)
        args = [self.value(a, env, memo) for a in e.args]
        try:
            r = f(*args)
        except (ValueError, ZeroDivisionError):
            return c.nan
        return c.nan if isinstance(r, c.mpc) else r  # e.g. log of a negative number: not real

    def _number(self, e):
        """A SymPy number or constant (pi, E, oo, nan) in the context."""
        c = self.ctx
        if e.is_Rational:
            return c.mpf(e.p) / e.q if e.q != 1 else c.mpf(e.p)
        if e.is_Float:
            return c.mpf(e._mpf_)
        if e.is_NumberSymbol:  # pi, E: at the context's precision plus guard bits
            return c.mpf(e._as_mpf_val(c.prec + 20))
        if e in (sp.nan, sp.zoo, sp.oo, -sp.oo):
            return {sp.oo: c.inf, -sp.oo: -c.inf}.get(e, c.nan)
        raise Unsupported(f"number {e}")

    def _power(self, e, env, memo):
        """base**exponent on the reals: NaN outside their domain (a negative base to a non-integer power),
        inf for zero to a negative power."""
        c = self.ctx
        base, ex = e.args
        b = self.value(base, env, memo)
        if ex is sp.S.Half:
            return c.sqrt(b) if b >= 0 else c.nan
        if ex.is_Integer:
            return b ** int(ex) if (b != 0 or ex > 0) else c.inf
        x = self.value(ex, env, memo)
        if b < 0:
            if x == c.floor(x):  # an integer-valued exponent (e.g. a constant input 2.0)
                return b ** int(x)
            return c.nan  # a real power of a negative base: outside the real domain
        if b == 0:
            return c.zero if x > 0 else (c.one if x == 0 else c.inf)
        return c.power(b, x)
