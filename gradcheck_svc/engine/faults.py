"""Fault injection: corrupt a cached value between forward and backward.

`--fault z:overwrite:999` replaces every saved copy of z's value -- wherever
the backward pass will read it -- with 999, which is what `tape.z = 999`
does to a hand-written tape: the backward pass runs on and silently produces
a wrong gradient. `--fault z:stale[:STEP]` puts back z's value from an
earlier forward pass, one where every parameter was STEP (default 0.1)
smaller -- a cache left over from the previous training step. The corruption happens through the SavedStore, the same
door the diagnosis layer watches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from .saved import SavedStore

KINDS = ("overwrite", "scale", "zero", "nan", "bitflip", "stale")
STALE_STEP = 0.1


@dataclass(frozen=True)
class Fault:
    node: str
    kind: str
    value: float | None = None

    def __str__(self) -> str:
        return f"{self.node}:{self.kind}" + (f":{self.value:g}" if self.value is not None else "")


def _kind_at(parts: list) -> int:
    """Where KIND is in NODE:KIND[:VALUE] split at ':': before a number (z:overwrite:nan), else last (a:b:zero),
    else second (what the errors name)."""
    n = len(parts)
    if n >= 3 and parts[-2] in KINDS and _number(parts[-1]):
        return n - 2
    if n >= 2 and parts[-1] in KINDS:
        return n - 1
    return 1


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_fault(text: str) -> Fault:
    """NODE:KIND[:VALUE], e.g. z:overwrite:999, a:scale:2, z:nan, w:bitflip:52."""
    parts = text.split(":")
    at = _kind_at(parts)  # NODE may hold ':' (an imported value such as 'dense/BiasAdd:0'): KIND found from the right
    node, kind, rest = ":".join(parts[:at]), parts[at] if at < len(parts) else "", parts[at + 1:]
    if len(parts) < 2 or len(rest) > 1 or not node:
        raise OptionError(f"'{text}' is not NODE:KIND[:VALUE]", field="fault")
    if kind not in KINDS:
        raise OptionError(f"unknown fault kind '{kind}' (expected one of {', '.join(KINDS)})", field="fault")
    value = None
    if rest:
        try:
            value = float(rest[0])
        except ValueError:
            raise OptionError(f"fault value '{rest[0]}' is not a number", field="fault") from None
    if kind == "overwrite" and value is None:
        raise OptionError("fault kind 'overwrite' needs a value, e.g. z:overwrite:999", field="fault")
    if kind == "bitflip" and value is not None and not value.is_integer():
        raise OptionError(f"bitflip needs an integer bit index, got '{parts[2]}'", field="fault")
    return Fault(node, kind, value)


def corrupt(xp, a, fault: Fault, earlier=None):
    """A corrupted copy of array a (stale: `earlier`, the value from an earlier forward)."""
    if a.dtype.kind != "f":
        raise OptionError(f"cannot corrupt '{fault.node}': it holds {a.dtype} values, faults apply to float "
                          "values", field="fault")
    b = a.copy()
    if fault.kind == "stale":
        b[...] = earlier
    elif fault.kind == "overwrite":
        b[...] = fault.value
    elif fault.kind == "scale":
        b *= 2.0 if fault.value is None else fault.value
    elif fault.kind == "zero":
        b[...] = 0
    elif fault.kind == "nan":
        b[...] = np.nan
    elif fault.kind == "bitflip":
        # flip one bit of the first element (default: the lowest exponent bit,
        # which doubles or halves it); VALUE picks the bit index
        bits = b.view(np.uint64 if b.dtype.itemsize == 8 else np.uint32).reshape(-1)
        nbits = b.dtype.itemsize * 8
        bit = int(fault.value) if fault.value is not None else (52 if nbits == 64 else 23)
        if not 0 <= bit < nbits:
            raise OptionError(f"bit {bit} is out of range for {b.dtype}", field="fault")
        if bits.size:
            bits[0] ^= bits.dtype.type(1 << bit)
    return b


@dataclass
class FaultEffect:
    fault: Fault
    readers: list[str]  # nodes whose backward reads the corrupted value
    before: float | None  # one element the fault changed (the first one), before and after
    after: float | None
    index: int | None = None  # its flat index (element 0 when the fault changed nothing)


def inject(xp, store: SavedStore, fault: Fault, to_host, earlier: dict | None = None) -> FaultEffect:
    """Corrupt every saved copy of fault.node's value (one corrupted buffer shared by all readers).

    earlier: values of an earlier forward pass (needed by kind "stale")."""
    replaced: dict[int, object] = {}
    effect = FaultEffect(fault, [], None, None)
    for node, slot in list(store.slots()):
        if slot.source != fault.node:
            continue
        key = id(slot.tensor)
        if key not in replaced:
            replaced[key] = corrupt(xp, slot.tensor, fault, None if earlier is None else earlier[fault.node])
            if effect.before is None and slot.tensor.size:
                a = np.asarray(to_host(slot.tensor)).reshape(-1)
                b = np.asarray(to_host(replaced[key])).reshape(-1)
                # not element 0 blindly: after a ReLU it is often 0, and 0 scaled reads "0.0 -> 0.0"
                changed = np.flatnonzero(~((a == b) | (np.isnan(a) & np.isnan(b))))
                effect.index = int(changed[0]) if changed.size else 0
                effect.before, effect.after = float(a[effect.index]), float(b[effect.index])
        store.replace(node, slot, replaced[key])
        effect.readers.append(node)
    return effect
