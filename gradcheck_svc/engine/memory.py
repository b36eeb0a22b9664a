"""Memory accounting: bytes of the distinct buffers the engine holds.

Views (reshape, broadcast_to, slices) share their base's buffer, so arrays
are counted by the buffer that owns the memory, once however many names or
saved slots refer to it.

On CuPy a meter can also read the device: given a `sampler` (the memory
pool's used bytes), every `mark` samples it, so the live figures and the
timeline are what the pool actually handed out -- temporaries, allocator
rounding and all -- rather than a sum of array sizes. Samples are offset so
that they start from the counted bytes at `calibrate` time: memory held
before the run (other requests' arrays, the caller's) is not charged to it.

One accounting: every figure of a run is read from its meter. Within the bytes
held, the meter knows three parts -- the graph's inputs (held from the start,
excluded from the others), the tensors kept for backward (`saved`) and the
parameters' gradients (`grads`, tagged by the backward pass); whatever else
is held (adjoints of intermediate values, an output before its inputs are
released) is a transient. The peak is the maximum of the bytes held. With a
timeline each step records a Mark: the bytes held after it and the highest
bytes held during it (with the parts at that instant), so the maximum over
the timeline's `high` is the peak itself, not a sample of it.
"""
from __future__ import annotations

import itertools
import weakref
from array import array
from typing import NamedTuple


def owner(a):
    """The array that owns a's memory (a itself unless a is a view)."""
    base = getattr(a, "base", None)  # a view's base chain ends at the array owning the memory
    while base is not None and hasattr(base, "nbytes"):  # (not at a foreign buffer without a size)
        a, base = base, getattr(base, "base", None)
    return a


class Mark(NamedTuple):
    """One step of a timeline."""

    label: str  # "forward NODE", "recompute NODE", "backward NODE"
    live: int  # bytes held after the step
    high: int  # the most bytes held during the step (a device sample: the same as live)
    saved: int  # bytes kept for backward after the step
    high_saved: int  # ... and at the instant of `high`
    high_grads: int  # parameters' gradient bytes at the instant of `high`


KINDS = ("forward", "recompute", "backward")
_KIND = {k: i for i, k in enumerate(KINDS)}


class Timeline:
    """A run's Marks, one per step, kept compactly (a deep graph has thousands of steps, and the
    timeline must not weigh on the memory it measures): the numbers in int64 arrays, the step
    names by reference. Reads as a sequence of Marks."""

    def __init__(self):
        self.kinds = bytearray()
        self.names: list[str] = []
        self.numbers = array("q")  # per step: live, high, saved, high_saved, high_grads (one extend per step)

    def append(self, kind: str, name: str, *numbers: int) -> None:
        self.kinds.append(_KIND[kind])
        self.names.append(name)
        self.numbers.extend(numbers)

    @property
    def columns(self) -> tuple:
        """(live, high, saved, high_saved, high_grads), each an int64 array over the steps."""
        return tuple(self.numbers[k::5] for k in range(5))

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> Mark:
        return Mark(f"{KINDS[self.kinds[i]]} {self.names[i]}", *self.numbers[5 * i:5 * i + 5])

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def kind(self, i: int) -> str:
        return KINDS[self.kinds[i]]

    def peak_index(self) -> int | None:
        """The first step whose high is the timeline's maximum."""
        high = self.numbers[1::5]
        return max(range(len(high)), key=high.__getitem__) if high else None


class Tally:
    """Bytes of the tensors kept for backward (saved tensors, checkpoint values): the live
    meter's `hold_saved`/`drop_saved` keep it, as the distinct buffers among those tensors."""

    def __init__(self):
        self.current = 0
        self.peak = 0


