"""The local sweep's two checks for many (node, input) pairs at once.

local_sweep.check_locally checks one pair with one batched evaluation of its op: the rule (its vjp in
float64) against central differences of the op's forward alone, then the engine's contribution against
that rule. On a 2,000-node chain that is 4,000 small evaluations, each with its own comparisons, which
cost more than the whole verification. Here the pairs that share an op, its attributes, their input
shapes, the input checked and their constant inputs are evaluated together: one evaluation of the op per
group with check_locally's directions, steps and formulas (fd_local.local_vjp), the rule evaluated for the
whole group (one batched vjp for an elementwise op, else pair by pair), then both comparisons for the
whole group. A pair whose every value is within half of each bound (SCREEN_SHARE) is cleared: the full
check's first pass would pass it, and a first pass that passes is never refined. Every other pair (over
the share anywhere, non-finite, a piecewise op with a frozen piece, a parameter input with per-element
evidence, a group the op cannot evaluate batched) is checked one by one exactly as before, so what is
named, and why, is check_locally's: the screen only decides which pairs need it. A rule that is wrong
only when evaluated pair by pair is not hidden either: the batched rule is held to the differences, and
the engine's contribution (from the pair's own vjp) to that rule.
"""
from __future__ import annotations

import numpy as np

from ...engine.executor import run_step_batched
from ...engine.program import Step
from ...oracles.fd_formulas import EPS, central, projection_step
from ..compare import Tolerance
from .localize import DIRECTIONS, FULL_UP_TO, local_directions
from .rules import rule_contribution

SCREEN_SHARE = 0.5  # a pair is cleared when every value is within this share of its bound
CHUNK_VALUES = 1 << 21  # input and output values per batched evaluation (16 MiB in float64)


def screen(ctx, traced, pairs: list[tuple[Step, int]], tol: Tolerance, ulps: int) -> set:
    """{(step name, k)}: the pairs the batched checks clear (module docstring)."""
    groups: dict = {}
    for step, k in pairs:
        key = _group_key(ctx, step, k)
        if key is not None:
            groups.setdefault(key, []).append((step, k))
    cleared: set = set()
    for members in groups.values():
        try:
            for chunk in _chunks(ctx, members):
                cleared |= _screen_group(ctx, traced, chunk, tol, ulps)
        except Exception:  # noqa: BLE001 -- an op that cannot evaluate this batch: its pairs get the full check,
            # which is slower, never laxer
            continue
    return cleared


