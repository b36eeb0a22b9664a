"""Notes at exact kinks: an input exactly on a kink its op declares (relu/abs at 0, a maximum tie, a
clip bound) gets an `info` finding even when every reference agrees -- at a tie the engine's 0.5
matches central differences and SymPy alike, yet the value is a convention, not a derivative, and a
user whose parameters sit there wants to know. The note says which convention the engine used and
the one-sided derivatives of the op on each side (finite_diff.local_one_sided, float64). It excuses
no mismatch (diagnose.EXPLAINING): a kink that breaks a comparison is the warning or error that
classify.py gives, and a node with such a finding gets no note besides.

An input *near* a kink -- within the first pass's finite-difference step of it, so that central
differences straddle it -- gets the same note, whichever rung of the step ladder (or the symbolic
oracle) then settled the value: abs at 1e-9 (settled by a step below 1e-9) and relu at 1e-6 are
noted as relu at 1e-9 is (where the differences disagreed, classify.py's warning is that note).

One exact kink does excuse a mismatch: where the symbolic reference is NaN only at the kink's elements
(SymPy's formula is undefined there: 0**y for 0 < y < 1 differentiated in y is 0 * log(0)) while finite
differences agree with the engine and the rest of the symbolic gradient does too. The reference that
cannot say is then no evidence against the engine: the note is a warning (diagnose.EXPLAINING), the row
"ok (kink)", and the verdict agrees with the note's "not a failure".
"""
from __future__ import annotations

import numpy as np

from ...oracles.finite_diff import STEP_SCALE, element_steps, local_one_sided
from ..compare import compare
from ..findings import Finding
from .context import Context, inputs_at
from .rules import rule_contribution


def exact_kink_notes(ctx: Context, findings: list[Finding]) -> list[Finding]:
    named = {f.node for f in findings if f.cause == "nondifferentiable_point"}
    if ctx.kink_notes is not None and not named and all(r.passed for r in ctx.results):
        # a split's: made by a shard with no rows and no finding (nothing else reads either then)
        return list(ctx.kink_notes)
    fd = ctx.fd
    out = []
    for step in fd.program.steps:
        if not step.op.kinks or not step.needs_grad or step.name in named:
            continue
        xs = [fd.base[n] for n in step.inputs]
        for kink in step.op.kinks:
            if kink.distance is None:
                continue
            with np.errstate(all="ignore"):
                d = np.asarray(kink.distance(xs, step.attrs), dtype=np.float64)
            exact = np.flatnonzero(d.reshape(-1) == 0)
            # near it: within the first pass's step (scaled as the steps are)
            scale = max(1.0, max((float(np.max(np.abs(x))) for x in xs if np.size(x)), default=1.0))
            with np.errstate(invalid="ignore"):
                near = np.flatnonzero(d.reshape(-1) <= STEP_SCALE * scale)
            if not exact.size:
                if not near.size:
                    continue
                exact = near[np.argsort(d.reshape(-1)[near], kind="stable")]
            note = _note(ctx, step, kink, d, exact, near.size)
            if note is not None:
                out.append(note)
                break  # one note per node
    return out


