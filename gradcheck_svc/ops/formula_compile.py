"""Compile a formula's SymPy tree (never its text) for the engine, with SymPy's own printers.

`array_function(tree, symbols, xp)` is SymPy's `lambdify` for NumPy (or any
module with NumPy's names): common subexpressions are computed once (cse),
and the arguments are dummified, so that no user-chosen input name reaches
the generated source -- only SymPy's printing of the tree does. Whatever the
registry's functions produce (erf aside, which NumPy lacks: backend.erf)
prints through NumPy's printer; tests/ops/test_function_tables.py holds it to that.

`cuda_source(tree, symbols)` emits the body of a CuPy ElementwiseKernel with
SymPy's C99 printer: the inputs are named in0, in1, ... by position (no user
text reaches the C source) and constants are cast to the kernel's type T, so
a float32 kernel computes in float32 as the NumPy path does. `cuda_kernel`
is the whole ElementwiseKernel definition the engine builds (ops/expr.py) and
tests/engine/test_cuda_kernels.py compiles with NVRTC (or nvcc) on every commit.
"""
from __future__ import annotations

import builtins
import dis
import math

from functools import lru_cache
from typing import NamedTuple

import sympy as sp
from sympy.printing.c import C99CodePrinter

from sympy.printing.numpy import NumPyPrinter

from ..backend import erf


class CompileError(Exception):
    pass


@lru_cache(maxsize=1024)  # compiling costs 1-8 ms a tree (BENCHMARKS.md); a formula recurs across requests
def array_function(tree, symbols: tuple, xp):
    """A function of arrays (one per symbol, in order, all of one shape) computing `tree` with xp.

    One shape: NumPy's printing of And/Or (`logical_and.reduce((a, b))`) does not broadcast."""
    # SymPy picks its printer by the module's name; the strict test backend (strict_backend.py)
    # offers numpy's API under its own name, so it is given numpy's printer explicitly
    printer = None
    if getattr(xp, "__name__", "") == "strict":  # the settings lambdify gives the printer it picks itself
        printer = NumPyPrinter({"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True,
                                "user_functions": {}})
    f = sp.lambdify(symbols, tree, modules=[{"erf": lambda x: erf(xp, xp.asarray(x))}, xp], cse=True, dummify=True,
                    printer=printer)
    # a function NumPy's printer has no form for is printed by its SymPy name: refuse it now, not mid-run
    names = {i.argval for i in dis.get_instructions(f) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    unknown = sorted(n for n in names if n not in f.__globals__ and n not in vars(builtins))
    if unknown:
        raise CompileError(f"no array form for {', '.join(unknown)}")
    return f


class _KernelPrinter(C99CodePrinter):
    """C99 for `y = <expr>;` in a kernel over inputs in0..inN-1 of type T."""

    def __init__(self, symbols):
        # no math macros: SymPy would print sqrt(2) as M_SQRT2, which <math.h> defines (nvcc and the
        # host compiler have it) and NVRTC, what CuPy compiles with, does not
        super().__init__({"strict": True, "math_macros": {}})
        self._names = {s: f"in{k}" for k, s in enumerate(symbols)}

    def _print(self, expr, **kwargs):
        if isinstance(expr, (sp.Number, sp.NumberSymbol)):
            value = float(expr)
            if not math.isfinite(value):  # repr gives inf / nan, which C does not know: IEEE division
                return {math.inf: "((T)(1.0 / 0.0))", -math.inf: "((T)(-1.0 / 0.0))"}.get(value, "((T)(0.0 / 0.0))")
            return f"((T){value!r})"
        return super()._print(expr, **kwargs)

    def _print_Float(self, flt):  # reached directly for 1/x ("1.0/x")
        return self._print(flt)

    def _print_Pow(self, expr):
        # C99's printer writes x**(1/3) as cbrt(x), real for x < 0, where NumPy's x**(1/3) is NaN:
        # pow() gives NaN there too, so both backends compute the same function
        if expr.exp == sp.Rational(1, 3):
            return f"pow({self._print(expr.base)}, {self._print(expr.exp)})"
        return super()._print_Pow(expr)

    def _print_Symbol(self, s):
        return self._names[s]

    def _print_BooleanTrue(self, e):
        return "true"

    def _print_BooleanFalse(self, e):
        return "false"


def cuda_source(tree, symbols) -> str:
    """C expression for the kernel `y = <expr>;`, inputs in0..inN-1 of type T."""
    try:
        return _KernelPrinter(symbols).doprint(tree)
    except (ValueError, TypeError, NotImplementedError) as exc:  # strict: an unprintable function raises
        raise CompileError(f"no CUDA form for {tree}: {exc}") from None


class ElementwiseSource(NamedTuple):
    """The arguments of cupy.ElementwiseKernel(in_params, out_params, operation, name)."""
    in_params: str
    out_params: str
    operation: str
    name: str


def cuda_kernel(tree, symbols) -> ElementwiseSource:
    """The ElementwiseKernel computing `tree` of the symbols (inputs in0.. and output y, all of type T)."""
    params = ", ".join(f"T in{k}" for k in range(len(symbols)))
    return ElementwiseSource(params, "T y", f"y = {cuda_source(tree, symbols)};", "gradcheck_expr")
