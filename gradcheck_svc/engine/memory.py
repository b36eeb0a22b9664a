"""Memory accounting: bytes of the distinct buffers the engine holds.

Views (reshape, broadcast_to, slices) share their base's buffer, so arrays
are counted by the buffer that owns the memory, once however many names or
saved slots refer to it.
"""
from __future__ import annotations


def _owner(a):
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


class MemoryMeter:
    def __init__(self, record_timeline: bool = False):
        self._refs: dict[int, list] = {}  # id(owner) -> [owner, count]
        self.current = 0
        self.peak = 0
        self.timeline: list[tuple[str, int]] | None = [] if record_timeline else None

    def hold(self, a) -> None:
        o = _owner(a)
        ref = self._refs.get(id(o))
        if ref is None:
            self._refs[id(o)] = [o, 1]
            self.current += o.nbytes
            if self.current > self.peak:
                self.peak = self.current
        else:
            ref[1] += 1

    def drop(self, a) -> None:
        o = _owner(a)
        ref = self._refs.get(id(o))
        if ref is None:
            return
        ref[1] -= 1
        if ref[1] == 0:
            del self._refs[id(o)]
            self.current -= o.nbytes

    def mark(self, label: str) -> None:
        if self.timeline is not None:
            self.timeline.append((label, self.current))
