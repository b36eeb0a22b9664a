"""Diagnosis: turn the engine's records and the oracles' disagreements into findings.

Three sources, in order:
1. the saved-tensor store's events (engine/saved.py): a fingerprint that
   changed with no in-place write is cache_corruption; a version that
   changed is inplace_overwrite (error if the value the backward read
   differs from the forward's, info if it is the same -- a safe in-place op);
2. non-finite values: the first node whose forward output or vjp
   contribution is NaN/Inf while its own inputs are finite;
3. for each parameter that still fails, localization (localize.py) finds
   the faulty node, then its cause is classified: at a declared kink ->
   nondifferentiable_point (a warning when the engine's gradient lies between
   the one-sided differences); the node's vjp wrong in isolation at the
   forward's values -> rule_error; right in float64 but the float32 engine
   is off by no more than a float32 evaluation of the same rule -> precision
   (a note); right in isolation yet wrong in the run beyond rounding -> the
   backward read different values than the forward made (cache_corruption,
   inferred).

The "expected" value of a saved tensor comes from a clean, out-of-place
forward in the engine's dtype: only when something was found.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine import forward, prepare_feeds
from ..engine.program import Program, Step
from ..graph.ir import Graph
from ..oracles.finite_diff import EPS, STEP_SCALE, FiniteDifferences
from .compare import Tolerance, compare
from .findings import Finding, WorstElement, parameters_through
from .localize import LocalCheck, Located, localize, rule_contribution

EPS32 = float(np.finfo(np.float32).eps)
KINK_BAND = 100 * STEP_SCALE  # relative distance to a kink within which FD straddles it
EXPLAINING = ("nondifferentiable_point", "precision")  # causes that can excuse a parameter's mismatch
MAX_ROUNDS = 3  # localizations per verification (one per independent fault)
ONE_SIDED_MAX = 64  # failing elements checked one-sidedly per parameter


@dataclass
class Context:
    graph: Graph
    options: object  # VerifyOptions
    dtype: str
    engine: object  # EngineRun
    results: list  # ParameterResult
    fd: FiniteDifferences
    tol: Tolerance
    _clean: dict | None = None
    _traced: object = None
    _params_of: dict = field(default_factory=dict)

    @property
    def program(self) -> Program:
        return self.engine.program

    def clean(self) -> dict:
        """Every value from an out-of-place forward in the engine's dtype, host arrays."""
        if self._clean is None:
            from ..backend import get_backend

            backend = get_backend(self.options.device)
            tape = forward(self.program, backend, prepare_feeds(self.program, backend), grad=False,
                           keep_values=True)
            self._clean = {k: np.asarray(backend.to_host(v)) for k, v in tape.values.items()}
        return self._clean

    def traced(self):
        """The engine run again (same faults and options) keeping every adjoint and vjp contribution."""
        if self._traced is None:
            from .run import run_engine

            self._traced = run_engine(self.graph, self.options, self.dtype, keep_adjoints=True, profile=False)
        return self._traced

    def params_through(self, node: str) -> list[str]:
        """Parameters whose gradient flows through `node` (cached per node)."""
        if node not in self._params_of:
            self._params_of[node] = parameters_through(self.program, node)
        return self._params_of[node]

    def op_of(self, name: str) -> str:
        step = self.program.by_name.get(name)
        return step.op.name if step is not None else "input"


def diagnose(ctx: Context) -> list[Finding]:
    findings = integrity_findings(ctx)
    named = {f.node for f in findings if f.severity == "error"}
    # NaN/Inf that a corrupted or overwritten saved tensor explains is not a second finding
    nonfinite = [f for f in nonfinite_findings(ctx) if f.node not in named]
    findings += nonfinite
    if ctx.options.localize and not nonfinite:
        findings += localization_findings(ctx, findings)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])


def overall_verdict(results, findings) -> str:
    """fail on any error finding, or on a mismatch no warning/note explains."""
    if any(f.severity == "error" for f in findings):
        return "fail"
    explained = {p for f in findings if f.cause in EXPLAINING for p in f.parameters}
    return "pass" if all(r.passed or r.name in explained for r in results) else "fail"


# --- 1. saved-tensor integrity and in-place writes -------------------------------------


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
    from ..backend import get_backend

    to_host = get_backend(ctx.options.device).to_host
    failed = {r.name for r in ctx.results if not r.passed}
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


# --- 2. NaN / Inf ----------------------------------------------------------------------


def _first_nonfinite(a: np.ndarray):
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    flat = int(np.argmax(bad.reshape(-1)))
    return tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.shape else (), float(a.reshape(-1)[flat])