def _chunks(ctx, members: list) -> list[list]:
    """The group in chunks of at most CHUNK_VALUES values (inputs and output) across its copies."""
    step, k = members[0]
    n = int(np.prod(ctx.program.shapes[step.inputs[k]], dtype=np.int64))
    copies = 2 * min(n, DIRECTIONS if n > FULL_UP_TO else n) + 1
    values = [ctx.program.shapes[step.name]] + [ctx.program.shapes[v] for v in step.inputs]
    per = copies * max(1, sum(int(np.prod(v, dtype=np.int64)) for v in values))
    size = max(1, CHUNK_VALUES // per)
    return [members[i:i + size] for i in range(0, len(members), size)]


def _group_key(ctx, step: Step, k: int):
    """Pairs evaluated together, or None for a pair the screen leaves to the full check."""
    fd = ctx.fd
    step64 = fd.program.by_name[step.name]
    if step64.op.held or step64.op.select is not None:
        return None
    xs = [fd.base[n] for n in step.inputs]
    if np.size(xs[k]) > FULL_UP_TO and ctx.evidence(step.inputs[k]) is not None:
        return None  # its failing elements are checked one by one first (check_locally's directions)
    if not all(np.asarray(x).dtype.kind == "f" and np.isfinite(x).all() for x in xs):
        return None
    constants = tuple(n for n, want in zip(step.inputs, step.grad_inputs) if not want)
    return (step64.op.name, _frozen(step64.attrs), tuple(np.shape(x) for x in xs), k, constants)


def _frozen(value):
    """Attributes as a key: arrays by their bytes (repr elides a large array's middle)."""
    if isinstance(value, dict):
        return tuple(sorted((str(key), _frozen(v)) for key, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return repr(value)


def _screen_group(ctx, traced, members: list[tuple[Step, int]], tol: Tolerance, ulps: int) -> set:
    fd = ctx.fd
    step, k = members[0]
    step64 = fd.program.by_name[step.name]
    batched = [bool(w) for w in step.grad_inputs]
    if not batched[k]:
        return set()
    shape = np.shape(fd.base[step.inputs[k]])
    n = int(np.prod(shape, dtype=np.int64))
    d = np.eye(n) if local_directions(n) is None else local_directions(n)
    m = d.shape[0]
    copies = 2 * m + 1  # x + h d, x - h d, x (the step's own output, as fd_local evaluates it)
    args = []
    for j, name in enumerate(step.inputs):
        vals = np.stack([np.asarray(fd.base[s.inputs[j]], dtype=np.float64) for s, _ in members])
        if j == k:
            flat = vals.reshape(len(members), -1)
            h = np.array([projection_step(f) for f in flat])
            moved = np.concatenate([flat[:, None] + h[:, None, None] * d, flat[:, None] - h[:, None, None] * d,
                                    flat[:, None]], axis=1)
            args.append(moved.reshape((-1,) + shape))
        elif batched[j]:
            args.append(np.repeat(vals, copies, axis=0))
        else:
            args.append(fd.base[name])
    with np.errstate(all="ignore"):
        out = np.asarray(run_step_batched(np, step64, args, batched), dtype=np.float64)
    out_shape = ctx.program.shapes[step.name]
    out = out.reshape((len(members), copies) + tuple(out_shape))
    return _cleared(ctx, traced, members, out, d, h, shape, tol, ulps)


def _cleared(ctx, traced, members, out, d, h, shape, tol: Tolerance, ulps: int) -> set:
    """The group's first pass against each pair's rule (check_locally's step 1), then the engine's
    contributions against that rule (its step 2), both within SCREEN_SHARE of their bounds."""
    fd, m = ctx.fd, d.shape[0]
    step, k = members[0]
    out_shape = tuple(ctx.program.shapes[step.name])
    adj = np.stack([np.broadcast_to(np.asarray(traced.adjoints.get(s.name, np.zeros(out_shape)), dtype=np.float64),
                                    out_shape) for s, _ in members])
    y, moved = out[:, -1:], out[:, :-1]
    weights = adj[:, None]
    axes = tuple(range(2, moved.ndim))
    with np.errstate(all="ignore"):
        change = ((moved - y) * weights).sum(axis=axes)
        size = (np.abs(weights) * (np.abs(moved) + np.abs(y)) * (moved != y)).sum(axis=axes)
        ref = central(change[:, :m], change[:, m:], h[:, None])
        noise = 8 * EPS * (size[:, :m] + 1.0) / h[:, None]
        base = [[fd.base[v] for v in s.inputs] for s, _ in members]
        rule64 = _rules(fd.program.by_name[step.name], base, [fd.base[s.name] for s, _ in members], adj, k, shape)
        projected = rule64.reshape(len(members), -1) @ d.T
        absolute = np.array([tol.absolute(float(np.max(np.abs(r), initial=0.0))) for r in ref])
        bound = absolute[:, None] + tol.rtol * np.abs(ref) + noise
        rule_ok = np.all(np.isfinite(projected) & np.isfinite(bound) &
                         (np.abs(projected - ref) <= SCREEN_SHARE * bound), axis=1)
    run_ok = _run_cleared(ctx, traced, members, adj, rule64, shape, ulps)
    return {(s.name, kk) for (s, kk), ok in zip(members, rule_ok & run_ok) if ok}


def _run_cleared(ctx, traced, members, adj, rule64, shape, ulps: int) -> np.ndarray:
    """check_locally's step 2 for the group: the engine's contributions against the rule at the engine's
    own forward values, within SCREEN_SHARE of the rounding band."""
    step, k = members[0]
    clean, dtype = ctx.clean(), np.dtype(ctx.dtype)
    rule_d = _rules(ctx.program.by_name[step.name], [[clean[v] for v in s.inputs] for s, _ in members],
                    [clean[s.name] for s, _ in members], adj.astype(dtype), k, shape)
    engine = np.stack([np.broadcast_to(np.asarray(traced.contributions.get((s.name, k), np.zeros(shape)),
                                                  dtype=np.float64), shape) for s, _ in members])
    eps = float(np.finfo(dtype).eps)
    flat = (len(members), -1)
    with np.errstate(all="ignore"):
        err = np.abs(engine - rule64).reshape(flat)
        top = np.max(np.abs(rule64).reshape(flat), axis=1, initial=0.0)[:, None]
        band = 4 * np.abs(rule_d - rule64).reshape(flat) + ulps * eps * (np.abs(rule64).reshape(flat) + top)
        return np.all(np.isfinite(err) & (err <= SCREEN_SHARE * band), axis=1)


def _rules(step: Step, xs: list[list], ys: list, adj: np.ndarray, k: int, shape: tuple) -> np.ndarray:
    """rule_contribution for every pair, (G, *shape) float64: one batched vjp for an elementwise
    (broadcasting) op -- each pair's inputs aligned as run_step_batched aligns them --, else one by one."""
    if step.op.broadcast:
        rank = max(step.in_ranks)
        stacked = [np.stack([np.asarray(x[j]) for x in xs]) for j in range(len(step.inputs))]
        stacked = [v.reshape(v.shape[:1] + (1,) * (rank - r) + v.shape[1:]) for v, r in zip(stacked, step.in_ranks)]
        target = (len(xs),) + (1,) * (rank - step.in_ranks[k]) + tuple(shape)
        y = np.stack([np.asarray(v) for v in ys])
        g = np.broadcast_to(adj.astype(y.dtype), y.shape)
        out = rule_contribution(step, stacked, y, g, k, target)
        return out.reshape((len(xs),) + tuple(shape))
    return np.stack([rule_contribution(step, x, yy, a, k, shape) for x, yy, a in zip(xs, ys, adj)])
