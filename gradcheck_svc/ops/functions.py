"""The registry's elementwise functions, as the tables other modules read.

No list of functions is kept anywhere else. An op joins a table by a field
on its OpDef:
- `formula_name`: a user formula (the `expr` op) may call it, and the parser
  builds it with the op's own `sympy` form (`formula_functions`);
- `numpy`: NumPy's function of the same inputs and attributes; the symbolic
  array module offers it over SymPy objects (`array_functions`) and the
  client tracer's generated trace-time values use it
  (scripts/gen_client_ops.py);
- `torch`: the torch reference test's mapping (tests/ops/test_torch_reference.py);
- `onnx`: the ONNX importer's direct mappings (onnx_import/converters.py).

The code that evaluates SymPy trees (ops/formula_compile.py for NumPy, CuPy
and CUDA; oracles/mp_eval.py for mpmath) needs no table of ours: it resolves
SymPy's function classes through SymPy's own printers and lambdify's module
translations. tests/ops/test_function_tables.py fails when any of them lacks a
function that a formula or an op's SymPy form (or its derivative) produces.

FORMULA_ONLY is the one exception, said once: functions a formula may call
that are no op (the engine has no node for them). Registering one as an op
with `formula_name` moves it out of here; a name in both is an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Callable

import sympy as sp

from .base import FLOAT, OpDef
from .registry import REGISTRY


@dataclass(frozen=True)
class Function:
    name: str  # as a formula spells it
    arity: int
    sympy: Callable  # (*SymPy arguments) -> SymPy expression
    op: str | None = None  # the registry op it is; None for a formula-only function


FORMULA_ONLY = (
    Function("tan", 1, sp.tan),
    Function("sinh", 1, sp.sinh),
    Function("cosh", 1, sp.cosh),
    Function("atan", 1, sp.atan),
    Function("erf", 1, sp.erf),
)


def _op_function(name: str, op: OpDef) -> Function:
    return Function(name, op.arity, lambda *args: op.sympy(sp, *args), op.name)


@cache  # the registry is complete once gradcheck_svc.ops is imported, before any formula is parsed
def formula_functions() -> dict[str, Function]:
    """Name -> Function for every function a user formula may call."""
    table = {op.formula_name: _op_function(op.formula_name, op) for op in REGISTRY.values() if op.formula_name}
    for f in FORMULA_ONLY:
        if f.name in table:
            raise ValueError(f"formula function '{f.name}' is both an op ({table[f.name].op}) and formula-only")
        table[f.name] = f
    return table


@cache
def array_functions() -> dict[str, Function]:
    """NumPy name -> Function for every elementwise op of float inputs that NumPy has by name."""
    return {op.numpy: _op_function(op.numpy, op) for op in REGISTRY.values()
            if op.numpy and op.sympy is not None and op.arity and all(k == FLOAT for k in op.input_kinds)}
