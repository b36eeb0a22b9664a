"""Gradient checkpointing: keep some values, recompute the rest in backward.

A policy cuts the program's steps (topological order) into segments:

  none       no checkpointing (every step saves what its vjp needs)
  sqrt       about sqrt(n) segments of equal length
  every:K    segments of K steps
  a,b,c      explicit: a segment ends at each named node
  budget:B   the least recomputation keeping the activations under B bytes (budget.py: exact
             on chains, a stated heuristic on DAGs)

The last segment runs as usual: it would be recomputed at once, so its steps
save in the first forward. The other segments save nothing; the values that
cross from an earlier segment into a later, checkpointed one are *kept* (for
a chain, the segment boundaries; in a general DAG also residual and other
multi-consumer values). Graph inputs are always held. During backward, on
reaching a checkpointed segment's last step, the segment is recomputed from
the kept values and inputs -- now saving for backward -- and its saved tensors
are released step by step as the backward pass consumes them, as usual. A
kept value is dropped once the last segment that reads it has been
recomputed. Backward itself is unchanged (same steps, same order, same
accumulation), so on a deterministic backend the gradients are bit for bit
those without checkpointing.

The recompute check: in the first forward each value of a checkpointed
segment is fingerprinted (the arrays are not kept: they are fingerprinted in
batches of at most BATCH values, which bounds the extra memory and makes the
check cheap next to the recompute itself), and each recomputed value is
compared with its fingerprint. A mismatch whose own inputs all matched is
where the difference starts -- a nondeterministic op, randomness that was not
replayed -- and is reported naming that node; values downstream of it differ
as a consequence and are only counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import OptionError
from .executor import run_step, save_for_backward
from .fingerprint import (CHUNK_WORDS, GROUP_WORDS, HOST_COPY_UP_TO, fingerprint, fingerprints,
                          pass_fingerprint)
from .program import Program


@dataclass(frozen=True)
class Policy:
    kind: str  # none | sqrt | every | nodes
    k: int = 0  # every:K
    nodes: tuple[str, ...] = ()  # explicit checkpoints

    def __str__(self) -> str:
        if self.kind == "every":
            return f"every:{self.k}"
        if self.kind == "budget":
            return f"budget:{self.k}"
        if self.kind == "nodes":
            return ",".join(self.nodes)
        return self.kind


NONE = Policy("none")


MAX_DIGITS = 20  # a count of bytes or steps fits in 64 bits (and int() refuses beyond 4300 digits)


def _count(text: str, prefix: str, need: str) -> int:
    """The positive integer after `prefix`: ASCII digits only (str.isdigit also takes '²'), a bounded number."""
    digits = text[len(prefix):]
    if len(digits) > MAX_DIGITS:
        raise OptionError(f"'{prefix}' and {len(digits)} characters: {need} of at most {MAX_DIGITS} digits",
                          field="checkpoint")
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise OptionError(f"'{text}': {need}", field="checkpoint")
    return int(digits)


def parse_policy(spec) -> Policy:
    """'none' | 'sqrt' | 'every:K' | 'a,b,c' (or a list of node names, or a Policy)."""
    if isinstance(spec, Policy):
        return spec
    if spec is None:
        return NONE
    if isinstance(spec, (list, tuple)):
        names = tuple(str(n).strip() for n in spec)
    else:
        text = str(spec).strip()
        if text in ("", "none"):
            return NONE
        if text == "sqrt":
            return Policy("sqrt")
        if text.startswith("budget:"):
            return Policy("budget", k=_count(text, "budget:", "budget:BYTES needs a positive integer number of bytes"))
        if text.startswith("every:"):
            return Policy("every", k=_count(text, "every:", "every:K needs a positive integer K"))
        names = tuple(n.strip() for n in text.split(","))
    if not names or any(not n for n in names):
        raise OptionError(f"'{spec}' is not none, sqrt, every:K or a comma-separated list of node names",
                          field="checkpoint")
    return Policy("nodes", nodes=tuple(dict.fromkeys(names)))


@dataclass
class Plan:
    """Where a policy cuts a Program, and what that implies for memory."""

    program: Program
    policy: Policy
    segments: list[range]  # step indices, in order; the last one is saved in the first forward
    segment_of: list[int]  # step index -> segment
    recomputed: list[bool]  # per segment: checkpointed and holds a step that needs a gradient
    kept: dict[str, int]  # value -> the segment whose recompute reads it last (then it is dropped)
    drop_after: dict[int, tuple[str, ...]] = field(default_factory=dict)  # segment -> kept values
    recompute_release: dict[int, tuple[str, ...]] = field(default_factory=dict)  # step -> values
    check: bool = True  # fingerprint the first forward and compare each recompute with it

    @property
    def final(self) -> int:
        return len(self.segments) - 1

    def start(self, xp, live, store, feeds) -> "CheckpointRun":
        return CheckpointRun(self, xp, live, store, feeds)


def _ends(program: Program, policy: Policy) -> list[int]:
    """Index of the last step of each segment."""
    n = len(program.steps)
    if policy.kind == "sqrt":
        size = math.ceil(n / max(1, round(math.sqrt(n))))
    elif policy.kind == "every":
        size = policy.k
    else:  # nodes
        ends = set()
        for name in policy.nodes:
            step = program.by_name.get(name)
            if step is None:
                what = ("a graph input (always kept)" if name in program.graph.inputs
                        else "not a node that the loss depends on" if name in program.shapes
                        else "not a node of this graph")
                raise OptionError(f"'{name}' is {what}", field="checkpoint")
            ends.add(step.index)
        return sorted(ends | {n - 1})
    return list(range(size - 1, n - 1, size)) + [n - 1]


def plan(program: Program, policy, check: bool = True, ends: list[int] | None = None) -> Plan | None:
    """The segmentation of `program` under `policy`; None for no checkpointing.
    check=False skips the recompute check (for measuring what the check costs).
    ends: the segments' last steps, chosen elsewhere (budget:BYTES, engine/budget.py)."""
    policy = parse_policy(policy)
    steps = program.steps
    if policy.kind == "none" or not steps:
        return None
    if ends is None and policy.kind == "budget":
        raise ValueError("a budget policy's segments come from engine.budget.plan_for_budget")
    segments, start = [], 0
    for end in ends if ends is not None else _ends(program, policy):
        segments.append(range(start, end + 1))
        start = end + 1
    segment_of = [0] * len(steps)
    for s, seg in enumerate(segments):
        for i in seg:
            segment_of[i] = s
    final = len(segments) - 1
    recomputed = [s != final and any(steps[i].needs_grad for i in seg) for s, seg in enumerate(segments)]

    produced_in = {st.name: segment_of[st.index] for st in steps}
    kept: dict[str, int] = {}
    release: dict[int, list[str]] = {}
    for s, seg in enumerate(segments):
        if not recomputed[s]:  # the final segment, or one without gradients: never recomputed
            continue
        last_read: dict[str, int] = {}
        for i in seg:
            for name in steps[i].inputs:
                origin = produced_in.get(name)  # None: a graph input, always held
                if origin is None:
                    continue
                if origin < s:
                    kept[name] = min(kept.get(name, s), s)
                else:
                    last_read[name] = i
        # during a recompute, a value is dropped after its last reader inside the segment (or at once)
        for i in seg:
            release.setdefault(last_read.get(steps[i].name, i), []).append(steps[i].name)
    drop_after: dict[int, list[str]] = {}
    for name, s in kept.items():
        drop_after.setdefault(s, []).append(name)
    return Plan(program, policy, segments, segment_of, recomputed, kept,
                {s: tuple(v) for s, v in drop_after.items()}, {i: tuple(v) for i, v in release.items()}, check)


