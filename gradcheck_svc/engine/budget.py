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

Chains only: every step reads at most the previous step's output besides graph inputs (as an MLP or
a deep chain of layers); a graph with skip connections is refused with a one-line error.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError


@dataclass
class BudgetPlan:
    ends: list[int]  # index of the last step of each segment
    predicted_peak: int  # activation bytes (saved tally, kept values included) the plan holds at most
    recomputed_steps: int
    kept: list[str]  # the values kept from the first forward


def _chain_data(program, metering):
    """Per step: the bytes of the tokens first saved there (P), the bytes of tokens saved on both
    sides of each boundary (extra), and per boundary q the kept input's bytes and whether a step
    from q on saves it (then it is counted once)."""
    steps = program.steps
    n = len(steps)
    inputs = program.graph.inputs
    for i, step in enumerate(steps):
        for name in step.inputs:
            if name not in inputs and (i == 0 or name != steps[i - 1].name):
                raise OptionError(f"budget:BYTES plans chains only: node '{step.name}' reads '{name}', "
                                  "not the previous node's output (use sqrt, every:K or node names)",
                                  field="checkpoint")
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
        if j > i + 1:
            raise OptionError(f"budget:BYTES plans chains only: a buffer saved by node '{steps[i].name}' is "
                              f"saved again by node '{steps[j].name}'", field="checkpoint")
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


def plan_for_budget(program, metering, budget: int) -> BudgetPlan:
    """The plan for `budget` bytes of activations, from a metering forward of the plain run.
    OptionError naming the smallest feasible budget when none fits."""
    data = _chain_data(program, metering)
    prefix, extra, kept_bytes, not_saved = data
    n = len(program.steps)
    solved = _solve(*data, budget)
    if solved is None:
        lo, hi = 0, int(prefix[n])  # hi: no checkpointing, always feasible
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _solve(*data, mid) is not None else (mid + 1, hi)
        raise OptionError(f"budget:{budget}: no plan keeps the activations under {budget} bytes; the smallest "
                          f"feasible budget is {lo} bytes", field="checkpoint")
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
    return BudgetPlan(ends, max(peaks), sum(1 for i in range(f) if program.steps[i].needs_grad), kept)