def _inputs_at(step: Step, values: dict, idx: tuple) -> str:
    """'x[1] = 0, y = 2': each input's value at an output index (inputs broadcast to the output)."""
    shape = np.shape(values[step.name])
    parts = []
    for n in dict.fromkeys(step.inputs):
        v = np.asarray(values[n])
        try:
            e = np.broadcast_to(v, shape)[idx] if v.ndim <= len(shape) else None
        except ValueError:
            e = None
        if e is None or v.dtype.kind not in "fiub":
            parts.append(f"'{n}'")
        else:
            parts.append(f"{n}{list(idx) if v.size > 1 else ''} = {float(e):g}")
    return ", ".join(parts)


def _finite(a) -> bool:
    a = np.asarray(a)
    return a.dtype.kind != "f" or bool(np.isfinite(a).all())


def nonfinite_findings(ctx: Context) -> list[Finding]:
    eng = ctx.engine
    bad_params = [p for p, g in eng.gradients.items() if not _finite(g)]
    if np.isfinite(eng.loss) and not bad_params:
        return []
    params = list(ctx.program.params) if not np.isfinite(eng.loss) else bad_params
    out: dict[str, Finding] = {}
    clean = ctx.clean()
    for step in ctx.program.steps:  # forward: the first node making NaN/Inf from finite inputs
        y = clean[step.name]
        if _finite(y) or not all(_finite(clean[n]) for n in step.inputs):
            continue
        idx, val = _first_nonfinite(np.asarray(y, dtype=np.float64))
        ref = float(np.asarray(ctx.fd.base[step.name], dtype=np.float64).reshape(-1)[
            np.ravel_multi_index(idx, np.shape(y)) if idx else 0])
        out[step.name] = Finding(step.name, step.op.name, "nonfinite", "error",
                                 f"forward produced {val:g} at {list(idx)} from finite inputs "
                                 f"({_inputs_at(step, clean, idx)})",
                                 params, WorstElement(idx, val, ref))
        break
    traced = ctx.traced()
    for step in reversed(ctx.program.steps):  # backward: the first vjp making NaN/Inf from a finite adjoint
        a = traced.adjoints.get(step.name)
        if a is None or not _finite(a):
            continue
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
            break
        else:
            continue
        break
    return list(out.values())


# --- 3. localization and cause ---------------------------------------------------------


def localization_findings(ctx: Context, known: list[Finding]) -> list[Finding]:
    covered = {p for f in known if f.severity == "error" for p in f.parameters}
    failing = [r.name for r in ctx.results if not r.passed and r.name not in covered]
    # Parameters whose engine gradient matches the exact symbolic one while finite differences
    # disagree: the engine is right, so only explanations (a kink, rounding) are worth reporting.
    fd_only = [r.name for r in ctx.results if r.passed and not getattr(r, "fd_passed", True)
               and r.name not in covered]
    failing += fd_only
    out = []
    for _ in range(MAX_ROUNDS):
        if not failing:
            break
        traced = ctx.traced()
        loc = localize(traced.program, ctx.fd, traced.adjoints, traced.contributions, ctx.tol, failing)
        if loc is None:
            break
        node = loc.culprit.step.name if loc.culprit is not None else loc.value
        affected = [p for p in failing if p in ctx.params_through(node) or p == node] or list(failing)
        if not any(f.node == node for f in known):  # already named by the store's checks
            finding = classify(ctx, loc, affected)
            if finding.severity == "error" and all(p in fd_only for p in affected):
                failing = [p for p in failing if p not in affected]
                continue
            same = next((f for f in out if (f.node, f.cause, f.severity) ==
                         (finding.node, finding.cause, finding.severity)), None)
            if same is not None:  # one node, one cause: one finding for all the parameters it affects
                same.parameters += [p for p in finding.parameters if p not in same.parameters]
            else:
                out.append(finding)
        failing = [p for p in failing if p not in affected]
    return out


def _worst_of(check: LocalCheck, values: np.ndarray, reference: np.ndarray | None = None) -> WorstElement:
    """Worst element of a local check: an index of the input (full) or a direction (projection)."""
    if check.directions is None:
        ref = check.reference if reference is None else reference
        cmp = compare(values.reshape(-1), ref, Tolerance.for_dtype("float64"))
        idx = np.unravel_index(cmp.worst_index[0], check.engine.shape) if check.engine.shape else ()
        return WorstElement(tuple(int(i) for i in idx), cmp.engine_at_worst, cmp.reference_at_worst)
    proj = check.directions @ values.reshape(-1)
    j = int(np.argmax(np.abs(proj - check.reference)))
    return WorstElement(("direction", j), float(proj[j]), float(check.reference[j]))


