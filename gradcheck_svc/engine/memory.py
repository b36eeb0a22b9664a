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


def _owner(a):
    base = getattr(a, "base", None)  # a view's base chain ends at the array owning the memory
    while base is not None and hasattr(base, "nbytes"):  # (not at a foreign buffer without a size)
        a, base = base, getattr(base, "base", None)
    return a


class MemoryMeter:
    def __init__(self, record_timeline: bool = False, sampler=None):
        self._refs: dict[int, list] = {}  # id(owner) -> [owner, count]
        self._excluded: dict[int, object] = {}  # id(owner) -> owner, never counted
        self.current = 0
        self.peak = 0
        self.timeline: list[tuple[str, int]] | None = [] if record_timeline else None
        self._sampler = sampler
        self._offset = 0
        self.sampled_peak = 0

    def exclude(self, arrays) -> None:
        """Never count these arrays' buffers (e.g. parameters, in a meter of activations)."""
        for a in arrays:
            o = _owner(a)
            self._excluded[id(o)] = o

    # hold/drop run several times per step: the common case (an array owning its memory) is inlined
    def hold(self, a) -> None:
        o = a if getattr(a, "base", None) is None else _owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is not None:
            ref[1] += 1
        elif key not in self._excluded:
            self._refs[key] = [o, 1]
            self.current += o.nbytes
            if self.current > self.peak:
                self.peak = self.current

    def drop(self, a) -> None:
        o = a if getattr(a, "base", None) is None else _owner(a)
        key = id(o)
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[1] -= 1
        if ref[1] == 0:
            del self._refs[key]
            self.current -= o.nbytes

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
