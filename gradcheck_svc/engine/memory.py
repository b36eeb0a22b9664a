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
"""
from __future__ import annotations

import weakref


def owner(a):
    """The array that owns a's memory (a itself unless a is a view)."""
    base = getattr(a, "base", None)  # a view's base chain ends at the array owning the memory
    while base is not None and hasattr(base, "nbytes"):  # (not at a foreign buffer without a size)
        a, base = base, getattr(base, "base", None)
    return a


class Tally:
    """Bytes of the tensors kept for backward (saved tensors, checkpoint values): the live
    meter's `hold_saved`/`drop_saved` keep it, as the distinct buffers among those tensors."""

    def __init__(self):
        self.current = 0
        self.peak = 0


class MemoryMeter:
    """Counts the distinct buffers held (`current`, `peak`) and, within them, those kept for
    backward (`saved`, a Tally). One table serves both: a saved tensor is always also held,
    and the engine's hot loops then pay one owner lookup per tensor, not two."""

    def __init__(self, record_timeline: bool = False, sampler=None):
        self._refs: dict[int, list] = {}  # id(owner) -> [owner, held count, saved count]
        self._excluded: dict[int, object] = {}  # id(owner) -> owner, never counted as saved
        self.current = 0
        self.peak = 0
        self.saved = Tally()
        self.timeline: list[tuple[str, int]] | None = [] if record_timeline else None
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

    # hold/drop run several times per step: the common case (an array owning its memory) is inlined
    def hold(self, a) -> None:
        o = a if a.base is None else owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is not None:
            ref[1] += 1
        else:
            self._refs[key] = [o, 1, 0]
            self.current += o.nbytes
            if self.current > self.peak:
                self.peak = self.current

    def drop(self, a) -> None:
        o = a if a.base is None else owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is None:
            return
        if ref[1] == 1:
            del self._refs[key]
            self.current -= o.nbytes
        else:
            ref[1] -= 1

    def hold_saved(self, arrays) -> None:
        """hold() each array, and count it as kept for backward (in `saved`)."""
        refs, saved = self._refs, self.saved
        for a in arrays:
            o = a if a.base is None else owner(a)
            key = id(o)
            ref = refs.get(key)
            if ref is not None:
                ref[1] += 1
            else:
                refs[key] = ref = [o, 1, 0]
                self.current += o.nbytes
                if self.current > self.peak:
                    self.peak = self.current
            ref[2] += 1
            if ref[2] == 1 and key not in self._excluded:
                saved.current += o.nbytes
                if saved.current > saved.peak:
                    saved.peak = saved.current

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

    def mark(self, label: str) -> None:
        if self._sampler is None and self.timeline is None:
            return
        now = self.measured
        if now > self.sampled_peak:
            self.sampled_peak = now
        if self.timeline is not None:
            self.timeline.append((label, now))


class MeteringMeter(MemoryMeter):
    """A meter for a forward pass that counts what a gradient run would hold without holding it:
    tensors saved for backward are *pinned* (their bytes stay counted, as a real run would keep
    them until backward) but only weakly referenced, so the process never holds them all at
    once. Under a checkpoint policy this measures the un-checkpointed run's activation peak
    without paying its memory. A pinned buffer that was freed may see its id reused: a live
    weak reference to the same object is what identifies it."""

    def __init__(self, record_timeline: bool = False, sampler=None):
        super().__init__(record_timeline, None)  # counted bytes: device samples would see the freed buffers
        self._pinned: dict[int, object] = {}  # id(owner) -> weakref (or the owner, if not weak-referenceable)

    def _is_pinned(self, key: int, o) -> bool:
        p = self._pinned.get(key)
        return p is not None and (p is o or (callable(p) and p() is o))

    def hold(self, a) -> None:
        o = owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is not None:
            ref[1] += 1
            return
        self._refs[key] = [o, 1, 0]
        if not self._is_pinned(key, o):  # a pinned buffer's bytes are counted already
            self.current += o.nbytes
            self.peak = max(self.peak, self.current)

    def drop(self, a) -> None:
        o = owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is None:
            return
        if ref[1] == 1:
            del self._refs[key]
            if not self._is_pinned(key, o):  # a real run would keep a saved buffer until backward
                self.current -= o.nbytes
        else:
            ref[1] -= 1

    def hold_saved(self, arrays) -> None:
        for a in arrays:
            o = owner(a)
            key = id(o)
            if self._is_pinned(key, o):
                continue
            if key not in self._refs:  # a tensor derived by the op's save: counted from now on
                self.current += o.nbytes
                self.peak = max(self.peak, self.current)
            try:
                self._pinned[key] = weakref.ref(o)
            except TypeError:
                self._pinned[key] = o  # cannot refer weakly: keep it (the figures stay right)
            if key not in self._excluded:
                self.saved.current += o.nbytes
                self.saved.peak = max(self.saved.peak, self.saved.current)

    def drop_saved(self, arrays) -> None:
        raise NotImplementedError("a metering forward releases nothing it saved")
