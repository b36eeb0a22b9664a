"""The engine-owned store of tensors saved for backward.

Ops declare what their vjp needs (OpDef.save); only the engine keeps it, here.
This single door is where saved tensors are accounted for (activation bytes),
corrupted on request (--fault) and, in the diagnosis layer, fingerprinted and
version-checked -- without touching any op.
"""
from __future__ import annotations

from dataclasses import dataclass

from .memory import MemoryMeter


@dataclass
class Slot:
    tensor: object
    source: str | None  # name of the value this tensor is (an input or output of the node), or None if derived


class SavedStore:
    def __init__(self, live: MemoryMeter):
        self._slots: dict[str, list[Slot]] = {}
        self.saved = MemoryMeter()  # saved activations only
        self.live = live  # every array the engine holds

    def save(self, node: str, tensors, sources) -> None:
        slots = [Slot(t, s) for t, s in zip(tensors, sources)]
        self._slots[node] = slots
        for s in slots:
            self.saved.hold(s.tensor)
            self.live.hold(s.tensor)

    def load(self, node: str) -> tuple:
        return tuple(s.tensor for s in self._slots.get(node, ()))

    def release(self, node: str) -> None:
        for s in self._slots.pop(node, ()):
            self.saved.drop(s.tensor)
            self.live.drop(s.tensor)

    def slots(self):
        """(node, Slot) for every saved tensor."""
        for node, slots in self._slots.items():
            for s in slots:
                yield node, s

    def replace(self, slot: Slot, tensor) -> None:
        for meter in (self.saved, self.live):
            meter.drop(slot.tensor)
            meter.hold(tensor)
        slot.tensor = tensor

    def __len__(self) -> int:
        return len(self._slots)
