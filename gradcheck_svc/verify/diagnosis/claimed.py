"""The diagnosis when claimed gradients are the subject (verify/claims.py): the engine's analyses, applied
to the claims, in the order diagnose.py runs them for the engine.

1. localization by the claimed adjoints (claims.localize_claims): the node whose claimed adjoints disagree
   with its own local derivative is a `rule_error`;
2. kinks: a failing claimed parameter whose path crosses a declared kink (exactly at it, or within a
   finite-difference step of it), and whose failing elements all sit where the loss has one (their
   one-sided differences differ), is judged as the engine's gradient is there (classify.py): its claimed
   value must lie between the one-sided differences of the loss -- a warning (not a failure) or an error;
3. float32: a float32 claim over float32's tolerance that nothing else explains gets the precision note
   (a pass) only when its rounding is shown. Where the claim carries adjoints at every value on the
   parameter's path, each value is checked one by one, as the engine's sweep checks its nodes: its claimed
   adjoint agrees with its consumers' local derivatives (step 1's check) and lies within the float32
   rounding band of their rule -- 4 |rule32 - rule64| plus a few ulps, rule32 the engine's rule evaluated
   in float32 at a float32 forward's values with the claimed cotangent cast to float32. Where it does not
   (claimed gradients only: a device's training step), the whole backward is the rule: the claimed
   gradient must be within the same band of the engine's own backward run in float32;
4. notes at exact kinks (kinks.py), worded for the claimed gradient.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ...oracles.fd_modes import FDMode
from ..claims import PROVIDED, consistency, localize_claims
from ..compare import compare
from ..engine_run import run_engine
from ..findings import Finding, WorstElement
from .classify import EPS32, _nondifferentiable, near_kink, one_sided, side_slack
from .context import Context
from .kinks import exact_kink_notes
from .localize import consumers_of
from .local_sweep import ROUNDING_ULPS, RULE_TOL
from .rules import rule_contribution


def diagnose_claims(ctx: Context) -> list[Finding]:
    """The findings on the claimed gradients (module docstring); ctx.dtype is the claims' (their tolerance's)."""
    findings = []
    if ctx.options.localize:
        rounding = _Rounding(ctx) if ctx.dtype == "float32" else None
        findings = localize_claims(ctx.graph, ctx.fd, ctx.results, ctx.tol, ctx.dtype, rounding)
        findings += _kink_findings(ctx, findings)
        if rounding is not None:
            findings += _rounding_notes(ctx, findings, rounding)
    findings += exact_kink_notes(ctx, findings)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])


def _unexplained(ctx: Context, findings: list[Finding]) -> list[str]:
    covered = {p for f in findings if f.severity == "error" or f.cause in ("precision", "nondifferentiable_point")
               for p in f.parameters}
    return [r.name for r in ctx.results if r.claim == PROVIDED and not r.passed and r.name not in covered]


def _kink_findings(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """Each failing parameter at the declared kink nearest the loss on its path, judged by the one-sided
    differences of the loss (classify._nondifferentiable: the same test as the engine's) -- when the loss has
    a kink along every one of its failing elements (their one-sided differences differ): an element off where
    the loss is smooth is a plain mismatch, whatever kinks the graph has."""
    fd = ctx.fd
    at: dict = {}
    rows = {r.name: r for r in ctx.results}
    for p in _unexplained(ctx, findings):
        down = fd.program.downstream([p])
        on_path = (s for s in reversed(fd.program.steps)
                   if s.needs_grad and any(n in down for n, want in zip(s.inputs, s.grad_inputs) if want))
        kinked = next(((s, near) for s in on_path
                       if (near := near_kink(s, [fd.base[n] for n in s.inputs], fd.frozen, ctx.dtype)) is not None),
                      None)
        if kinked is not None and _straddles(ctx, rows[p]):
            at.setdefault(kinked[0].name, (*kinked, []))[2].append(p)
    return [_nondifferentiable(ctx, step, near, params) for step, near, params in at.values()]


def _straddles(ctx: Context, r) -> bool:
    """Every failing element (or direction) of r sits where the loss has a kink: its one-sided differences
    differ by more than twice the slack a (sub)gradient is allowed outside them (classify.side_slack)."""
    lo, hi, _, _ = one_sided(ctx, r)
    with np.errstate(invalid="ignore"):
        return bool(lo.size) and bool(np.all(hi - lo > 2 * side_slack(ctx.tol, lo, hi)))


def _rounding_notes(ctx: Context, findings: list[Finding], rounding: "_Rounding") -> list[Finding]:
    out = []
    for p in _unexplained(ctx, findings):
        values = _path_values(ctx, p)
        r = next(r for r in ctx.results if r.name == p)
        if values is not None and all(rounding(v) for v in values):
            how = (f"each of the {len(values)} values on its path holds a claimed adjoint within its float32 rounding "
                   "band of the float64 reference, checked one by one")
        elif values is None and rounding.whole(r):
            how = ("the claim carries no adjoints along its path, and it is within the float32 rounding band of "
                   "the whole backward (4x the engine's own float32 backward's distance from the reference)")
        else:
            continue
        c = r.fd.comparison
        out.append(Finding(p, "input", "precision", "info",
                           f"float32 rounding: its claimed gradient is off the float64 reference by "
                           f"{c.max_abs_error:.3g} (tolerance atol {r.tolerance.atol:g}, rtol {r.tolerance.rtol:g}), "
                           f"yet {how}; pass", [p], WorstElement(tuple(c.worst_index), c.engine_at_worst,
                                                                 c.reference_at_worst)))
    return out


def _path_values(ctx: Context, p: str) -> list[str] | None:
    """The values between p and the loss (p included), when each holds a claimed adjoint (a parameter: its
    claimed gradient) and so does each of its consumers; None when any lacks one (then the path cannot be
    checked value by value)."""
    program = ctx.fd.program
    claims = ctx.graph.claims
    known = {**claims.adjoints, **claims.gradients, program.output: None}
    consumers = consumers_of(program)
    values = [v for v in program.downstream([p]) if v in consumers]
    if not values or any(v not in known or any(s.name not in known for s, _ in consumers[v]) for v in values):
        return None
    return values


class _Rounding:
    """Whether float32 rounding explains a claim's disagreement with its reference (the module docstring's
    step 3): for one value, against its consumers' rule; for a parameter, against the whole backward. The
    float32 (and float64) engine runs it needs are made once, and only when asked."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        claims = ctx.graph.claims
        self.known = {**claims.adjoints, **claims.gradients}
        self.known.setdefault(ctx.fd.program.output, np.ones(ctx.fd.program.shapes[ctx.fd.program.output]))
        self.at = functools.cache(lambda dtype: _engine_at(ctx, dtype))
        self.seen: dict = {}

    def __call__(self, v: str) -> bool:
        """v's claimed adjoint within the float32 rounding band of its consumers' rule applied to their
        claimed adjoints (local_sweep.py's band, summed over the consumers), that rule in float64 agreeing
        with finite differences of the consumers' forwards (so the rule is a reference); a consumer at or
        near a kink shows nothing."""
        if v not in self.seen:
            self.seen[v] = self._value(v)
        return self.seen[v]

    def _value(self, v: str) -> bool:
        fd, known = self.ctx.fd, self.known
        consumers = consumers_of(fd.program)[v]
        shape = fd.program.shapes[v]
        ctx32 = self.at("float32")
        clean = ctx32.clean()
        ref64, ref32 = np.zeros(shape), np.zeros(shape)
        for s, k in consumers:
            xs = [fd.base[n] for n in s.inputs]
            if s.name not in known or near_kink(s, xs, fd.frozen, "float32") is not None:
                return False
            a = np.broadcast_to(np.asarray(known[s.name], dtype=np.float64), fd.program.shapes[s.name])
            ref64 = ref64 + rule_contribution(s, xs, fd.base[s.name], a, k, shape)
            ref32 = ref32 + rule_contribution(ctx32.program.by_name[s.name], [clean[n] for n in s.inputs],
                                              clean[s.name], a.astype(np.float32), k, shape)
        if not consistency(fd, consumers, v, {**known, v: ref64}, RULE_TOL)[0].passed:
            return False  # the rule itself disagrees with its forward: no reference to measure rounding by
        return _in_band(np.broadcast_to(known[v], shape), ref32, ref64)

    def whole(self, r) -> bool:
        """The claimed gradient within the rounding band of the engine's whole backward run in float32, against
        the exact symbolic gradient (or element-wise finite differences, their error bound added). The band
        measures rounding only where the engine's float64 backward agrees with the reference (float64's
        tolerance): an engine bug would otherwise widen it to cover the same bug in the claim -- and never
        under injected faults (the engine's runs are not its own then)."""
        if self.ctx.options.faults:
            return False
        if r.symbolic is not None:
            ref, slack = np.asarray(r.symbolic.gradient, dtype=np.float64), 0.0
        elif r.fd.mode is FDMode.FULL:
            ref, slack = np.asarray(r.fd.reference, dtype=np.float64), np.asarray(r.fd.error, dtype=np.float64)
        else:
            return False  # projections: no element-wise reference to hold the claim to
        if not compare(self.at("float64").engine.gradients[r.name], ref, RULE_TOL, slack).passed:
            return False
        return _in_band(r.gradient, self.at("float32").engine.gradients[r.name], ref, slack)


def _engine_at(ctx: Context, dtype: str) -> Context:
    """ctx at the engine run of `dtype` (float32: its forward's values are clean()'s) -- ctx itself when the
    engine ran at it, else a run made for it."""
    if np.dtype(ctx.engine.program.float_dtype) == np.dtype(dtype):
        return ctx
    return dataclasses.replace(ctx, engine=run_engine(ctx.graph, ctx.options, dtype, profile=False), _clean=None,
                               _traced=None, _params_of={})


def _in_band(claimed, rule32, ref64, slack=0.0) -> bool:
    """Within 4 |rule32 - rule64| plus ROUNDING_ULPS float32 ulps of the reference (local_sweep.py's band)."""
    with np.errstate(all="ignore"):
        band = 4 * np.abs(rule32 - ref64) + ROUNDING_ULPS * EPS32 * (
            np.abs(ref64) + float(np.max(np.abs(ref64), initial=0.0))) + slack
        return bool(np.all(np.abs(np.asarray(claimed, dtype=np.float64) - ref64) <= band))
