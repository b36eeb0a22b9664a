"""Version counters of buffers, for in-place semantics.

Every buffer the engine writes in place carries a counter, bumped by each
in-place write (as PyTorch's tensor `_version`). A tensor saved for backward
remembers its buffer's version at save time; a different version at load
time means an in-place node overwrote it in between. Views share their base
buffer's counter: the key is the array that owns the memory.
"""
from __future__ import annotations

from .memory import owner


class Versions:
    def __init__(self):
        self._bumped: dict[int, list] = {}  # id(owner) -> [owner, version, [writer node names]]

    def of(self, a) -> int:
        rec = self._bumped.get(id(owner(a)))
        return rec[1] if rec is not None else 0

    def writers(self, a) -> list[str]:
        rec = self._bumped.get(id(owner(a)))
        return list(rec[2]) if rec is not None else []

    def bump(self, a, writer: str) -> int:
        o = owner(a)
        rec = self._bumped.setdefault(id(o), [o, 0, []])  # keeps o alive, so its id stays unique
        rec[1] += 1
        rec[2].append(writer)
        return rec[1]

    def __bool__(self) -> bool:
        return bool(self._bumped)