def _note(ctx: Context, step, kink, d: np.ndarray, exact: np.ndarray, near: int) -> Finding | None:
    fd = ctx.fd
    at = tuple(int(i) for i in np.unravel_index(int(exact[0]), d.shape)) if d.shape else ()
    out_shape = fd.program.shapes[step.name]
    xs = [fd.base[n] for n in step.inputs]
    # the cotangent picks the output element at the kink (all of them if the shapes do not line up)
    a = np.zeros(out_shape)
    if tuple(d.shape) == tuple(out_shape):
        a[at] = 1.0
    else:
        a[...] = 1.0
    sides, params, seen = [], [], set()
    for k, (name, want) in enumerate(zip(step.inputs, step.grad_inputs)):
        if not want or name in seen:
            continue
        seen.add(name)
        shape = fd.program.shapes[name]
        j, rule = _rule_at(step, xs, fd.base[step.name], a, k, shape, d.shape, at)
        x = np.asarray(xs[k], dtype=np.float64)  # (its element j without x.reshape(-1): a strided x is copied)
        h = element_steps(x[np.unravel_index([j], x.shape)] if x.ndim else x.reshape(1))
        # one element (never a dense direction), the base's output of the step (never evaluated again)
        left, right = local_one_sided(step, xs, k, a, np.array([j]), h, fd.base[step.name])
        label = f"{name}{[int(i) for i in np.unravel_index(j, shape)] if len(shape) else ''}"
        sides.append(f"d/d{label}: engine {rule:.6g}, one-sided {float(left[0]):.6g} (left) and "
                     f"{float(right[0]):.6g} (right)")
        params += [p for p in ctx.params_through(name) if p not in params]
    if not params:
        return None
    more = f" and {exact.size - 1} more element{'s' if exact.size > 2 else ''}" if exact.size > 1 else ""
    gap = float(d[at]) if d.shape else float(d)
    frozen = step.name in fd.frozen
    # kink proximity: how many elements the first pass's step reaches across, and what the differences did
    within = f"{near} element{'s' if near != 1 else ''} within a finite-difference step of it"
    crossing = f"{within}, where finite differences held the piece the forward took (frozen branches)" \
        if frozen else "central differences straddle it"
    if gap != 0:
        return Finding(step.name, step.op.name, "nondifferentiable_point", "info",
                       f"an input is near its kink {kink.where}, {gap:.3g} from it -- within a finite-difference "
                       f"step ({inputs_at(step, fd.base, at)}{more}; convention at the kink: {kink.convention}): "
                       f"{crossing}; {ctx.whose} gradient agrees with the reference that "
                       f"settled it ({'; '.join(sides)}); not a failure", params, None)
    unsure = _symbolic_excused_at_kink(ctx, step, d, exact, params)
    nan = any(np.isnan(np.asarray(r.symbolic.gradient, dtype=np.float64)).any() for r in ctx.results
              if r.name in unsure and r.symbolic is not None)
    symbolic = f"; the symbolic reference is {'NaN' if nan else 'of another convention'} there for " \
        f"{', '.join(unsure)} ({'undefined' if nan else 'the value of its formula'} at the kink) and finite " \
        f"differences agree with {ctx.subject.noun}" if unsure else ""
    taken = f"; finite differences took the engine's piece there (frozen branches; {within})" if frozen else ""
    return Finding(step.name, step.op.name, "nondifferentiable_point", "warning" if unsure else "info",
                   f"an input is exactly at its kink {kink.where} ({inputs_at(step, fd.base, at)}{more}): the "
                   f"gradient there is a convention, not a derivative; the engine uses '{kink.convention}' "
                   f"({'; '.join(sides)}){taken}{symbolic}; not a failure", params, None)


def _symbolic_excused_at_kink(ctx: Context, step, d: np.ndarray, exact: np.ndarray, params: list) -> list[str]:
    """The parameters whose only disagreement is the symbolic reference at this kink, finite differences
    agreeing with the engine: all of the failing ones among `params`, or [] (then nothing is excused).
    Either NaN at the kink's elements (a parameter counts only as a direct input of the kink's node, whose
    elements map to the kink's by broadcasting), or, where finite differences took the engine's frozen
    piece, SymPy's own value at a tie (another subgradient: between the one-sided differences of the loss
    at each disagreeing element, which must differ there)."""
    rows = {r.name: r for r in ctx.results if r.name in params and not r.passed}
    if not rows or d.reshape(-1)[exact].any():
        return []
    for name, r in rows.items():
        if r.symbolic is None or not r.fd.passed:
            return []
        sym = np.asarray(r.symbolic.gradient, dtype=np.float64)
        nan = np.isnan(sym)
        if nan.any():
            if name not in step.inputs:
                return []
            size = int(np.prod(r.shape, dtype=np.int64))
            try:
                at_kink = np.broadcast_to(np.arange(size).reshape(r.shape), d.shape).reshape(-1)[exact]
            except ValueError:
                return []
            if not set(np.flatnonzero(nan)) <= set(at_kink.tolist()):
                return []
        elif step.name in ctx.fd.frozen:
            # finite differences took the engine's piece at the kink (frozen branches), and agree with it:
            # SymPy's own value there (Heaviside(0) = 1/2 at clip's bound, a tie's share) is another
            # subgradient where it lies between the one-sided differences of a real kink
            nan = _disagree(r.gradient, sym, ctx.tol)
            if not nan.any() or not _other_subgradient(ctx, r, np.flatnonzero(nan), sym.reshape(-1)):
                return []
        else:
            return []
        rest = np.where(nan, r.gradient, sym)  # those elements judged by FD alone
        if not compare(r.gradient, rest, ctx.tol).passed:
            return []
    return sorted(rows)


ONE_SIDED_MAX = 1024  # disagreeing elements checked one-sidedly per parameter (a 4-way tie per window of a
# 12x12 two-channel max-pool disagrees at 288; more are left unexcused: the mismatch stands)
ONE_SIDED_CHUNK = 64  # directions per call: each a dense row of the parameter's size


