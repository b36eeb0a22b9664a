"""Compile a formula's SymPy tree (never its text) for the engine.

`evaluate(tree, env, xp)` walks the tree over xp functions (NumPy, or any
module with NumPy's names), evaluating each shared subexpression once.
`cuda_source(tree, symbols)` emits the body of a CuPy ElementwiseKernel: the
inputs are named in0, in1, ... by position (no user text reaches the C
source) and constants are cast to the kernel's type T.
"""
from __future__ import annotations

import sympy as sp

from ..backend import erf

_XP_FUNCS = {sp.exp: "exp", sp.log: "log", sp.sin: "sin", sp.cos: "cos", sp.tan: "tan", sp.tanh: "tanh",
             sp.sinh: "sinh", sp.cosh: "cosh", sp.atan: "arctan", sp.Abs: "abs", sp.sign: "sign"}
_C_FUNCS = {sp.exp: "exp", sp.log: "log", sp.sin: "sin", sp.cos: "cos", sp.tan: "tan", sp.tanh: "tanh",
            sp.sinh: "sinh", sp.cosh: "cosh", sp.atan: "atan", sp.Abs: "fabs", sp.erf: "erf"}
_REL = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}


class CompileError(Exception):
    pass


def evaluate(tree, env: dict, xp):
    memo: dict = {}

    def ev(e):
        hit = memo.get(e)
        if hit is not None:
            return hit
        v = _node(e, ev, env, xp)
        memo[e] = v
        return v

    return ev(tree)


def _node(e, ev, env, xp):
    if e.is_Symbol:
        return env[e]
    if e.is_Number or e.is_NumberSymbol:
        return float(e)
    if e is sp.true or e is sp.false:
        return bool(e)
    if e.is_Add:
        args = [ev(a) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if e.is_Mul:
        args = [ev(a) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if e.is_Pow:
        base, ex = e.args
        b = ev(base)
        if ex is sp.S.Half:
            return xp.sqrt(b)
        if ex == -sp.S.Half:
            return 1.0 / xp.sqrt(b)
        if ex.is_Integer:
            n = int(ex)
            return b**n if n >= 0 else 1.0 / b**(-n)
        return b ** ev(ex)
    if e.is_Piecewise:
        out = None
        for piece, cond in reversed(e.args):
            v = ev(piece)
            out = v if out is None or cond is sp.true else xp.where(ev(cond), v, out)
        return out
    if e.is_Relational:
        a, b = ev(e.lhs), ev(e.rhs)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[e.rel_op]
    if isinstance(e, sp.And):
        return xp.logical_and.reduce([ev(a) for a in e.args]) if len(e.args) > 2 else \
            xp.logical_and(ev(e.args[0]), ev(e.args[1]))
    if isinstance(e, sp.Or):
        return xp.logical_or(ev(e.args[0]), ev(e.args[1])) if len(e.args) == 2 else \
            xp.logical_or.reduce([ev(a) for a in e.args])
    if isinstance(e, sp.Not):
        return xp.logical_not(ev(e.args[0]))
    if e.func in (sp.Max, sp.Min):
        f = xp.maximum if e.func is sp.Max else xp.minimum
        args = [ev(a) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = f(out, a)
        return out
    if e.func is sp.Heaviside:
        x = ev(e.args[0])
        h0 = float(e.args[1]) if len(e.args) > 1 else 0.5
        return xp.where(x > 0, 1.0, xp.where(x == 0, h0, 0.0))
    if e.func is sp.erf:
        x = ev(e.args[0])
        return erf(xp, xp.asarray(x))
    name = _XP_FUNCS.get(e.func)
    if name is None:
        raise CompileError(f"no array form for {e.func.__name__}")
    return getattr(xp, name)(ev(e.args[0]))


def cuda_source(tree, symbols) -> str:
    """C expression for the kernel `y = <expr>;`, inputs in0..inN-1 of type T."""
    names = {s: f"in{k}" for k, s in enumerate(symbols)}

    def c(e) -> str:
        if e.is_Symbol:
            return names[e]
        if e.is_Number or e.is_NumberSymbol:
            return f"((T){float(e)!r})"
        if e is sp.true:
            return "true"
        if e is sp.false:
            return "false"
        if e.is_Add:
            return "(" + " + ".join(c(a) for a in e.args) + ")"
        if e.is_Mul:
            return "(" + " * ".join(c(a) for a in e.args) + ")"
        if e.is_Pow:
            base, ex = e.args
            if ex is sp.S.Half:
                return f"sqrt({c(base)})"
            if ex.is_Integer and abs(int(ex)) <= 4:
                n = int(ex)
                prod = "(" + " * ".join([c(base)] * abs(n)) + ")" if n else "((T)1)"
                return prod if n >= 0 else f"(((T)1) / {prod})"
            return f"pow({c(base)}, {c(ex)})"
        if e.is_Piecewise:
            out = None
            for piece, cond in reversed(e.args):
                out = c(piece) if out is None or cond is sp.true else f"({c(cond)} ? {c(piece)} : {out})"
            return out
        if e.is_Relational:
            return f"({c(e.lhs)} {_REL[e.rel_op]} {c(e.rhs)})"
        if isinstance(e, (sp.And, sp.Or)):
            return "(" + (" && " if isinstance(e, sp.And) else " || ").join(c(a) for a in e.args) + ")"
        if isinstance(e, sp.Not):
            return f"(!{c(e.args[0])})"
        if e.func in (sp.Max, sp.Min):
            f = "fmax" if e.func is sp.Max else "fmin"
            out = c(e.args[0])
            for a in e.args[1:]:
                out = f"{f}({out}, {c(a)})"
            return out
        if e.func is sp.Heaviside:
            x = c(e.args[0])
            h0 = float(e.args[1]) if len(e.args) > 1 else 0.5
            return f"({x} > 0 ? ((T)1) : ({x} == 0 ? ((T){h0!r}) : ((T)0)))"
        if e.func is sp.sign:
            x = c(e.args[0])
            return f"((T)(({x} > 0) - ({x} < 0)))"
        name = _C_FUNCS.get(e.func)
        if name is None:
            raise CompileError(f"no CUDA form for {e.func.__name__}")
        return f"{name}({c(e.args[0])})"

    return c(tree)