BATCH = 32  # values fingerprinted together (held at most this long past their release)
BATCH_BYTES = CHUNK_WORDS * 8  # ... and at most this many bytes of them


class _Pending:
    """Values waiting to be fingerprinted together; held in the live meter meanwhile. On the host
    a value larger than GROUP_WORDS is fingerprinted at once instead, with the cheaper
    pass_fingerprint (both passes take prints here, so they always compare alike): holding it
    only delayed its release."""

    def __init__(self, xp, live):
        self.xp, self.live = xp, live
        self.host = xp.__name__ == "numpy"
        self.items: list[tuple[str, object]] = []  # (name, array) or (name, None) when done: see prints
        self.done: dict[str, tuple] = {}
        self.bytes = 0

    def add(self, name: str, y) -> bool:
        if self.host and y.nbytes > GROUP_WORDS * 8:
            self.done[name] = pass_fingerprint(self.xp, y)
            self.items.append((name, None))
            return len(self.items) >= BATCH
        self.items.append((name, y))
        self.live.hold(y)
        self.bytes += y.nbytes
        return len(self.items) >= BATCH or self.bytes >= BATCH_BYTES  # held past release: bounded

    def take(self) -> list[tuple[str, tuple]]:
        items, self.items, self.bytes = self.items, [], 0
        done, self.done = self.done, {}
        held = [y for _, y in items if y is not None]
        if self.host:
            # on the host a small value is its own fingerprint (exact, and cheaper than the
            # reductions), a larger one (at most GROUP_WORDS words) the hash of its bytes (`fingerprint`'s
            # host path: ~5 us a 4 KiB value, where grouped word sums spent ~20 us of NumPy calls on
            # it); both passes take prints here, so they always compare alike
            prints = iter([(y.tobytes(), y.shape, y.dtype) if y.nbytes <= HOST_COPY_UP_TO else fingerprint(self.xp, y)
                           for y in held])
        else:
            prints = iter(fingerprints(self.xp, held))
        for y in held:
            self.live.drop(y)
        return [(name, done[name] if y is None else next(prints)) for name, y in items]


