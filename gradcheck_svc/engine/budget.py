"""`--checkpoint budget:BYTES`: the segments that keep the activation peak under a budget with the
least recomputation -- exact dynamic programming on chains.

The engine's checkpointing (checkpoint.py) recomputes every non-final segment once, in backward, so
the recomputation is the number of steps before the final segment: the plan with the least of it is
the one with the longest final segment whose run stays under the budget. What a plan holds for
backward (the saved tally, kept values included) is known exactly from a metering forward of the
plain run (the bytes each step saves, as buffers: a value saved by two steps counted once):

- at the end of the forward: the kept values (the input of every recomputed segment but the first)
  and everything the final segment saves;
- while segment j is recomputed: the kept inputs of segments 2..j and everything segment j saves
  (its input, kept, is the very buffer its first step saves: counted once).

Holding less kept is always better for what follows, so best[p] = the least kept bytes of a
segmentation of steps [0, p) whose every recompute fits is a shortest-path recurrence over the
segment starts q < p (O(n^2), one vectorized pass per p). The plan's predicted activation peak is
the maximum of those phases; the report sets it next to the measured one.

That DP is exact on chains: every step reads at most the previous step's output besides graph
inputs (as an MLP or a deep chain of layers). A graph with skip connections (residual blocks, U-Net
encoder-decoder links) is planned by a stated heuristic, `_plan_dag`:

1. Any segmentation of any DAG is *evaluated exactly* from the metering forward (`evaluate`): the
   kept values of checkpoint.plan (each held from the first forward until the earliest segment that
   reads it is recomputed) and each phase's saved buffers, as tokens, so shared buffers count once.
2. A DP over segment starts (every topological position; the `MAX_CANDIDATES` positions with the
   fewest bytes crossing them on larger graphs) minimizes the kept bytes under an *upper bound*:
   a segment [q, p) adds the values made before q and read in [q, p), and its recompute holds the
   kept bytes so far + those + what it saves. The bound is exact where boundaries are single-value
   cuts (the block outputs of a ResNet, every boundary of a chain); elsewhere a value read by two
   recomputed segments (a skip) is counted twice, so the bound never undercounts: the plan fits.
3. The uniform segmentations (`every:K` for each distinct segment count, sqrt's among them) are
   evaluated exactly as well, and the plan is the one with the least recomputation among those
   whose exact peak fits (ties: the lower peak). So at sqrt's measured peak the plan never
   recomputes more than sqrt; the predicted peak is the exact evaluation of the chosen plan
   (tests/engine/test_memory_plan_dag.py: equal to the measured one on a residual net and a U-Net).

The smallest feasible budget named by an infeasible one is the smallest this planner can meet
(the DP bound's minimum, or the best uniform plan's exact peak), not a proven optimum over all
segmentations (DAG checkpoint placement is NP-hard in general: Checkmate, MLSys 2020).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from . import checkpoint


@dataclass
class BudgetPlan:
    ends: list[int]  # index of the last step of each segment
    predicted_peak: int  # activation bytes (saved tally, kept values included) the plan holds at most
    recomputed_steps: int
    kept: list[str]  # the values kept from the first forward
    method: str = "chain DP (exact)"  # or the DAG heuristic's choice (see the module docstring)


def _not_chain(program, metering) -> str | None:
    """Why the chain DP does not apply (None: it does)."""
    steps = program.steps
    inputs = program.graph.inputs
    for i, step in enumerate(steps):
        for name in step.inputs:
            if name not in inputs and (i == 0 or name != steps[i - 1].name):
                return f"node '{step.name}' reads '{name}', not the previous node's output"
    first: dict[int, int] = {}
    for i, step in enumerate(steps):
        for token, _ in metering.store.pins.get(step.name, ()):
            first.setdefault(token, i)
            if i > first[token] + 1:
                return f"a buffer saved by node '{steps[first[token]].name}' is saved again by node '{step.name}'"
    return None


def _chain_data(program, metering):
    """Per step: the bytes of the tokens first saved there (P), the bytes of tokens saved on both
    sides of each boundary (extra), and per boundary q the kept input's bytes and whether a step
    from q on saves it (then it is counted once). Only for chains (_not_chain)."""
    steps = program.steps
    n = len(steps)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, step in enumerate(steps):
        for token, _ in metering.store.pins.get(step.name, ()):
            first.setdefault(token, i)
            last[token] = i
    sizes = metering.live.token_bytes
    own = np.zeros(n + 1, dtype=np.int64)  # own[i + 1]: bytes of the tokens first saved by step i
    extra = np.zeros(n + 1, dtype=np.int64)  # extra[q]: tokens saved before q and from q on
    for token, i in first.items():
        j = last[token]
        own[i + 1] += sizes[token]
        if j == i + 1:
            extra[j] += sizes[token]
    prefix = np.cumsum(own)
    kept_bytes = np.zeros(n + 1, dtype=np.int64)  # the input y_{q-1} of a segment starting at q
    not_saved = np.zeros(n + 1, dtype=np.int64)  # ... its bytes when no step from q on saves it
    itemsize = np.dtype(program.float_dtype).itemsize
    for q in range(1, n + 1):
        name = steps[q - 1].name
        token = metering.store.value_tokens.get(name)
        if token is not None:
            kept_bytes[q] = sizes[token]
            not_saved[q] = 0 if last[token] >= q else sizes[token]
        else:
            spec = program.graph.specs[name]
            kept_bytes[q] = int(np.prod(spec.shape, dtype=np.int64)) * (itemsize if spec.dtype == "float" else 8)
            not_saved[q] = kept_bytes[q]
    return prefix, extra, kept_bytes, not_saved


def _solve(prefix, extra, kept_bytes, not_saved, budget: int):
    """(final segment start f, parent links, best) of the plan with the least recomputation, or None."""
    n = len(prefix) - 1
    inf = np.iinfo(np.int64).max // 4
    best = np.full(n + 1, inf, dtype=np.int64)
    best[0] = 0
    parent = np.zeros(n + 1, dtype=np.int64)
    # a recomputed segment [q, p) holds best[q] + its kept input + what it saves:
    # held(q, p) = best[q] + prefix[p] + held_base[q]; (at q = 0 the input is a graph input: all zero)
    held_base = extra + not_saved - prefix
    for p in range(1, n):  # the final segment is never empty: p < n
        q = np.arange(p)
        ok = best[:p] < inf
        held = best[:p] + prefix[p] + held_base[:p]
        ok &= held <= budget
        if ok.any():
            total = np.where(ok, best[:p] + kept_bytes[:p], inf)
            k = int(np.argmin(total))
            best[p], parent[p] = total[k], q[k]
    for f in range(n):
        if best[f] < inf and best[f] + prefix[n] - prefix[f] + extra[f] <= budget:
            return f, parent, best
    return None


def _infeasible(budget: int, smallest: int) -> OptionError:
    return OptionError(f"budget:{budget}: no plan keeps the activations under {budget} bytes; the smallest "
                       f"feasible budget is {smallest} bytes", field="checkpoint")


def plan_for_budget(program, metering, budget: int) -> BudgetPlan:
    """The plan for `budget` bytes of activations, from a metering forward of the plain run.
    OptionError naming the smallest feasible budget when none fits."""
    if _not_chain(program, metering) is not None:
        return _plan_dag(program, metering, budget)
    data = _chain_data(program, metering)
    prefix, extra, kept_bytes, not_saved = data
    n = len(program.steps)
    solved = _solve(*data, budget)
    if solved is None:
        lo, hi = 0, int(prefix[n])  # hi: no checkpointing, always feasible
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _solve(*data, mid) is not None else (mid + 1, hi)
        raise _infeasible(budget, lo)
    f, parent, best = solved
    starts = []
    p = f
    while p > 0:
        q = int(parent[p])
        starts.append((q, p))
        p = q
    starts.reverse()
    ends = [p - 1 for _, p in starts] + [n - 1]
    peaks = [int(best[f] + prefix[n] - prefix[f] + extra[f])]
    for q, p in starts:
        peaks.append(int(best[q] + prefix[p] + extra[q] + not_saved[q] - prefix[q]) if q else int(prefix[p]))
    kept = [program.steps[q - 1].name for q, _ in starts if q > 0]
    return BudgetPlan(ends, max(peaks), recomputed_steps(program, ends), kept)


def recomputed_steps(program, ends: list[int]) -> int:
    """Op evaluations the segmentation `ends` adds: the steps of its recomputed segments."""
    cp = checkpoint.plan(program, checkpoint.Policy("budget", k=1), check=False, ends=ends)
    return 0 if cp is None else sum(len(seg) for j, seg in enumerate(cp.segments) if cp.recomputed[j])


# --- general DAGs: a DP over a conservative bound, every plan evaluated exactly --------------------

MAX_CANDIDATES = 400  # segment starts the DAG DP considers (its tables are MAX_CANDIDATES^2)


class _Tokens:
    """What a metering forward says each step saves (buffer tokens) and what each value is."""

    def __init__(self, program, metering):
        self.program = program
        self.sizes: dict = dict(metering.live.token_bytes)
        self.saves = [tuple(t for t, _ in metering.store.pins.get(s.name, ())) for s in program.steps]
        self.value_tokens = metering.store.value_tokens
        self.produced = {s.name: s.index for s in program.steps}

    def of(self, name: str):
        """The token of a value's buffer: the metered one where some step saved it as it is, else
        its own (its bytes from its static shape)."""
        token = self.value_tokens.get(name)
        if token is None:
            token = ("value", name)
            if token not in self.sizes:
                spec = self.program.graph.specs[name]
                width = np.dtype(self.program.float_dtype).itemsize if spec.dtype == "float" else \
                    1 if spec.dtype == "bool" else 8
                self.sizes[token] = int(np.prod(spec.shape, dtype=np.int64)) * width
        return token

    def bytes(self, tokens) -> int:
        return sum(self.sizes[t] for t in tokens)


def evaluate(program, tokens: _Tokens, ends: list[int]):
    """(exact activation peak, recomputed steps, kept values) of the segmentation `ends` under the
    engine's checkpointing (checkpoint.py), from the metering forward's tokens."""
    cp = checkpoint.plan(program, checkpoint.Policy("budget", k=1), check=False, ends=ends)
    if cp is None:
        return tokens.bytes({t for ts in tokens.saves for t in ts}), 0, []
    kept = {name: tokens.of(name) for name in cp.kept}
    final = set()
    for i in cp.segments[cp.final]:
        final.update(tokens.saves[i])
    peak = tokens.bytes(final | set(kept.values()))  # the end of the forward
    for j, seg in enumerate(cp.segments):
        if not cp.recomputed[j]:
            continue
        held = {t for name, t in kept.items() if cp.kept[name] <= j}  # not yet dropped
        for i in seg:
            held.update(tokens.saves[i])
        peak = max(peak, tokens.bytes(held))
    return peak, recomputed_steps(program, ends), list(cp.kept)


def _candidates(program, tokens: _Tokens) -> list[int]:
    """Segment starts for the DP: every position, or on a large graph the MAX_CANDIDATES with the
    fewest bytes of values crossing them (0 always)."""
    n = len(program.steps)
    if n <= MAX_CANDIDATES:
        return list(range(n))
    last_read: dict[str, int] = {}
    for s in program.steps:
        for name in s.inputs:
            if name in tokens.produced:
                last_read[name] = s.index
    delta = np.zeros(n + 1, dtype=np.int64)
    for name, at in tokens.produced.items():
        end = last_read.get(name, at)
        delta[at + 1] += tokens.sizes[tokens.of(name)]
        delta[end + 1] -= tokens.sizes[tokens.of(name)]
    crossing = np.cumsum(delta)[:n]  # bytes of values made before p and read at p or later
    order = np.argsort(crossing[1:], kind="stable")[:MAX_CANDIDATES - 1] + 1
    return [0] + sorted(int(p) for p in order)


def _dag_tables(program, tokens: _Tokens, cands: list[int]):
    """For candidate starts q < p: held[q, p] (the bound on a recompute of [q, p) beyond the kept
    bytes so far: the values made before q read in [q, p), and its saves, as distinct buffers),
    kept[q, p] (those values' bytes) and final[q] (what a final segment [q, n) saves)."""
    steps, n, m = program.steps, len(program.steps), len(cands)
    index = {p: k for k, p in enumerate(cands)}
    held = np.zeros((m, m), dtype=np.int64)
    kept = np.zeros((m, m), dtype=np.int64)
    for qi, q in enumerate(cands):
        seen_held, seen_kept, hb, kb = set(), set(), 0, 0
        for p in range(q, n):
            pi = index.get(p)
            if pi is not None and p > q:
                held[qi, pi], kept[qi, pi] = hb, kb
            for name in steps[p].inputs:
                at = tokens.produced.get(name)
                if at is not None and at < q:
                    t = tokens.of(name)
                    if t not in seen_kept:
                        seen_kept.add(t)
                        kb += tokens.sizes[t]
                    if t not in seen_held:
                        seen_held.add(t)
                        hb += tokens.sizes[t]
            for t in tokens.saves[p]:
                if t not in seen_held:
                    seen_held.add(t)
                    hb += tokens.sizes[t]
    final = np.zeros(m, dtype=np.int64)
    seen, fb, k = set(), 0, m - 1
    for p in range(n - 1, -1, -1):
        for t in tokens.saves[p]:
            if t not in seen:
                seen.add(t)
                fb += tokens.sizes[t]
        if k >= 0 and cands[k] == p:
            final[k] = fb
            k -= 1
    return held, kept, final


def _dag_solve(cands, held, kept, final, budget: int) -> list[int] | None:
    """The segment ends of the least recomputation under the bound, or None."""
    m = len(cands)
    inf = np.iinfo(np.int64).max // 4
    best = np.full(m, inf, dtype=np.int64)
    best[0] = 0
    parent = np.zeros(m, dtype=np.int64)
    for pi in range(1, m):
        ok = (best[:pi] < inf) & (best[:pi] + held[:pi, pi] <= budget)
        if ok.any():
            total = np.where(ok, best[:pi] + kept[:pi, pi], inf)
            k = int(np.argmin(total))
            best[pi], parent[pi] = total[k], k
    for fi in range(m):
        if best[fi] < inf and best[fi] + final[fi] <= budget:
            ends, k = [], fi
            while k > 0:
                ends.append(cands[k] - 1)
                k = int(parent[k])
            return sorted(ends)
    return None


def _plan_dag(program, metering, budget: int) -> BudgetPlan:
    """The DAG heuristic of the module docstring."""
    n = len(program.steps)
    tokens = _Tokens(program, metering)
    options = []  # (recomputed steps, exact peak, ends, kept, method)
    for size in sorted({math.ceil(n / s) for s in range(1, n + 1)}):
        ends = list(range(size - 1, n - 1, size)) + [n - 1]
        peak, recomputed, kept = evaluate(program, tokens, ends)
        options.append((recomputed, peak, ends, kept, f"uniform (every:{size}), exact"))
    cands = _candidates(program, tokens)
    tables = _dag_tables(program, tokens, cands)
    solved = _dag_solve(cands, *tables, budget)
    if solved is not None:
        ends = solved + [n - 1]
        peak, recomputed, kept = evaluate(program, tokens, ends)
        options.append((recomputed, peak, ends, kept, "DAG DP over a conservative bound, exact evaluation"))
    fitting = [o for o in options if o[1] <= budget]
    if not fitting:
        lo, hi = 0, int(tables[2][0])  # no checkpointing: always feasible under the bound
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _dag_solve(cands, *tables, mid) is not None else (mid + 1, hi)
        raise _infeasible(budget, min(lo, min(o[1] for o in options)))
    recomputed, peak, ends, kept, method = min(fitting, key=lambda o: (o[0], o[1]))
    return BudgetPlan(ends, int(peak), int(recomputed), kept, method)
