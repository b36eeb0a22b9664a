"""A plain description of an op, generated from its OpDef (for `ops` and ListOps)."""
from __future__ import annotations

import json

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


def describe_text(d: dict) -> list[str]:
    """One op for `gradcheck-svc ops`: its line of doc, then inputs, attributes, formula, kinks."""
    inputs = (", ".join(d["inputs"]) or "none") if d["arity"] != "n" else f"{d['inputs'][0]}, ... (any number)"
    lines = [f"{d['name']}: {d['doc']}",
             f"    inputs: {inputs}"]
    attrs = [_attr_text(k, a) for k, a in d["attributes"].items()]
    lines.append("    attributes: " + ("; ".join(attrs) if attrs else "none"))
    if d["formula"] is not None:
        with_attrs = " (with the default attributes)" if d["attributes"] else ""
        lines.append(f"    formula: {d['formula']}{with_attrs}")
    elif d["name"] == "expr":
        lines.append("    formula: the node's own (its `formula` attribute)")
    else:
        lines.append("    formula: structural (moves, gathers or reduces elements; no scalar formula)")
    if d.get("numpy"):
        lines.append(f"    numpy: {d['numpy']}")
    for k in d["kinks"]:
        lines.append(f"    kink: {k['where']}; convention: {k['convention']}")
    if not d["kinks"]:
        lines.append("    kinks: none")
    return lines