def one_sided_elements(fd, name: str, bad: np.ndarray):
    """(left, right): the loss's one-sided differences along each element `bad` (flat) of parameter name,
    in chunks of ONE_SIDED_CHUNK directions."""
    x = np.asarray(fd.base[name], dtype=np.float64).reshape(-1)
    left, right = np.empty(bad.size), np.empty(bad.size)
    for s in range(0, bad.size, ONE_SIDED_CHUNK):
        part = bad[s:s + ONE_SIDED_CHUNK]
        dirs = np.zeros((part.size, x.size))
        dirs[np.arange(part.size), part] = 1.0
        left[s:s + part.size], right[s:s + part.size] = fd.one_sided(name, dirs, element_steps(x[part]))
    return left, right


def _other_subgradient(ctx: Context, r, bad: np.ndarray, sym: np.ndarray) -> bool:
    """Each element `bad` of parameter r is at a kink (its one-sided differences differ) and the symbolic
    value lies between them."""
    if bad.size > ONE_SIDED_MAX:
        return False
    left, right = one_sided_elements(ctx.fd, r.name, bad)
    lo, hi = np.minimum(left, right), np.maximum(left, right)
    slack = ctx.tol.absolute(float(np.max(np.abs(hi), initial=0.0))) + ctx.tol.rtol * np.abs(hi)
    with np.errstate(invalid="ignore"):
        return bool(np.all((hi - lo > 2 * slack) & (sym[bad] >= lo - slack) & (sym[bad] <= hi + slack)))


def _disagree(g: np.ndarray, ref: np.ndarray, tol) -> np.ndarray:
    """Elements of g outside the tolerance of ref (NaN ones included)."""
    bound = tol.absolute(float(np.max(np.abs(np.nan_to_num(ref)), initial=0.0))) + tol.rtol * np.abs(ref)
    with np.errstate(invalid="ignore"):
        return ~(np.abs(np.asarray(g, dtype=np.float64) - ref) <= bound)


def _rule_at(step, xs: list, y, a: np.ndarray, k: int, shape: tuple, d_shape: tuple, at: tuple):
    """(j, the rule's contribution to flat element j of input k): the element that feeds the output element
    `at`. For a one-input op that maps slices each on its own (pooling: OpDef.slice_rule's out_axis) and a
    one-hot cotangent, the rule evaluated on the slice holding `at` alone -- the same values, the other
    slices' contributions being zero -- not on the whole input (a max-pool's window temporaries: as large
    as the training peak)."""
    out_axis = getattr(step.op.slice_rule, "out_axis", None)
    rank = len(shape)
    if out_axis is not None and len(xs) == 1 and tuple(d_shape) == np.shape(a) and rank \
            and _broadcast_index(shape, d_shape, at) is None:
        for axis in range(-1, -rank - 1, -1):
            o = out_axis(axis, step.attrs)
            if o is None:
                continue
            i = at[o]
            part = rule_contribution(step, [np.take(xs[0], [i], axis=axis)], np.take(y, [i], axis=o),
                                     np.take(a, [i], axis=o), k, shape[:rank + axis] + (1,) + shape[rank + axis + 1:])
            if not part.any():
                break
            coords = list(np.unravel_index(int(np.argmax(np.abs(part.reshape(-1)))), part.shape))
            coords[rank + axis] = i
            j = int(np.ravel_multi_index(coords, shape))
            return j, part[tuple(coords[:rank + axis]) + (0,) + tuple(coords[rank + axis + 1:])]
    rule = rule_contribution(step, xs, y, a, k, shape).reshape(-1)
    j = _input_element(shape, d_shape, at, rule)
    return j, rule[j]


def _input_element(shape: tuple, out_shape: tuple, at: tuple, rule: np.ndarray) -> int:
    """The element of an input that feeds the output element `at`: through broadcasting for an
    elementwise op; for a reduction, the element the rule credits most (a tied extremum)."""
    j = _broadcast_index(shape, out_shape, at)
    return int(np.argmax(np.abs(rule))) if j is None else j


def _broadcast_index(shape: tuple, out_shape: tuple, at: tuple) -> int | None:
    """The flat element of an input of `shape` that broadcasting maps to output element `at`, or None
    where the shape does not broadcast to out_shape. (No index array of the input's size: a 524k-element
    relu's was 4 MiB.)"""
    shape, out_shape = tuple(shape), tuple(out_shape)
    try:
        fits = len(shape) <= len(out_shape) and np.broadcast_shapes(shape, out_shape) == out_shape
    except ValueError:
        fits = False
    if not fits:
        return None
    coords = tuple(0 if n == 1 else i for n, i in zip(shape, at[len(at) - len(shape):]))
    return int(np.ravel_multi_index(coords, shape)) if shape else 0
