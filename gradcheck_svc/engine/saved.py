"""The engine-owned store of tensors saved for backward.

Ops declare what their vjp needs (OpDef.save); only the engine keeps it, here.
This single door is where saved tensors are accounted for (activation bytes),
corrupted on request (--fault), and checked:

- integrity ("check"): each saved tensor is fingerprinted when saved (on the
  device that holds it) and again when the backward pass reads it; a
  difference is recorded as an Event (cache corruption).
- versions: each saved tensor remembers its buffer's version counter; a
  later in-place write bumps it. On load, a changed version whose value
  (fingerprint) also changed -- or is unknown, with integrity off -- is an
  in-place hazard: an InplaceHazardError unless hazards are allowed, in which
  case it is recorded and the backward goes on with the overwritten value,
  exactly as a buggy framework would. A changed version with an unchanged
  value is recorded as safe (e.g. relu_ over a relu's output).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..errors import InplaceHazardError
from .fingerprint import HOST_COPY_UP_TO, HOST_HASH_UP_TO, fingerprint, small_or_hashed_host_fingerprint
from .memory import MemoryMeter, owner
from .versions import Versions

INTEGRITY_MODES = ("off", "check")


def _split(joined: bytes, tensors) -> list[bytes]:
    """The bytes of each tensor, from their concatenation."""
    out, at = [], 0
    for t in tensors:
        out.append(joined[at:at + t.nbytes])
        at += t.nbytes
    return out


class Slot:
    """One saved tensor with what verifying it needs. A plain class with __slots__: runs that
    verify make one per saved tensor."""

    __slots__ = ("tensor", "source", "fingerprint", "buffer", "version")

    def __init__(self, tensor, source: str | None):
        self.tensor = tensor
        self.source = source  # name of the value this tensor is (an input or output of the node), or None if derived
        self.fingerprint: tuple | None = None  # taken at save time (integrity "check")
        self.buffer = None  # the array owning the memory, for its version counter
        self.version = 0  # the buffer's version at save time


@dataclass
class Event:
    """A saved tensor that is not what was saved, found when the backward read it."""

    kind: str  # "corruption" (fingerprint changed, version did not) | "inplace" (version changed)
    node: str  # the node that saved it, whose backward read it
    slot: int  # index among the node's saved tensors
    source: str | None  # the value it is (None: a tensor derived by the op's save)
    tensor: object  # what the backward read
    value_changed: bool | None  # None: unknown (integrity off)
    saved_version: int = 0
    version: int = 0
    writers: tuple[str, ...] = ()  # in-place nodes that wrote the buffer


class SavedStore:
    def __init__(self, live: MemoryMeter, xp=None, integrity: str = "off", versions: Versions | None = None,
                 allow_inplace_hazards: bool = False):
        self._tensors: dict[str, tuple] = {}  # node -> its saved tensors, as its vjp reads them
        self._sources: dict[str, tuple] = {}  # node -> (names, ids) the value each tensor is comes from (_source)
        # node -> its Slots. Made at save time when a run verifies (fingerprints, versions);
        # otherwise only if asked for (slots(): fault injection), as most runs never need them.
        self._slots: dict[str, list[Slot]] = {}
        self._prints: dict[str, tuple] = {}  # node -> save-time fingerprints, integrity without versions
        self.live = live  # every array the engine holds
        self.saved = live.saved  # saved activations only (kept by live.hold_saved/drop_saved)
        self.xp = xp
        self.check = integrity == "check"
        self._host = xp is not None and xp.__name__ == "numpy"  # small host arrays: small_host_fingerprint
        self.versions = versions
        self.allow_inplace_hazards = allow_inplace_hazards
        self.events: list[Event] = []
        self._taken: dict[int, tuple] = {}  # id(tensor) -> (weakref, version, fingerprint): one per buffer state
        self._read: dict[int, tuple] = {}  # id(tensor) -> (weakref, fingerprint) as first read by the backward

    def save(self, node: str, tensors, names: tuple, ids: list) -> None:
        """Keep a node's saved tensors. names: the values a saved tensor may be (the node's output,
        then its inputs); ids: their id()s now. A tensor's source (the value it is) is resolved from
        these only when asked for (Slots, Events): most runs never ask, and the ids stay right while
        the store keeps the tensor alive."""
        self._tensors[node] = tensors = tuple(tensors)
        self._sources[node] = (names, ids)
        if self.versions is not None:
            for s in self._slots_of(node):
                s.buffer = owner(s.tensor)
                s.version = self.versions.of(s.buffer)
                if self.check:
                    s.fingerprint = self._fingerprint(s.tensor, s.version)
        elif self.check:
            # no versions to follow (no in-place node): the fingerprints alone, no Slot objects --
            # graphs of many small ops save a few tiny tensors per step, and per-tensor Python
            # objects cost more than their fingerprints. Small host tensors are kept as their bytes,
            # all of a node's in one bytes object (load then compares them in one memcmp, no loop):
            # load compares the very arrays saved here -- only Slots can swap them -- so their
            # shapes, dtypes and sizes cannot differ, only their values.
            prints, size = None, 0
            for t in tensors:  # (a loop costs half of sum(map(...)) for the usual one or two tensors)
                size += t.nbytes
            if self._host and size <= HOST_COPY_UP_TO:
                try:
                    prints = b"".join(tensors)  # (their C-order bytes, as tobytes)
                except TypeError:  # join's error for a buffer it cannot take whole (a view that is
                    pass  # not C-contiguous): one by one below
            if prints is None:
                fp, small = self._fingerprint, HOST_COPY_UP_TO if self._host else -1
                prints = tuple([t.tobytes() if t.nbytes <= small else fp(t, 0) for t in tensors])
            self._prints[node] = prints
        self.live.hold_saved(tensors)

    def _source(self, node: str, k: int) -> str | None:
        """The value the node's k-th saved tensor is (an input or its output), None if derived."""
        names, ids = self._sources[node]
        key = id(self._tensors[node][k])
        return names[ids.index(key)] if key in ids else None

    def _slots_of(self, node: str) -> list[Slot]:
        slots = self._slots.get(node)
        if slots is None:
            tensors = self._tensors[node]
            slots = self._slots[node] = [Slot(t, self._source(node, k)) for k, t in enumerate(tensors)]
            prints = self._prints.pop(node, None)  # taken at save time: the Slots carry them from now on
            if type(prints) is bytes:  # the node's small tensors joined: split back, one print each
                prints = _split(prints, tensors)
            if prints is not None:
                for s, p in zip(slots, prints):  # in the form _verify compares (small_host_fingerprint's)
                    s.fingerprint = (p, 0, s.tensor.shape, str(s.tensor.dtype)) if type(p) is bytes else p
        return slots

    def _fingerprint(self, t, version: int) -> tuple:
        """A tensor saved by several nodes (a weight, a shared activation) is fingerprinted once
        per version: the first fingerprint is what later saves must match anyway."""
        if self._host and t.nbytes <= HOST_HASH_UP_TO:  # cheaper than the cache's lookup (and weakref)
            return small_or_hashed_host_fingerprint(t)
        hit = self._taken.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == version:
            return hit[2]
        fp = fingerprint(self.xp, t)
        try:
            self._taken[id(t)] = (weakref.ref(t), version, fp)
        except TypeError:  # not weak-referenceable: just don't cache
            pass
        return fp

    def _fingerprint_read(self, t) -> tuple:
        """Nothing writes a tensor during the backward pass, so a tensor read by several steps (a
        weight used in many places) is fingerprinted on its first read only."""
        if self._host and t.nbytes <= HOST_HASH_UP_TO:
            return small_or_hashed_host_fingerprint(t)
        hit = self._read.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        fp = fingerprint(self.xp, t)
        try:
            self._read[id(t)] = (weakref.ref(t), fp)
        except TypeError:
            pass
        return fp

    def rebind(self, node: str, old, new) -> None:
        """The node's output was written in place into `new` (its first input's buffer):
        saved references to the fresh output now refer to that buffer at its new version."""
        for s in self._slots.get(node, ()):
            if s.tensor is old:
                self.live.drop_saved((old,))
                s.tensor = new
                s.buffer = owner(new)
                s.version = self.versions.of(new)
                self.live.hold_saved((new,))
        self._retensor(node)

    def _retensor(self, node: str) -> None:
        """After a slot's tensor was swapped: the tuple the vjp reads follows its Slots."""
        if node in self._slots:
            self._tensors[node] = tuple([s.tensor for s in self._slots[node]])

    def load(self, node: str) -> tuple:
        prints = self._prints.get(node)
        if prints is not None:  # the fast path of save: compare fingerprints, record a corruption
            tensors = self._tensors[node]
            if type(prints) is bytes:  # all small: one comparison, then per tensor only if it differs
                if b"".join(tensors) == prints:
                    return tensors
                prints = _split(prints, tensors)
            for k, t in enumerate(tensors):
                p = prints[k]
                same = p == t.tobytes() if type(p) is bytes else self._fingerprint_read(t) == p
                if not same:
                    self.events.append(Event("corruption", node, k, self._source(node, k), t, True))
            return tensors
        if self.check or self.versions:
            for k, s in enumerate(self._slots.get(node, ())):
                self._verify(node, k, s)
        return self._tensors.get(node, ())

    def _verify(self, node: str, k: int, s: Slot) -> None:
        changed = None
        if self.check and s.fingerprint is not None:
            changed = self._fingerprint_read(s.tensor) != s.fingerprint
        version = self.versions.of(s.buffer) if self.versions is not None and s.buffer is not None else s.version
        if version != s.version:
            writers = tuple(self.versions.writers(s.buffer))
            if changed is not False and not self.allow_inplace_hazards:
                what = f"'{s.source}'" if s.source else f"saved tensor {k}"
                raise InplaceHazardError(
                    f"a value needed for its gradient has been modified by an inplace operation: {what} was "
                    f"saved at version {s.version} and is now at version {version}, written in place by node "
                    f"'{writers[-1] if writers else '?'}' (allow_inplace_hazards computes the gradient anyway)",
                    node=node)
            self.events.append(Event("inplace", node, k, s.source, s.tensor, changed, s.version, version, writers))
        elif changed:
            self.events.append(Event("corruption", node, k, s.source, s.tensor, True, s.version, version))

    def release(self, node: str) -> None:
        tensors = self._tensors.pop(node, None)
        if tensors is not None:
            del self._sources[node]
            self._slots.pop(node, None)
            self._prints.pop(node, None)
            self.live.drop_saved(tensors)

    def saved_by_node(self) -> dict[str, int]:
        """Bytes of the activations held for backward now, each buffer attributed to the first
        node (in save order) that saved it; graph inputs left out, as in `saved`."""
        seen, out, excluded = set(), {}, self.live._excluded
        for node, tensors in self._tensors.items():
            total = 0
            for t in tensors:
                o = owner(t)
                key = id(o)
                if key not in seen and key not in excluded:
                    seen.add(key)
                    total += o.nbytes
            if total:
                out[node] = total
        return out

    def slots(self):
        """(node, Slot) for every saved tensor."""
        for node in list(self._tensors):
            for s in self._slots_of(node):
                yield node, s

    def replace(self, node: str, slot: Slot, tensor) -> None:
        """Swap one of a node's slots' tensor (fault injection): its fingerprint and version stay
        those taken at save time."""
        self.live.drop_saved((slot.tensor,))
        self.live.hold_saved((tensor,))
        slot.tensor = tensor
        self._retensor(node)

    def __len__(self) -> int:
        return len(self._tensors)


class CountingStore:
    """The store of a metering forward (executor.forward(metering=True)): it counts what a
    gradient run would save (MeteringMeter pins the bytes) and keeps nothing, so no backward
    can follow it."""

    check = False
    versions = None
    events: list = []

    def __init__(self, live):
        self.live = live
        self.saved = live.saved
        self.pins: dict[str, list] = {}  # node -> [(token, bytes first counted by it)] (MeteringMeter.pin)
        self.value_tokens: dict[str, int] = {}  # value name -> the token of its buffer, where saved as it is

    def save(self, node: str, tensors, names, ids) -> None:
        pins = self.live.pin(tensors)
        for t, (token, _) in zip(tensors, pins):
            if token is not None and id(t) in ids:
                self.value_tokens.setdefault(names[ids.index(id(t))], token)
        self.pins[node] = [p for p in pins if p[0] is not None]

    def saved_by_node(self) -> dict[str, int]:
        """As SavedStore.saved_by_node, for the run this forward meters."""
        out = {node: sum(b for _, b in pins) for node, pins in self.pins.items()}
        return {node: b for node, b in out.items() if b}

    def __len__(self) -> int:
        return 0
