"""Saved-tensor integrity and in-place writes, from the saved-tensor store's events
(engine/saved.py): a fingerprint that changed with no in-place write is cache_corruption; a
version that changed is inplace_overwrite (error if the value the backward read differs from
the forward's, info if it is the same -- a safe in-place op).
"""
from __future__ import annotations

import numpy as np

from ...backend import get_backend
from ...engine.program import Step
from ..findings import Finding, WorstElement
from ..parameter_result import Screen
from .context import Context


def _first_change(read: np.ndarray, expected: np.ndarray):
    """(index, before, after, max abs change) of the first differing element, or None."""
    read = np.asarray(read, dtype=np.float64)
    expected = np.broadcast_to(np.asarray(expected, dtype=np.float64), read.shape)
    same = (read == expected) | (np.isnan(read) & np.isnan(expected))
    if same.all():
        return None
    flat = int(np.argmin(same.reshape(-1)))
    idx = tuple(int(i) for i in np.unravel_index(flat, read.shape)) if read.shape else ()
    with np.errstate(invalid="ignore"):
        change = np.abs(read - expected)
    biggest = float(np.nanmax(np.where(same, 0.0, np.nan_to_num(change, nan=np.inf))))
    return idx, float(expected.reshape(-1)[flat]), float(read.reshape(-1)[flat]), biggest


def _expected_saved(ctx: Context, step: Step, slot: int):
    clean = ctx.clean()
    xs = [clean[n] for n in step.inputs]
    saved = step.op.save(xs, clean[step.name], **step.attrs) if step.op.save else tuple(xs)
    return np.asarray(saved[slot])


def _change_text(change) -> str:
    idx, before, after, biggest = change
    if not idx:
        return f"{before:g} → {after:g}"
    return f"{before:g} → {after:g} at {list(idx)}; max change {biggest:.3g}"


def _role(step: Step, source: str | None, slot: int) -> str:
    if source is None:
        return f"saved tensor {slot}"
    if source == step.name:
        return f"saved output '{source}'"
    return f"saved input '{source}'"


def integrity_findings(ctx: Context) -> list[Finding]:
    to_host = get_backend(ctx.options.device).to_host
    # with those failing, the parameters the joint screen flagged and left undecided for the follow-up's budget
    # (joint_check.spare): the corruption upstream is what they are flagged for (their rows read "affected")
    failed = {r.name for r in ctx.results if not r.passed or (r.unresolved and r.fd.screen is Screen.BY_SCREEN)}
    out = []
    for ev in ctx.engine.events:
        step = ctx.program.by_name[ev.node]
        read = np.asarray(to_host(ev.tensor))
        change = _first_change(read, _expected_saved(ctx, step, ev.slot))
        what = _role(step, ev.source, ev.slot)
        params = ctx.params_through(ev.node)
        params = [p for p in params if p in failed] or params
        worst = None if change is None else WorstElement(change[0], change[2], change[1])
        if ev.kind == "corruption":
            if change is None:  # the bits changed but not the value (e.g. -0.0 for 0.0)
                continue
            out.append(Finding(ev.node, step.op.name, "cache_corruption", "error",
                               f"{what} changed between forward and backward ({_change_text(change)})", params,
                               worst))
            continue
        writer = ev.writers[-1] if ev.writers else "?"
        if change is None:
            out.append(Finding(ev.node, step.op.name, "inplace_overwrite", "info",
                               f"in-place node '{writer}' wrote the buffer of {what} after it was saved (version "
                               f"{ev.saved_version} → {ev.version}), but the value the backward needs is "
                               "unchanged: safe", params))
        else:
            out.append(Finding(ev.node, step.op.name, "inplace_overwrite", "error",
                               f"{what} was overwritten in place by node '{writer}' after it was saved (version "
                               f"{ev.saved_version} → {ev.version}) and before the backward read it "
                               f"({_change_text(change)})", params, worst))
    return out
