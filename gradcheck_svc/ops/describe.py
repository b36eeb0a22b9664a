"""A plain description of an op, generated from its OpDef (for `ops` and ListOps).

Rendering formulas needs SymPy (~0.5 s to import): only the detailed forms ask for them, so the
one-line listing of `gradcheck-svc ops` stays fast.
"""
from __future__ import annotations

import json

from .base import REQUIRED, OpDef

STRUCTURAL = "structural (moves, gathers or reduces elements; no scalar formula)"


def formula_of(op: OpDef) -> str | None:
    """The op's scalar formula as SymPy prints it (x; a, b; c, a, b), or None (structural, variadic)."""
    if op.sympy is None or op.arity is None:  # variadic ops (expr) have a formula per node
        return None
    import sympy as sp

    names = "x" if op.arity == 1 else ("a", "b") if op.arity == 2 else ("c", "a", "b")
    syms = sp.symbols(names) if op.arity != 1 else (sp.Symbol("x"),)
    return str(op.sympy(sp, *syms))


def describe(op: OpDef, *, formula: bool = True) -> dict:
    """The op as plain data; `formula=False` leaves the formula out (None) and SymPy unimported."""
    return {
        "name": op.name,
        "arity": "n" if op.arity is None else op.arity,
        "inputs": list(op.input_kinds),
        "attributes": {k: {"kind": a.kind, "default": None if a.default is REQUIRED else a.default,
                           "required": a.default is REQUIRED, "choices": list(a.choices)}
                       for k, a in op.attrs.items()},
        "formula": formula_of(op) if formula else None,
        "kinks": [{"where": k.where, "convention": k.convention} for k in op.kinks],
        "doc": op.doc,
        # the NumPy function the client tracer records as this op (more compose from it: docs/service.md)
        "numpy": f"numpy.{op.numpy}" if op.numpy else None,
    }


def _attr_text(name: str, a: dict) -> str:
    if a["required"]:
        value = "required"
    else:
        value = "default " + ("none" if a["default"] is None else json.dumps(a["default"]))
    choices = f", one of {'|'.join(map(str, a['choices']))}" if a["choices"] else ""
    return f"{name} ({a['kind']}, {value}{choices})"


def _inputs(d: dict) -> str:
    return (", ".join(d["inputs"]) or "none") if d["arity"] != "n" else f"{d['inputs'][0]}, ... (any number)"


def describe_line(d: dict, widths: tuple[int, int] = (16, 18)) -> str:
    """One op in one line: name, NumPy name, inputs, doc."""
    return f"{d['name']:<{widths[0]}} {d['numpy'] or '-':<{widths[1]}} {_inputs(d):<18} {d['doc']}"


def describe_lines(rows: list[dict]) -> list[str]:
    """The one-line listing of `gradcheck-svc ops`, with a header."""
    widths = (max(len(r["name"]) for r in rows), max(len(r["numpy"] or "-") for r in rows))
    head = f"{'op':<{widths[0]}} {'numpy':<{widths[1]}} {'inputs':<18} doc"
    return [head, *(describe_line(r, widths) for r in rows)]


def describe_text(d: dict, *, structural_note: bool = True) -> list[str]:
    """One op in full (`gradcheck-svc ops NAME`): its line of doc, then NumPy name, inputs, attributes,
    formula, kinks. With `structural_note=False` a structural op has no formula line (the listing of
    every op says it once at the end instead of twenty times)."""
    lines = [f"{d['name']}: {d['doc']}"]
    if d.get("numpy"):
        lines.append(f"    numpy: {d['numpy']}")
    lines.append(f"    inputs: {_inputs(d)}")
    attrs = [_attr_text(k, a) for k, a in d["attributes"].items()]
    lines.append("    attributes: " + ("; ".join(attrs) if attrs else "none"))
    if d["formula"] is not None:
        with_attrs = " (with the default attributes)" if d["attributes"] else ""
        lines.append(f"    formula: {d['formula']}{with_attrs}")
    elif d["name"] == "expr":
        lines.append("    formula: the node's own (its `formula` attribute)")
    elif structural_note:
        lines.append(f"    formula: {STRUCTURAL}")
    for k in d["kinks"]:
        lines.append(f"    kink: {k['where']}; convention: {k['convention']}")
    if not d["kinks"]:
        lines.append("    kinks: none")
    return lines


def structural_footer(rows: list[dict]) -> list[str]:
    """The structural ops of a full listing, named once."""
    import textwrap

    names = [d["name"] for d in rows if d["formula"] is None and d["name"] != "expr"]
    if not names:
        return []
    return [f"formula {STRUCTURAL}:", *textwrap.wrap(", ".join(names), 96, initial_indent="    ",
                                                     subsequent_indent="    ", break_on_hyphens=False)]
