"""Every culprit on a failing path: each node checked in isolation.

Bisection over adjoints (localize.py) finds the fault nearest the loss; a second fault upstream of it
hides behind the first, because every adjoint below the first is already wrong. Here each node on a
path from a failing parameter to the loss is checked on its own, so an upstream bug is found whether
or not a downstream one exists. For each node C and each differentiable input k, with the
cotangent a the engine actually fed C's backward (right or wrong, a vjp must be linear in it):

1. the rule: C's vjp evaluated in float64 at the float64 forward's values, against J_k^T a by
   float64 finite differences of C's forward alone (finite_diff.local_vjp, refined where it
   disagrees) -- the independent reference; a disagreement is a `rule_error`. Checked in float64
   whatever the engine's dtype, so a rule off by 0.1% cannot hide in float32 rounding;
2. the run: the contribution the engine's backward produced, against the same (now trusted) rule
   evaluated at the values the engine's forward made, in the engine's dtype. They differ by no more
   than that evaluation's rounding (the rounding band: 4 |rule_dtype - rule_64| plus a few ulps of
   the float64 reference) unless the backward read other values than the forward made:
   `cache_corruption`.

A node passing both is individually shown to be within its rounding band. Nodes at (or within a
finite-difference step of) a declared kink are left to the kink analysis (classify.py): there the
local differences straddle the kink and say nothing about the rule.

Cost: the pairs that share an op, its attributes and their shapes are first checked together
(sweep_screen.py: one batched evaluation of the op and of its rule per group, the same differences as
below); only the pairs that screen does not clear are checked one by one as above -- one batched
evaluation of one op per (node, input) (2 x elements up to 32, else 2 x 8 projections), plus two
evaluations of its rule. A 2,000-node chain is a handful of groups, not 4,000 separate checks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.program import Step
from ...oracles.finite_diff import local_vjp, refine_local_vjp
from ..compare import Tolerance
from ..fd_check import fd_check
from ..findings import WorstElement
from .context import Context
from .classify import near_kink
from .localize import local_directions
from .rules import rule_contribution
from .sweep_screen import screen

RULE_TOL = Tolerance.for_dtype("float64")  # the rule is checked in float64, whatever the engine's dtype
ROUNDING_ULPS = 16  # ulps of the reference allowed on top of the measured rounding of the rule


@dataclass
class NodeVerdict:
    """One (node, input) checked in isolation."""

    step: Step
    k: int
    cause: str | None  # None: within its rounding band; "rule_error" | "cache_corruption"
    deferred: bool  # at or near a declared kink: left to the kink analysis
    worst: WorstElement | None = None
    detail: str = ""
    screened: bool = False  # cleared by the batched checks (sweep_screen.py), not checked one by one


def _on_path(ctx: Context, params: list[str]) -> list[tuple[Step, int]]:
    """(step, input index) for every differentiable input of a node that a failing parameter reaches."""
    program = ctx.program
    down = program.downstream(params) | set(params)
    return [(s, k) for s in program.steps if s.needs_grad and s.name in down
            for k, (name, want) in enumerate(zip(s.inputs, s.grad_inputs)) if want and name in down]


def sweep(ctx: Context, params: list[str]) -> list[NodeVerdict]:
    """Every (node, input) on the failing parameters' paths, checked locally (module docstring)."""
    traced = ctx.traced()
    pairs = _on_path(ctx, params)
    cleared = screen(ctx, traced, pairs, RULE_TOL, ROUNDING_ULPS)  # both checks passed, batched by op
    return [_cleared_verdict(ctx, step, k) if (step.name, k) in cleared else check_locally(ctx, traced, step, k)
            for step, k in pairs]


def _cleared_verdict(ctx: Context, step: Step, k: int) -> NodeVerdict:
    """A pair the screen cleared: within its rounding band (deferred all the same at a declared kink)."""
    fd = ctx.fd
    deferred = near_kink(fd.program.by_name[step.name], [fd.base[n] for n in step.inputs], fd.frozen, ctx.dtype)
    return NodeVerdict(step, k, None, deferred is not None, screened=True)