def _projected(check: LocalCheck, values: np.ndarray) -> np.ndarray:
    return values.reshape(-1) if check.directions is None else check.directions @ values.reshape(-1)


def classify(ctx: Context, loc: Located, params: list[str]) -> Finding:
    if loc.culprit is None:
        # every local derivative agrees (a tie split evenly matches a central difference), yet the
        # total does not: first suspect a kink under the parameter-level differences
        for c in loc.consumers:
            near = _near_kink(c.step, [ctx.fd.base[n] for n in c.step.inputs])
            if near is not None:
                return _nondifferentiable(ctx, c.step, near, params)
        return _accumulation(ctx, loc, params)
    c = loc.culprit
    step, k = c.step, c.k
    name = step.inputs[k]
    where = f"input {k} ('{name}')"
    xs64 = [ctx.fd.base[n] for n in step.inputs]
    near = _near_kink(step, xs64)
    if near is not None:
        return _nondifferentiable(ctx, step, near, params)
    shape = ctx.program.shapes[name]
    rule64 = rule_contribution(step, xs64, ctx.fd.base[step.name], c.adjoint, k, shape)
    noise = 8 * EPS * (np.abs(c.reference) + 1.0) / STEP_SCALE
    rule_cmp = compare(_projected(c, rule64), c.reference, Tolerance.for_dtype("float64"), noise)
    if not rule_cmp.passed:
        w = _worst_of(c, rule64)
        return Finding(step.name, step.op.name, "rule_error", "error",
                       f"its vjp disagrees with the derivative of its own forward at the forward's values, for "
                       f"{where}: {w.engine:.8g} vs {w.reference:.8g}", params, w)
    if ctx.dtype == "float32":
        note = _precision(ctx, c, rule64, params)
        if note is not None:
            return note
    w = _worst_of(c, c.engine, _projected(c, rule64) if c.directions is None else None)
    return Finding(step.name, step.op.name, "cache_corruption", "error",
                   f"its vjp is right at the forward's values, yet the backward's gradient for {where} differs "
                   f"({w.engine:.8g} vs {w.reference:.8g}): it read values other than the forward's "
                   f"(integrity checking {ctx.options.integrity})", params, w)


def _near_kink(step: Step, xs: list):
    """The kink an input of this step sits at (or within a finite-difference step of), or None."""
    for kink in step.op.kinks:
        if kink.distance is None:
            continue
        d = np.asarray(kink.distance(xs, step.attrs), dtype=np.float64)
        scale = max(1.0, max((float(np.max(np.abs(x))) for x in xs if np.size(x)), default=1.0))
        if d.size and float(np.min(d)) <= KINK_BAND * scale:
            at = np.unravel_index(int(np.argmin(d)), d.shape) if d.shape else ()
            return kink, tuple(int(i) for i in at)
    return None


def _nondifferentiable(ctx: Context, step: Step, near, params: list[str]) -> Finding:
    """Engine (sub)gradient vs the one-sided differences on each side, per failing parameter."""
    kink, at = near
    outside = []
    worst = None
    for r in ctx.results:
        if r.name not in params or r.passed:
            continue
        lo, hi, eng, labels = _one_sided(ctx, r)
        slack = ctx.tol.atol * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi))) + \
            ctx.tol.rtol * np.maximum(np.abs(lo), np.abs(hi)) + 1e-6 * np.maximum(1.0, np.abs(hi - lo))
        bad = (eng < lo - slack) | (eng > hi + slack)
        if bad.any():
            outside.append(r.name)
        if worst is None and eng.size:
            j = int(np.argmax(bad)) if bad.any() else 0
            worst = WorstElement(labels[j], float(eng[j]), float(0.5 * (lo[j] + hi[j])))
    x = _inputs_at(step, ctx.fd.base, at)
    head = f"an input is at its kink {kink.where} ({x}; convention: {kink.convention})"
    if outside:
        return Finding(step.name, step.op.name, "nondifferentiable_point", "error",
                       f"{head}, and the engine's gradient of {', '.join(outside)} lies outside the one-sided "
                       "differences", params, worst)
    return Finding(step.name, step.op.name, "nondifferentiable_point", "warning",
                   f"{head}; central differences straddle it, and the engine's (sub)gradient lies between the "
                   "one-sided differences: not a failure", params, worst)