@dataclass
class Mismatch:
    """A recomputed value that differs from the first forward's, where the difference starts."""

    node: str
    op: str
    segment: int
    downstream: list[str] = field(default_factory=list)  # recomputed values that differ because of it


class CheckpointRun:
    """One forward/backward under a Plan: the kept values, the first forward's fingerprints,
    the recomputes, and what they found."""

    def __init__(self, plan: Plan, xp, live, store, feeds):
        self.plan = plan
        self.xp = xp
        self.live = live
        self.store = store
        self.feeds = feeds
        self.kept: dict[str, object] = {}
        self.prints: dict[str, tuple] = {}
        self._pending = _Pending(xp, live)
        self.evaluations = 0  # op evaluations spent recomputing
        self.mismatches: list[Mismatch] = []

    def saves(self, step) -> bool:
        """Does the first forward save for this step's backward?"""
        return self.plan.segment_of[step.index] == self.plan.final

    def forwarded(self, step, y) -> None:
        """The first forward produced y: keep it if a later segment's recompute reads it,
        fingerprint it if its own segment will be recomputed."""
        s = self.plan.segment_of[step.index]
        if s == self.plan.final:
            return
        if step.name in self.plan.kept:
            self.kept[step.name] = y
            self.live.hold_saved((y,))  # kept for backward: an activation like any saved tensor
        if self.plan.recomputed[s] and self.plan.check:
            pending = self._pending
            if pending.host and not pending.items and y.nbytes > GROUP_WORDS * 8:  # at once, nothing to wait for
                self.prints[step.name] = pass_fingerprint(self.xp, y)
            elif pending.add(step.name, y) or step.index == self.plan.segments[s][-1]:
                self.prints.update(pending.take())

    def before_backward(self, step) -> None:
        s = self.plan.segment_of[step.index]
        if s != self.plan.final and step.index == self.plan.segments[s][-1]:
            self._recompute(s)

    def _recompute(self, s: int) -> None:
        plan, xp, live = self.plan, self.xp, self.live
        if plan.recomputed[s]:
            steps = plan.program.steps
            values: dict[str, object] = {}
            self._origin: dict[str, Mismatch] = {}
            for i in plan.segments[s]:
                step = steps[i]
                xs = [values[n] if n in values else self.kept[n] if n in self.kept else self.feeds[n]
                      for n in step.inputs]
                y = run_step(xp, step, xs)
                self.evaluations += 1
                values[step.name] = y
                live.hold(y)
                if step.needs_grad:
                    save_for_backward(self.store, step, xs, y)
                if plan.check:
                    pending = self._pending
                    if pending.host and not pending.items and y.nbytes > GROUP_WORDS * 8:
                        if pass_fingerprint(xp, y) != self.prints.pop(step.name):  # in order: none pending
                            self._differs(s, step.name)
                    elif pending.add(step.name, y) or i == plan.segments[s][-1]:
                        self._check(s)
                for name in plan.recompute_release.get(i, ()):
                    live.drop(values.pop(name))
                if live.marks:
                    live.mark("recompute", step.name)
        for name in plan.drop_after.get(s, ()):
            live.drop_saved((self.kept.pop(name),))
        live.restart_step()  # the backward step that follows starts from here, without the kept values

    def _check(self, s: int) -> None:
        """Compare a batch of recomputed values (in topological order) with the first forward."""
        for name, p in self._pending.take():
            if p != self.prints.pop(name):
                self._differs(s, name)

    def _differs(self, s: int, name: str) -> None:
        """A recomputed value differs from the first forward's (values are told in topological order)."""
        origin = self._origin  # differing value -> the mismatch it stems from
        step = self.plan.program.by_name[name]
        causes = [origin[n] for n in step.inputs if n in origin]
        if causes:
            causes[0].downstream.append(name)
            origin[name] = causes[0]
        else:
            origin[name] = Mismatch(name, step.op.name, s)
            self.mismatches.append(origin[name])
