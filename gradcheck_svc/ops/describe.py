"""A plain description of an op, generated from its OpDef (for `ops` and ListOps)."""
from __future__ import annotations

from .base import REQUIRED, OpDef


def describe(op: OpDef) -> dict:
    formula = None
    if op.sympy is not None and op.arity is not None:  # variadic ops (expr) have a formula per node
        import sympy as sp

        names = "x" if op.arity == 1 else ("a", "b") if op.arity == 2 else ("c", "a", "b")
        syms = sp.symbols(names) if op.arity != 1 else (sp.Symbol("x"),)
        formula = str(op.sympy(sp, *syms))
    return {
        "name": op.name,
        "arity": "n" if op.arity is None else op.arity,
        "inputs": list(op.input_kinds),
        "attributes": {k: {"kind": a.kind, "default": None if a.default is REQUIRED else a.default,
                           "required": a.default is REQUIRED, "choices": list(a.choices)}
                       for k, a in op.attrs.items()},
        "formula": formula,
        "kinks": [{"where": k.where, "convention": k.convention} for k in op.kinks],
        "doc": op.doc,
    }