class MemoryMeter:
    """Counts the distinct buffers held (`current`, `peak`) and, within them, those kept for
    backward (`saved`, a Tally) and the parameters' gradients (`grads`). One table serves all:
    a saved tensor is always also held, and the engine's hot loops then pay one owner lookup
    per tensor, not two."""

    def __init__(self, record_timeline: bool = False, sampler=None):
        self._refs: dict[int, list] = {}  # id(owner) -> [owner, held count, saved count, gradient count]
        self._excluded: dict[int, object] = {}  # id(owner) -> owner, never counted as saved or gradient
        self.current = 0
        self.peak = 0
        self.saved = Tally()
        self.grads = 0  # bytes of the parameters' gradients held now
        self.high = 0  # the most bytes held since the last mark
        self.high_parts = (0, 0)  # (saved, grads) when `high` was reached
        self.timeline: Timeline | None = Timeline() if record_timeline else None
        self._sampler = sampler
        self._offset = 0
        self.sampled_peak = 0
        # mark() only does something with a sampler or a timeline; the loops skip the call (and
        # building its label) otherwise
        self.marks = sampler is not None or record_timeline

    def exclude_saved(self, arrays) -> None:
        """Never count these arrays' buffers as saved (parameters and data are not activations)."""
        for a in arrays:
            o = owner(a)
            self._excluded[id(o)] = o

    def _grew(self) -> None:
        """`current` passed the step's high: note it, and the parts at this instant."""
        c = self.current
        self.high = c
        self.high_parts = (self.saved.current, self.grads)
        if c > self.peak:
            self.peak = c

    # hold/drop run several times per step: the common case (an array owning its memory) is inlined
    def hold(self, a) -> None:
        o = a if a.base is None else owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is not None:
            ref[1] += 1
        else:
            self._refs[key] = [o, 1, 0, 0]
            c = self.current = self.current + o.nbytes
            if c > self.high:  # (_grew, inlined)
                self.high = c
                self.high_parts = (self.saved.current, self.grads)
                if c > self.peak:
                    self.peak = c

    def drop(self, a) -> None:
        o = a if a.base is None else owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is None:
            return
        if ref[1] == 1:
            del self._refs[key]
            self.current -= o.nbytes
            if ref[3]:  # a gradient dropped without drop_grad: no longer held, no longer counted
                self.grads -= o.nbytes
        else:
            ref[1] -= 1

    def hold_grad(self, a) -> None:
        """hold() a parameter's gradient (counted in `grads`)."""
        self.hold(a)
        self.tag_grad(a)

    def tag_grad(self, a) -> None:
        """An array held already has become a parameter's gradient."""
        o = a if a.base is None else owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is None or ref[2] or key in self._excluded:  # (saved or an input: counted as such)
            return
        ref[3] += 1
        if ref[3] == 1:
            self.grads += o.nbytes
            c = self.current
            if c == self.high:  # the instant of the step's high: its parts follow
                self.high_parts = (self.saved.current, self.grads)

    def drop_grad(self, a) -> None:
        """Undo hold_grad."""
        o = a if a.base is None else owner(a)
        ref = self._refs.get(id(o))
        if ref is not None and ref[3]:
            ref[3] -= 1
            if ref[3] == 0:
                self.grads -= o.nbytes
        self.drop(a)

    def hold_saved(self, arrays) -> int:
        """hold() each array, and count it as kept for backward (in `saved`); returns the bytes
        newly counted as saved."""
        refs, saved = self._refs, self.saved
        added = 0
        for a in arrays:
            o = a if a.base is None else owner(a)
            key = id(o)
            ref = refs.get(key)
            grew = ref is None
            if grew:
                refs[key] = ref = [o, 1, 0, 0]
            else:
                ref[1] += 1
            ref[2] += 1
            if ref[2] == 1 and key not in self._excluded:
                added += o.nbytes
                saved.current += o.nbytes
                if saved.current > saved.peak:
                    saved.peak = saved.current
            if grew:  # after the saved tally: the parts at a new high include this tensor
                self.current += o.nbytes
                if self.current > self.high:
                    self._grew()
        return added

    def drop_saved(self, arrays) -> None:
        """Undo hold_saved for each array."""
        refs, saved = self._refs, self.saved
        for a in arrays:
            o = a if a.base is None else owner(a)
            key = id(o)
            ref = refs.get(key)
            if ref is None:
                continue
            ref[2] -= 1
            if ref[2] == 0 and key not in self._excluded:
                saved.current -= o.nbytes
            if ref[1] == 1:
                del refs[key]
                self.current -= o.nbytes
            else:
                ref[1] -= 1

    def calibrate(self) -> None:
        """Align device samples with the counted bytes held now."""
        if self._sampler is not None:
            self._offset = self.current - self._sampler()
            self.sampled_peak = self.current

    @property
    def measured(self) -> int:
        """Bytes in use now: sampled from the device when there is a sampler, else counted."""
        if self._sampler is None:
            return self.current
        return self._sampler() + self._offset

    @property
    def measured_peak(self) -> int:
        """Peak over the marks (device samples) or over every hold (counted)."""
        return self.sampled_peak if self._sampler is not None else self.peak

    def restart_step(self) -> None:
        """Start the current step's high from the bytes held now. After bytes were released
        since the last mark: the high in between was at that mark, recorded already, and the
        next step's high is then read with the parts it had (memory_profile.replay_backward
        relies on the saved bytes not changing within a backward step but at its end)."""
        self.high, self.high_parts = self.current, (self.saved.current, self.grads)

    def mark(self, kind: str, name: str) -> None:
        """The end of a step: kind is forward, recompute or backward; name the step's node."""
        timeline = self.timeline
        if self._sampler is None:  # counted: the common case, once per step
            if timeline is None:
                return
            c, s = self.current, self.saved.current
            timeline.kinds.append(_KIND[kind])
            timeline.names.append(name)
            timeline.numbers.extend((c, self.high, s, *self.high_parts))
            self.high, self.high_parts = c, (s, self.grads)  # the next step's high starts from here
            return
        now = self.measured
        parts = (self.saved.current, self.grads)
        if now > self.sampled_peak:  # the device is read at marks only: a step's high is its sample
            self.sampled_peak = now
        if timeline is not None:
            timeline.append(kind, name, now, now, parts[0], *parts)
        self.high, self.high_parts = self.current, parts