def check_locally(ctx: Context, traced, step: Step, k: int) -> NodeVerdict:
    fd = ctx.fd
    step64 = fd.program.by_name[step.name]
    deferred = near_kink(step64, [fd.base[n] for n in step.inputs], fd.frozen, ctx.dtype) is not None
    a = np.asarray(traced.adjoints.get(step.name, np.zeros(ctx.program.shapes[step.name])), dtype=np.float64)
    a = np.broadcast_to(a, ctx.program.shapes[step.name])
    verdict, rule64 = _rule_check(ctx, step, k, a, deferred)
    if verdict is not None:
        return verdict
    return _run_check(ctx, traced, step, k, a, rule64, deferred)


def _rule_check(ctx: Context, step: Step, k: int, a: np.ndarray, deferred: bool):
    """1. the rule, in float64, against finite differences of this op alone: (a rule_error verdict or None,
    the float64 rule contribution)."""
    fd = ctx.fd
    step64 = fd.program.by_name[step.name]
    name = step.inputs[k]
    shape = ctx.program.shapes[name]
    xs64 = [fd.base[n] for n in step.inputs]
    where = f"input {k} ('{name}')"
    rule64 = rule_contribution(step64, xs64, fd.base[step.name], a, k, shape)
    dirs = local_directions(int(np.prod(shape, dtype=np.int64)), elements=ctx.evidence(name))
    ref, noise = local_vjp(step64, xs64, k, a, dirs)
    projected = rule64.reshape(-1) if dirs is None else dirs @ rule64.reshape(-1)
    check = fd_check(projected, ref, noise, RULE_TOL,
                     lambda which, settled: refine_local_vjp(step64, xs64, k, a, dirs, which, settled))
    if not check.passed:
        cmp = check.comparison
        if dirs is None:
            idx = tuple(int(i) for i in np.unravel_index(cmp.worst_index[0], shape)) if shape else ()
        else:
            idx = ("direction", int(cmp.worst_index[0]))
        worst = WorstElement(idx, cmp.engine_at_worst, cmp.reference_at_worst)
        return NodeVerdict(step, k, "rule_error", deferred, worst,
                           f"its vjp disagrees with the derivative of its own forward at the forward's values, "
                           f"for {where}: {worst.engine:.8g} vs {worst.reference:.8g} (checked in isolation, "
                           "in float64)"), rule64
    return None, rule64


def _run_check(ctx: Context, traced, step: Step, k: int, a: np.ndarray, rule64: np.ndarray,
               deferred: bool) -> NodeVerdict:
    """2. the engine's contribution, against the same rule at the engine's own forward values."""
    name = step.inputs[k]
    shape = ctx.program.shapes[name]
    where = f"input {k} ('{name}')"
    clean = ctx.clean()
    step_d = ctx.program.by_name[step.name]
    dtype = np.dtype(ctx.dtype)
    rule_d = rule_contribution(step_d, [clean[n] for n in step.inputs], clean[step.name], a.astype(dtype), k, shape)
    engine = np.asarray(traced.contributions.get((step.name, k), np.zeros(shape)), dtype=np.float64)
    engine = np.broadcast_to(engine, shape)
    eps = float(np.finfo(dtype).eps)
    with np.errstate(all="ignore"):
        err = np.abs(engine - rule64)
        band = 4 * np.abs(rule_d - rule64) + ROUNDING_ULPS * eps * (np.abs(rule64) + float(np.max(np.abs(rule64),
                                                                                                 initial=0.0)))
        bad = ~(err <= band) & ~(np.isnan(engine) & np.isnan(rule64))
    if not bad.any():
        return NodeVerdict(step, k, None, deferred)
    flat = int(np.argmax(np.where(bad, np.nan_to_num(err / np.maximum(band, 1e-300), nan=np.inf), -1.0)))
    idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    worst = WorstElement(idx, float(engine.reshape(-1)[flat]), float(rule64.reshape(-1)[flat]))
    return NodeVerdict(step, k, "cache_corruption", deferred, worst,
                       f"its vjp is right at the forward's values, yet the backward's gradient for {where} differs "
                       f"({worst.engine:.8g} vs {worst.reference:.8g}, beyond the {ctx.dtype} rounding band "
                       f"{float(band.reshape(-1)[flat]):.3g}): it read values other than the forward's "
                       f"(integrity checking {ctx.options.integrity})")
