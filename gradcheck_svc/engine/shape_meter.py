"""A metering forward from shapes alone: what a gradient run's forward would hold and save,
counted without computing or allocating any activation (`plan-memory --shapes-only`, and
automatically for a model whose forward would not fit this process).

It mirrors the metering forward (executor.forward(metering=True), MeteringMeter, CountingStore)
step for step, with a *stand-in* per value instead of its array: a zero-stride view
(np.broadcast_to of a 0-d array, no memory) with the value's static shape and dtype (from
validation's shape inference), one 0-d array per buffer, so that "which buffer" is an identity
test as in the real run. Per step:

- the output is a buffer of its own, of the spec's bytes; but a layout op (ops/shape.py: reshape,
  transpose, slice, squeeze, ...) runs on the stand-ins -- views of a zero-stride array stay views
  and cost nothing -- and an output that is a view of an input's buffer shares that buffer, as in
  NumPy; layout ops whose output would be a fresh array over LAYOUT_RUN_BYTES are not run (their
  output counts as a buffer of its own);
- what the step saves comes from its OpDef's save rule, called on the stand-ins: a saved input or
  output is that value's buffer, anything else (a tensor the rule derives) counts its own bytes; a
  rule that cannot run on stand-ins counts the conservative bound, all its inputs and its output.

Exact where NumPy's view rules follow the stand-ins': a reshape of a non-contiguous value copies in
a real run but is a view of the zero-stride stand-in, so it shares a buffer here (tests compare the
figures with the metering forward's on the bundled examples).
"""
from __future__ import annotations

import itertools

import numpy as np

from .memory import Tally, owner

LAYOUT_RUN_BYTES = 1 << 20  # a layout op whose output may be a fresh array is run on stand-ins up to this size
_LAYOUT_MODULE = "gradcheck_svc.ops.shape"


class ShapeMeter:
    """MeteringMeter's counting, over buffer keys (the stand-ins' 0-d bases) instead of arrays."""

    def __init__(self):
        self.bytes: dict[int, int] = {}  # key -> bytes of the buffer
        self.bases: dict[int, np.ndarray] = {}  # key -> its 0-d array (kept alive: ids stay unique)
        self.refs: dict[int, int] = {}
        self.pinned: dict[int, int] = {}  # key -> token
        self.excluded: set[int] = set()
        self.current = 0
        self.peak = 0
        self.saved = Tally()
        self.token_bytes: dict[int, int] = {}
        self._tokens = itertools.count()

    def buffer(self, shape: tuple, dtype) -> np.ndarray:
        """A stand-in for a fresh buffer of this shape and dtype."""
        base = np.zeros((), dtype=dtype)
        key = id(base)
        self.bases[key] = base
        self.bytes[key] = int(np.prod(shape, dtype=np.int64)) * base.itemsize
        return np.broadcast_to(base, shape)

    def key(self, a) -> int | None:
        k = id(owner(a))
        return k if k in self.bases else None

    def _grow(self, n: int) -> None:
        self.current += n
        if self.current > self.peak:
            self.peak = self.current

    def hold(self, key: int) -> None:
        if key in self.refs:
            self.refs[key] += 1
            return
        self.refs[key] = 1
        if key not in self.pinned:
            self._grow(self.bytes[key])

    def drop(self, key: int) -> None:
        if self.refs[key] == 1:
            del self.refs[key]
            if key not in self.pinned:
                self.current -= self.bytes[key]
        else:
            self.refs[key] -= 1

    def pin(self, keys) -> list[tuple[int | None, int]]:
        out = []
        for key in keys:
            token = self.pinned.get(key)
            if token is not None:
                out.append((token if token in self.token_bytes else None, 0))
                continue
            token = self.pinned[key] = next(self._tokens)
            if key in self.excluded:
                out.append((None, 0))
            else:
                b = self.token_bytes[token] = self.bytes[key]
                self.saved.current += b
                self.saved.peak = max(self.saved.peak, self.saved.current)
                out.append((token, b))
            if key not in self.refs:  # a tensor derived by the op's save
                self._grow(self.bytes[key])
        return out