class MeteringMeter(MemoryMeter):
    """A meter for a forward pass that counts what a gradient run would hold without holding it:
    tensors saved for backward are *pinned* (their bytes stay counted, as a real run would keep
    them until backward) but only weakly referenced, so the process never holds them all at
    once. Under a checkpoint policy this measures the un-checkpointed run's activation peak
    without paying its memory. A pinned buffer that was freed may see its id reused: a live
    weak reference to the same object is what identifies it. Each pinned buffer gets a token
    (`pin_tokens` returns them per save), so what the un-checkpointed backward would release
    can be replayed (memory_profile.replay_backward) without confusing two buffers of one id."""

    def __init__(self, record_timeline: bool = False, sampler=None):
        super().__init__(record_timeline, None)  # counted bytes: device samples would see the freed buffers
        self._pinned: dict[int, tuple] = {}  # id(owner) -> (weakref or the owner, token)
        self._tokens = itertools.count()
        self.token_bytes: dict[int, int] = {}  # token -> bytes (activations only, not graph inputs)

    def _pin(self, key: int, o):
        p = self._pinned.get(key)
        if p is not None and (p[0] is o or (callable(p[0]) and p[0]() is o)):
            return p[1]
        return None

    def hold(self, a) -> None:
        o = owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is not None:
            ref[1] += 1
            return
        self._refs[key] = [o, 1, 0, 0]
        if self._pin(key, o) is None:  # a pinned buffer's bytes are counted already
            self.current += o.nbytes
            if self.current > self.high:
                self._grew()

    def drop(self, a) -> None:
        o = owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is None:
            return
        if ref[1] == 1:
            del self._refs[key]
            if self._pin(key, o) is None:  # a real run would keep a saved buffer until backward
                self.current -= o.nbytes
        else:
            ref[1] -= 1

    def hold_saved(self, arrays) -> int:
        return sum(b for _, b in self.pin(arrays) if b)

    def pin(self, arrays) -> list[tuple[int | None, int]]:
        """hold_saved, returning per array (its buffer's token, bytes newly counted as saved);
        the token is None for a graph input's buffer (not an activation)."""
        out = []
        for a in arrays:
            o = owner(a)
            key = id(o)
            token = self._pin(key, o)
            if token is not None:
                out.append((token if token in self.token_bytes else None, 0))
                continue
            token = next(self._tokens)
            try:
                self._pinned[key] = (weakref.ref(o), token)
            except TypeError:
                self._pinned[key] = (o, token)  # cannot refer weakly: keep it (the figures stay right)
            if key in self._excluded:
                out.append((None, 0))
            else:
                self.token_bytes[token] = o.nbytes
                self.saved.current += o.nbytes
                self.saved.peak = max(self.saved.peak, self.saved.current)
                out.append((token, o.nbytes))
            if key not in self._refs:  # a tensor derived by the op's save: counted from now on
                self.current += o.nbytes
                if self.current > self.high:
                    self._grew()
        return out

    def drop_saved(self, arrays) -> None:
        raise NotImplementedError("a metering forward releases nothing it saved")
