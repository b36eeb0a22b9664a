"""NaN / Inf: the first node whose forward output or vjp contribution is non-finite while its
own inputs (forward) or incoming adjoint (backward) are finite -- or, when a graph input is
itself NaN/Inf, the first op that reads it and passes it on (maximum, minimum and clip
included: NumPy and PyTorch propagate NaN through them)."""
from __future__ import annotations

import numpy as np

from ..findings import Finding, WorstElement
from .context import Context, inputs_at
from .rules import rule_contribution


def _first_nonfinite(a: np.ndarray):
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    flat = int(np.argmax(bad.reshape(-1)))
    return tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.shape else (), float(a.reshape(-1)[flat])


def _finite(a) -> bool:
    a = np.asarray(a)
    return a.dtype.kind != "f" or bool(np.isfinite(a).all())


def nonfinite_findings(ctx: Context) -> list[Finding]:
    """Where a NaN/Inf in the loss or a gradient was born: the first node whose forward makes one from finite
    inputs (or that a non-finite graph input reaches), and the first vjp that makes one from a finite adjoint."""
    eng = ctx.engine
    bad_params = [p for p, g in eng.gradients.items() if not _finite(g)]
    if np.isfinite(eng.loss) and not bad_params:
        return []
    params = list(ctx.program.params) if not np.isfinite(eng.loss) else bad_params
    clean = ctx.clean()
    out = _forward_origin(ctx, clean, params)
    _backward_origin(ctx, clean, params, out, forward_origin=bool(out))
    return list(out.values())


def _forward_origin(ctx: Context, clean: dict, params: list) -> dict[str, Finding]:
    """The first node making NaN/Inf in the forward pass ({} if none), by name."""
    out: dict[str, Finding] = {}
    produced = set(ctx.program.by_name)
    for step in ctx.program.steps:  # forward: the first node making NaN/Inf from finite inputs
        y = clean[step.name]
        if _finite(y):
            continue
        bad_inputs = [n for n in dict.fromkeys(step.inputs) if not _finite(clean[n])]
        if bad_inputs and all(n in produced for n in bad_inputs):
            continue  # it passes on what an earlier node made
        idx, val = _first_nonfinite(np.asarray(y, dtype=np.float64))
        if bad_inputs:  # a graph input is NaN/Inf: named at the first op it reaches the output of
            fed = [n for n in bad_inputs if n not in produced]
            j, v = _first_nonfinite(np.asarray(clean[fed[0]], dtype=np.float64))
            out[step.name] = Finding(step.name, step.op.name, "nonfinite", "error",
                                     f"forward produced {val:g} at {list(idx)} from the non-finite graph input "
                                     f"'{fed[0]}' ({v:g} at {list(j)}; {inputs_at(step, clean, idx)})",
                                     params, WorstElement(idx, val, float("nan")))
            return out
        ref = float(np.asarray(ctx.fd.base[step.name], dtype=np.float64).reshape(-1)[
            np.ravel_multi_index(idx, np.shape(y)) if idx else 0])
        out[step.name] = Finding(step.name, step.op.name, "nonfinite", "error",
                                 f"forward produced {val:g} at {list(idx)} from finite inputs "
                                 f"({inputs_at(step, clean, idx)})",
                                 params, WorstElement(idx, val, ref))
        return out
    return out


def _backward_origin(ctx: Context, clean: dict, params: list, out: dict, forward_origin: bool) -> None:
    """The first vjp making NaN/Inf from a finite adjoint, added to out (or to its node's forward finding)."""
    traced = ctx.traced()
    for step in reversed(ctx.program.steps):  # backward: the first vjp making NaN/Inf from a finite adjoint
        a = traced.adjoints.get(step.name)
        if a is None or not _finite(a):
            continue
        if forward_origin and not all(_finite(clean[n]) for n in step.inputs):
            continue  # it reads the non-finite forward values already named: a consequence, not an origin
        for k, name in enumerate(step.inputs):
            c = traced.contributions.get((step.name, k))
            if c is None or _finite(c):
                continue
            idx, val = _first_nonfinite(c)
            detail = f"backward (vjp) produced {val:g} for input '{name}' at {list(idx)} from a finite adjoint"
            step64 = ctx.fd.program.by_name[step.name]
            rule = rule_contribution(step64, [ctx.fd.base[n] for n in step.inputs], ctx.fd.base[step.name], a, k,
                                     ctx.program.shapes[name])
            if step.name not in out and _finite(rule):
                # the same rule at the forward's values is finite: the backward read other values
                out[step.name] = Finding(
                    step.name, step.op.name, "cache_corruption", "error",
                    f"{detail}, though its vjp is finite at the forward's values ({rule.reshape(-1)[0]:g} there): it "
                    f"read values other than the forward's (integrity checking {ctx.options.integrity})", params,
                    WorstElement(idx, val, float(rule[idx] if idx else rule.reshape(-1)[0])))
            elif step.name in out:
                out[step.name].detail += f"; {detail}"
            else:
                out[step.name] = Finding(step.name, step.op.name, "nonfinite", "error", detail, params,
                                         WorstElement(idx, val, float("nan")))
            return