class ShapeStore:
    """CountingStore's record (pins per node, tokens of saved values) for a ShapeMeter."""

    def __init__(self, live: ShapeMeter):
        self.live = live
        self.saved = live.saved
        self.pins: dict[str, list] = {}
        self.value_tokens: dict[str, int] = {}

    def saved_by_node(self) -> dict[str, int]:
        out = {node: sum(b for _, b in pins) for node, pins in self.pins.items()}
        return {node: b for node, b in out.items() if b}


class ShapeTape:
    """What plan-memory and the budget planner read from a metering forward."""

    def __init__(self, live: ShapeMeter, store: ShapeStore, input_bytes: dict, input_elements: dict):
        self.live, self.store = live, store
        self.input_bytes, self.input_elements = input_bytes, input_elements


def _dtype(program, spec_dtype: str):
    return program.float_dtype if spec_dtype == "float" else np.dtype(spec_dtype)


def shape_forward(program) -> ShapeTape:
    """The metering forward of `program`'s plain gradient run, from shapes (module docstring)."""
    live = ShapeMeter()
    store = ShapeStore(live)
    values, input_bytes, input_elements = {}, {}, {}
    for name, gi in program.graph.inputs.items():
        dtype = program.float_dtype if gi.declared_dtype.startswith("float") else np.asarray(gi.value).dtype
        shape = tuple(np.shape(gi.value))
        values[name] = v = live.buffer(shape, dtype)
        key = live.key(v)
        input_bytes[name], input_elements[name] = live.bytes[key], int(np.prod(shape, dtype=np.int64))
        live.excluded.add(key)
        live.hold(key)
    for step in program.steps:
        xs = [values[n] for n in step.inputs]
        spec = program.graph.specs[step.name]
        y = _layout_output(program, live, step, xs, spec) if step.op.forward.__module__ == _LAYOUT_MODULE else None
        if y is None:
            y = live.buffer(spec.shape, _dtype(program, spec.dtype))
        if step.needs_grad and step.save is not None:
            _save(live, store, step, xs, y)
        values[step.name] = y
        live.hold(live.key(y))
        for name in step.release:
            live.drop(live.key(values.pop(name)))
    return ShapeTape(live, store, input_bytes, input_elements)


def _layout_output(program, live: ShapeMeter, step, xs, spec):
    """The output stand-in of a layout op when it is a view of an input's buffer, else None."""
    if int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(_dtype(program, spec.dtype)).itemsize > LAYOUT_RUN_BYTES \
            and not _at_most_input(xs, spec):
        return None
    try:
        y = step.op.forward(np, *xs, **step.attrs)
    except Exception:  # noqa: BLE001 -- not runnable on stand-ins: a buffer of its own
        return None
    if isinstance(y, np.ndarray) and live.key(y) is not None and tuple(y.shape) == tuple(spec.shape):
        return y
    return None


def _at_most_input(xs, spec) -> bool:
    """A one-input layout op whose output has no more elements than its input (reshape,
    transpose, slice, squeeze) is a view of a stand-in, or at worst a copy of one value's size."""
    return len(xs) == 1 and int(np.prod(spec.shape, dtype=np.int64)) <= xs[0].size


def _save(live: ShapeMeter, store: ShapeStore, step, xs, y) -> None:
    try:
        sa = step.save_attrs
        saved = tuple(step.save(xs, y, **sa) if sa else step.save(xs, y))
    except Exception:  # noqa: BLE001 -- the conservative bound: every input and the output
        saved = (y, *xs)
    if not saved:
        return
    keys = []
    for t in saved:
        key = live.key(t)
        if key is None:  # derived by the save rule: a buffer of its own
            key = live.key(live.buffer(np.shape(t), np.asarray(t).dtype if hasattr(t, "dtype") else np.float64))
        keys.append(key)
    pins = live.pin(keys)
    ids = [id(y), *map(id, xs)]
    for t, (token, _) in zip(saved, pins):
        if token is not None and id(t) in ids:
            store.value_tokens.setdefault(step.value_names[ids.index(id(t))], token)
    store.pins[step.name] = [p for p in pins if p[0] is not None]