def _one_sided(ctx: Context, r):
    """(low, high, engine, labels) for the failing elements (full) or directions (projection) of
    parameter r: the one-sided differences on each side, and the engine's value."""
    fd = ctx.fd
    x = np.asarray(fd.base[r.name], dtype=np.float64).reshape(-1)
    if r.mode == "projection":
        dirs = np.random.default_rng(fd.options.seed).standard_normal((len(r.reference), x.size))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        eng = np.asarray(r.engine_projection)
        h = STEP_SCALE * max(1.0, float(np.max(np.abs(x))))
        hs = np.full(len(dirs), h)
        labels = [("direction", j) for j in range(len(dirs))]
    else:
        g, ref = r.gradient.reshape(-1), np.asarray(r.reference).reshape(-1)
        bound = ctx.tol.atol * max(1.0, float(np.max(np.abs(ref)))) + ctx.tol.rtol * np.abs(ref)
        failing = np.flatnonzero(~(np.abs(g - ref) <= bound))[:ONE_SIDED_MAX]
        dirs = np.zeros((failing.size, x.size))
        dirs[np.arange(failing.size), failing] = 1.0
        eng = g[failing]
        hs = (x[failing] + STEP_SCALE * np.maximum(1.0, np.abs(x[failing]))) - x[failing]
        labels = [tuple(int(i) for i in np.unravel_index(f, r.shape)) for f in failing]
    m = len(dirs)
    # second-order one-sided differences (O(h^2) on each smooth piece): a first-order one would be
    # off by O(h f'') and put a right (sub)gradient just outside the bracket
    steps = (1, 2, -1, -2)
    stack = np.concatenate([x + k * hs[:, None] * dirs for k in steps]).reshape((4 * m,) + r.shape)
    losses = fd._losses(r.name, stack).reshape(4, m)
    with np.errstate(all="ignore"):
        right = (-3 * fd.loss + 4 * losses[0] - losses[1]) / (2 * hs)
        left = (3 * fd.loss - 4 * losses[2] + losses[3]) / (2 * hs)
    return np.minimum(left, right), np.maximum(left, right), eng, labels


def _precision(ctx: Context, c: LocalCheck, rule64: np.ndarray, params: list[str]) -> Finding | None:
    """float32 engine, right rule: a note if the error is no bigger than a float32 evaluation of the
    same rule at the same values makes; None if it is bigger (then rounding does not explain it)."""
    step, k = c.step, c.k
    clean = ctx.clean()
    xs32 = [clean[n] for n in step.inputs]
    rule32 = rule_contribution(ctx.program.by_name[step.name], xs32, clean[step.name],
                               c.adjoint.astype(np.float32), k, ctx.program.shapes[step.inputs[k]])
    band = 4 * np.abs(_projected(c, rule32) - _projected(c, rule64)) + \
        4 * EPS32 * (np.abs(_projected(c, np.abs(rule64))) + 1e-30)
    err = np.abs(_projected(c, c.engine) - _projected(c, rule64))
    if not np.all(err <= band):
        return None
    w = _worst_of(c, c.engine, _projected(c, rule64) if c.directions is None else None)
    return Finding(step.name, step.op.name, "precision", "info",
                   f"float32 rounding: its vjp for input {k} ('{step.inputs[k]}') is off by no more than a "
                   f"float32 evaluation of the same rule at the same values ({w.engine:.8g} vs {w.reference:.8g}; "
                   f"band {float(np.max(band)):.3g}); pass", params, w)


def _accumulation(ctx: Context, loc: Located, params: list[str]) -> Finding:
    """Every consumer's contribution is right, their sum is not: cancellation when adding them up."""
    v = loc.value
    parts = loc.consumers
    dirs = parts[0].directions if parts else None
    total = sum(c.engine for c in parts) if parts else np.zeros(ctx.program.shapes[v])
    ref = sum(c.reference for c in parts) if parts else np.zeros(0)
    proj = (lambda a: a.reshape(-1)) if dirs is None else (lambda a: np.abs(dirs) @ a.reshape(-1))
    err = np.abs((total.reshape(-1) if dirs is None else dirs @ total.reshape(-1)) - ref)
    magnitude = proj(sum(np.abs(c.engine) for c in parts)) if parts else np.zeros(0)
    eps = EPS32 if ctx.dtype == "float32" else EPS
    band = 16 * eps * magnitude + ctx.tol.atol
    who = ", ".join(f"'{c.step.name}'" for c in parts)
    ok = bool(np.all(err <= band))
    return Finding(v, ctx.op_of(v), "precision", "info" if ok else "error",
                   f"each contribution to its gradient (from {who}) is right, but their sum cancels "
                   f"({loc.worst.engine:.8g} vs {loc.worst.reference:.8g}): {ctx.dtype} rounding of terms as "
                   f"large as {float(np.max(magnitude, initial=0)):.3g}"
                   + ("; within the rounding band, pass" if ok else ", beyond the rounding band"),
                   params, loc.worst)
