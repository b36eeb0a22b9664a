"""The tape executor: forward in topological order, backward in reverse.

micrograd's idea at graph scale: forward evaluates each node and, when a
gradient is wanted, hands what the node's vjp will need to the SavedStore;
backward walks the steps in reverse from dL/dL = 1, calls each vjp, sums the
gradient back to each input's shape (the one place broadcasting is undone)
and accumulates over consumers. Saved tensors and adjoints are released as
soon as their step is done.

`forward_batched` evaluates the part of the graph downstream of some values
with a leading batch axis on them -- the finite-difference oracle's stacked
perturbations -- reusing every other value from a base evaluation; a stack
given as one changed slice per copy (ops/slices.py) stays that way through
the ops that can keep it. With `frozen` (selections of the base) it evaluates each piecewise op
on the piece the base took (OpDef.select / frozen): the finite differences' frozen branches.

In-place nodes (graph/inplace.py) really write into their first input's
buffer in a gradient run, bumping its version counter (versions.py), so a
saved tensor can be overwritten exactly as in an eager framework; the store
catches it when the backward reads it. keep_values runs (the oracles'
reference evaluations) compute the same values out of place.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ..backend import Backend
from ..errors import GraphError, OptionError
from ..ops.slices import Sliced
from ..ops.slices import elementwise as slices_elementwise
from ..ops.slices import independent_frozen
from .memory import MemoryMeter, MeteringMeter
from .observers import AdjointRecorder, MemoryAccounting
from .program import Program, Step
from .saved import CountingStore, SavedStore
from .versions import Versions


def fit(xp, g, shape: tuple):
    """Sum a gradient back to the shape of the input it belongs to (undo broadcasting)."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    if g.shape != shape:
        g = xp.broadcast_to(g, shape)
    return g


def _quiet(xp):
    """NaN/Inf are reported by the verifier, not as NumPy RuntimeWarnings."""
    return np.errstate(all="ignore") if xp is np else contextlib.nullcontext()


def run_step(xp, step: Step, xs: list):
    try:
        y = step.op.forward(xp, *xs, **step.attrs)
    except (IndexError, ValueError) as exc:  # data-dependent errors, e.g. an index out of range
        raise op_failed(step, exc) from None
    return y if type(y) is xp.ndarray else xp.asarray(y)  # the type test is cheaper than asarray's no-op


def op_failed(step: Step, exc: Exception) -> GraphError:
    return GraphError(f"op '{step.op.name}' failed: {str(exc).splitlines()[0]}", node=step.name)


@dataclass
class Tape:
    """What a forward pass leaves for the backward pass."""

    program: Program
    backend: Backend
    loss: object  # device scalar
    store: SavedStore | None
    live: MemoryMeter
    op_evaluations: int = 0
    values: dict = field(default_factory=dict)  # all values, only when keep_values
    checkpoint: object = None  # checkpoint.CheckpointRun when a checkpoint plan is in force
    adjoints: dict = field(default_factory=dict)  # dL/dv per value, only when backward(keep_adjoints=True)
    contributions: dict = field(default_factory=dict)  # (step name, input index) -> that vjp's gradient
    saved_by_node: dict = field(default_factory=dict)  # node -> activation bytes it saved (memory profile)
    inference: object = None  # forward(inference_twin=True): the twin MemoryMeter (a no-grad run's figures)


def prepare_feeds(program: Program, backend: Backend, overrides: dict | None = None) -> dict:
    """Graph input values on the backend, float inputs cast to the run's dtype."""
    feeds = {}
    for name, gi in program.graph.inputs.items():
        value = overrides.get(name, gi.value) if overrides else gi.value
        if gi.declared_dtype.startswith("float"):
            value = np.asarray(value, dtype=program.float_dtype)
        if name in program.aliased:  # written in place: never into the graph's own array
            value = np.array(value, copy=True)
        feeds[name] = backend.xp.asarray(value)
    return feeds


def forward(program: Program, backend: Backend, feeds: dict, *, grad: bool = True,
            keep_values: bool = False, record_timeline: bool = False, checkpoint=None,
            integrity: str = "off", allow_inplace_hazards: bool = False, metering: bool = False,
            inference_twin: bool = False) -> Tape:
    """checkpoint: a checkpoint.Plan; its non-final segments save nothing and are recomputed
    during backward (ignored when grad is False: inference saves nothing anyway).
    integrity: "off" | "check" (fingerprint saved tensors, verify them when backward reads them).
    metering: count the memory a gradient run's forward would hold (saved tensors included)
    without keeping what it saves; no backward can follow (not for graphs with in-place nodes).
    inference_twin: also count what a no-grad forward would hold (tape.inference: a second MemoryMeter,
    its timeline, in place of running one; counted bytes only, not with a device sampler)."""
    xp = backend.xp
    writes = bool(program.inplace_root) and not keep_values
    live, store, versions = _meter_and_store(program, backend, grad, record_timeline, checkpoint, integrity,
                                             allow_inplace_hazards, metering, writes)
    twin = MemoryMeter(record_timeline=True) if inference_twin else None
    # hot loop: locals, and run_step inlined (a call per step costs as much as the small ops' work)
    hold, drop, marks, release = live.hold, live.drop, live.marks, not keep_values
    if twin is not None:  # the loop's own holds, drops (and marks), and only those, are a no-grad run's meter's
        hold, drop = _both(hold, twin.hold), _both(drop, twin.drop)
    values = dict(feeds)
    for v in feeds.values():
        hold(v)
    live.calibrate()
    if store is not None:
        live.exclude_saved(feeds.values())  # graph inputs are parameters and data, not activations
    ckpt = checkpoint.start(xp, live, store, feeds) if grad and checkpoint is not None else None
    ndarray, saving, aliased = xp.ndarray, store is not None, program.aliased
    with _quiet(xp):
        for step in program.steps:
            xs = [values[n] for n in step.inputs]
            try:
                y = step.op.forward(xp, *xs, **step.attrs)
            except (IndexError, ValueError) as exc:  # as run_step
                raise op_failed(step, exc) from None
            if type(y) is not ndarray:
                y = xp.asarray(y)
            if writes and (step.name in aliased or any(n in aliased for n in step.inputs)):
                y = _private(y, xs)
            if saving and step.needs_grad and step.save is not None and (ckpt is None or ckpt.saves(step)):
                save_for_backward(store, step, xs, y)
            if writes and step.inplace:
                y = _write_in_place(xp, step, xs[0], y, store, versions)
            values[step.name] = y
            hold(y)
            if ckpt is not None:
                ckpt.forwarded(step, y)
            if release:
                for name in step.release:
                    drop(values.pop(name))
            if marks:
                live.mark("forward", step.name)
            if twin is not None:
                twin.mark("forward", step.name)
    tape = Tape(program, backend, values[program.output], store, live, len(program.steps), checkpoint=ckpt,
                inference=twin)
    if keep_values:
        tape.values = values
    return tape


def _meter_and_store(program, backend, grad, record_timeline, checkpoint, integrity, allow_inplace_hazards,
                     metering, writes):
    """forward's meter, saved-tensor store (None without a gradient) and version counters (None
    without in-place writes)."""
    if metering:
        if writes or checkpoint is not None or not grad:
            raise ValueError("a metering forward is a plain gradient forward of a graph without in-place nodes")
        live = MeteringMeter(record_timeline)
    else:
        live = MemoryMeter(record_timeline, backend.memory_sampler())
    if writes and grad and checkpoint is not None:
        raise OptionError("checkpointing a graph with in-place nodes is not supported", field="checkpoint")
    versions = Versions() if writes else None
    store = (CountingStore(live) if metering else SavedStore(live, backend.xp, integrity, versions,
                                                              allow_inplace_hazards)) if grad else None
    return live, store, versions


def _both(first, second):
    """One call that makes two (the forward loop's hold or drop, with the inference twin)."""
    def both(a):
        first(a)
        second(a)
    return both


def save_for_backward(store: SavedStore, step: Step, xs, y) -> None:
    """Hand what the step's vjp needs to the store (the first forward or a checkpoint recompute)."""
    save = step.save
    if save is not None:  # (None: the op saves nothing, e.g. add, reshape)
        sa = step.save_attrs
        saved = save(xs, y, **sa) if sa else save(xs, y)  # (as backward's vjp call)
        if saved:
            store.save(step.name, saved, step.value_names, [id(y), *map(id, xs)])


def _private(y, xs):
    """A buffer of its own for a value that shares memory with an in-place write (a view or
    an input returned as is), so the write changes exactly the values that name its buffer."""
    if getattr(y, "base", None) is not None or any(y is x for x in xs) or not getattr(y.flags, "writeable", True):
        return y.copy()
    return y


def _write_in_place(xp, step: Step, buf, y, store, versions):
    """Write y into buf (the first input's buffer) and bump its version."""
    buf[...] = y
    versions.bump(buf, step.name)
    if store is not None and step.needs_grad:
        store.rebind(step.name, y, buf)
    return buf


def backward(tape: Tape, keep_adjoints: bool = False, observer=None) -> dict:
    """dL/dp for every parameter, as device arrays (zeros if the loss does not depend on p).

    The chain rule only: from dL/dL = 1, each step in reverse hands its adjoint to its vjp, and each
    input's contribution, summed back to the input's shape, is added to that input's adjoint. Everything
    else is the observer's (observers.py): the live-memory accounting the memory profile reads by default;
    with keep_adjoints, also every value's dL/dv (tape.adjoints) and each vjp's contribution to each input
    (tape.contributions), for fault localization. A checkpoint plan recomputes a segment's saved tensors
    as its backward begins; a step's saved tensors are released once its vjp has run."""
    program, xp, store, ckpt = tape.program, tape.backend.xp, tape.store, tape.checkpoint
    watch = observer or (AdjointRecorder if keep_adjoints else MemoryAccounting)(tape)
    ndarray, accumulated, stepped = xp.ndarray, watch.accumulated, watch.stepped  # hot loop: locals
    adj = {program.output: xp.ones_like(tape.loss)}
    watch.seeded(adj[program.output])
    with _quiet(xp):
        for step in reversed(program.steps):
            if ckpt is not None:
                ckpt.before_backward(step)  # entering a checkpointed segment: recompute its saves
            if not step.needs_grad:
                continue
            g = adj.pop(step.name, None)
            if g is not None:
                saved = store.load(step.name) if step.save is not None else ()
                va = step.vjp_attrs  # (most steps have none: a call without ** is the cheaper call)
                grads = step.op.vjp(xp, g, saved, **va) if va else step.op.vjp(xp, g, saved)
                for k, name, shape in step.grad_targets:
                    gi = grads[k]
                    if gi is None:
                        continue
                    if type(gi) is not ndarray:  # (the tests are cheaper than the calls they skip)
                        gi = xp.asarray(gi)
                    if gi.shape != shape:
                        gi = fit(xp, gi, shape)
                    prev = adj.get(name)
                    adj[name] = acc = gi if prev is None else prev + gi
                    accumulated(step, k, name, gi, prev, acc)
            if step.save is not None:  # (else the store holds nothing for it)
                store.release(step.name)
            stepped(step, g)
    if ckpt is not None:
        tape.op_evaluations += ckpt.evaluations
    grads = {p: adj[p] if p in adj else xp.zeros(program.shapes[p], dtype=program.float_dtype)
             for p in program.params}
    watch.finished(grads)
    return grads


def run_step_batched(xp, step: Step, xs: list, is_batched: list):
    """Evaluate one step on inputs of which some carry a leading batch axis."""
    if step.op.broadcast:
        # align ranks after the batch axis so broadcasting pairs the right dimensions
        rank = max(step.in_ranks)
        xs = [x.reshape(x.shape[:1] + (1,) * (rank - r) + x.shape[1:]) if b and r < rank else x
              for x, b, r in zip(xs, is_batched, step.in_ranks)]
    return run_step(xp, step, xs)


def selections(program: Program, xp, values: dict) -> dict:
    """Frozen branches: for each step of a piecewise op, the piece it took at `values` (a keep_values
    forward), as selection_of gives it. What forward_batched(frozen=...) evaluates the perturbed copies on."""
    out = {}
    with _quiet(xp):
        for step in program.steps:
            if step.op.held or step.op.select is not None:
                piece = selection_of(xp, step, [values[n] for n in step.inputs])
                if piece is not None:
                    out[step.name] = piece
    return out


def selection_of(xp, step: Step, xs: list):
    """The piece of a piecewise op at inputs xs: OpDef.select's selection, HELD where the op's output is
    piecewise constant (held at its value), None where nothing is frozen -- an op that is not piecewise,
    or an input that is not finite (its ordinary forward carries the NaN or infinity, as the verifier
    expects)."""
    if not (step.op.held or step.op.select is not None):
        return None
    with _quiet(xp):
        if not all(bool(xp.isfinite(x).all()) for x in xs if x.dtype.kind == "f"):
            return None
        return HELD if step.op.held else step.op.select(xp, *xs, **step.attrs)


HELD = object()  # a frozen step whose output keeps its unperturbed value


def frozen_step(xp, step: Step, selection, xs: list, batched: list, base_out=None):
    """The step on its frozen piece: OpDef.frozen with the selection. Elementwise ops keep a one-slice
    change to one slice, the selection entering as one more (unbatched) input, and so do ops that map
    slices each on their own (pooling, max/min: slices.independent_frozen); others densify."""
    op = step.op
    sliced = all(isinstance(x, Sliced) for x, b in zip(xs, batched) if b)
    if base_out is not None and sliced:
        y = None
        if op.slice_rule is slices_elementwise:
            y = slices_elementwise(xp, _Piece(op.frozen), [selection, *xs], base_out, step.attrs)
        elif hasattr(op.slice_rule, "out_axis") and len(xs) == 1:
            y = independent_frozen(xp, op, selection, xs[0], base_out, step.attrs)
        if y is not None:
            return y
    xs = [x.dense(xp) if isinstance(x, Sliced) else x for x in xs]
    if op.broadcast:  # as run_step_batched: ranks aligned after the batch axis
        rank = max(step.in_ranks)
        xs = [x.reshape(x.shape[:1] + (1,) * (rank - r) + x.shape[1:]) if b and r < rank else x
              for x, b, r in zip(xs, batched, step.in_ranks)]
    return op.frozen(xp, selection, *xs, **step.attrs)


@dataclass(frozen=True)
class _Piece:
    """An op-like stand-in whose forward is a frozen piece (what slices.elementwise calls)."""

    forward: object


@dataclass(frozen=True)
class Pair:
    """A complex-step value carried as its imaginary part alone, (B, *shape) real, its real part the base's
    value (unbatched, shared by every copy): what multilinear ops (multilinear_step) and linear frozen pieces
    (OpDef.frozen_linear) pass on to each other without a complex copy; dense() for any other op."""

    real: object
    imag: object

    @property
    def nbytes(self) -> int:
        return self.imag.nbytes

    def dense(self, xp):
        out = xp.empty(self.imag.shape, dtype=xp.result_type(self.imag.dtype, xp.complex64))
        out.real = self.real
        out.imag = self.imag
        return out


def forward_batched(program: Program, backend: Backend, base: dict, overrides: dict, stats: dict | None = None,
                    frozen: dict | None = None, complex_steps: bool = False, slopes=None):
    """Loss values for a stack of perturbed inputs.

    overrides: name -> the B perturbed copies replacing that value, as an array (B, *shape) or as
    a Sliced stack (ops/slices.py: one changed slice per copy). Only the steps downstream of them
    are evaluated, each with the leading batch axis; all other values come from `base` (a
    keep_values forward). A step whose batched inputs are all Sliced and whose op has a slice rule
    (OpDef.slice_rule) gets them as they are; any other step, or one whose rule declines (None),
    gets them densified and runs batched. Returns the loss with shape (B,). stats: receives
    "row_bytes", the bytes per copy of every batched value made (the overrides included): what one
    copy costs; and "peak_bytes", the most bytes per copy held at once (the overrides included): what
    sizes the next chunk. frozen: selections(program, ...) of the base -- each piecewise step is
    evaluated on the piece it took there (OpDef.frozen), a HELD one keeps its base value.
    Each batched value is released after its last consumer ran, as forward() does for inference (a
    chunk of whole-graph copies held every one of them to the end: the joint screen's peak).
    complex_steps: the overrides are complex steps, x + i h v with x the base's value (oracles/fd_complex.py),
    so multilinear ops and linear frozen pieces may run on (real, imaginary) pairs (multilinear_step, Pair),
    the base's output standing for every copy's real part; arbitrary complex copies are evaluated as given.
    slopes (complex steps only; oracles/fd_complex.Slopes): each elementwise op's slope in each input at the base,
    by a complex step of its own forward -- where Pairs reach an elementwise op it passes them on linearized
    (elementwise_step), rather than as dense complex copies."""
    xp = backend.xp
    values = dict(overrides)  # the batched values only; the rest come from base
    frozen = frozen or {}
    made = live = peak = 0  # bytes of the batched values made (stats), released or not; held; held at most
    with _quiet(xp):
        for step in program.steps[program.start_of(overrides):]:  # none before reads a batched value
            batched = [n in values for n in step.inputs]
            if not any(batched):
                continue
            y = _batched_step(xp, step, values, base, batched, frozen.get(step.name), complex_steps, slopes)
            if y is not None:
                values[step.name] = y
                made, live = made + _nbytes(y), live + _nbytes(y)
                peak = max(peak, live)
            for name in step.release:
                if name != program.output and name not in overrides and name in values:
                    live -= _nbytes(values.pop(name))
    if program.output in values:
        out = values[program.output]
    elif frozen:  # every path to the loss passes a HELD value: each copy has the base's loss
        first = next(iter(overrides.values()))
        out = xp.broadcast_to(xp.reshape(base[program.output], (1,)), (len(first.imag if isinstance(first, Pair)
                                                                          else first),))
    else:
        raise ValueError("overrides do not reach the output")
    if isinstance(out, (Sliced, Pair)):
        out = out.dense(xp)
    if stats is not None:
        given = sum(_nbytes(v) for v in overrides.values())
        stats["row_bytes"] = (made + given) // max(1, len(out))
        stats["peak_bytes"] = (peak + given) // max(1, len(out))
    return out.reshape(out.shape[0])


def _nbytes(v) -> int:
    """Bytes a batched value holds (a Sliced stack: its changed slices)."""
    return (v.values if isinstance(v, Sliced) else v).nbytes


def _batched_step(xp, step: Step, values: dict, base: dict, batched: list, selection, pairs: bool = False,
                  slopes=None):
    """One step of forward_batched on its batched inputs (values) and the base's others; None for a HELD
    step (its base value stands for every copy). slopes: see forward_batched."""
    xs = [values[n] if b else base[n] for n, b in zip(step.inputs, batched)]
    if selection is HELD:
        return None
    if any(isinstance(x, Pair) for x in xs):
        if selection is not None and step.op.frozen_linear and len(xs) == 1:  # the piece on Im x alone
            return Pair(base[step.name], frozen_step(xp, step, selection, [xs[0].imag], batched))
        if selection is None and (step.op.multilinear or step.op.linear):
            y = (multilinear_step if step.op.multilinear else linear_step)(xp, step, xs, batched, base)
            if y is not None:
                return y
        if selection is None and slopes is not None and step.op.slice_rule is slices_elementwise:
            y = elementwise_step(xp, step, xs, batched, base, slopes)
            if y is not None:
                return y
        xs = [x.dense(xp) if isinstance(x, Pair) else x for x in xs]
    if selection is not None:
        return frozen_step(xp, step, selection, xs, batched, base[step.name])
    rule = step.op.slice_rule
    if rule is not None and all(isinstance(x, Sliced) for x, b in zip(xs, batched) if b):
        y = rule(xp, step.op, xs, base[step.name], step.attrs)
        if y is not None:
            return y
    xs = [x.dense(xp) if isinstance(x, Sliced) else x for x in xs]
    if pairs and step.op.multilinear:
        y = multilinear_step(xp, step, xs, batched, base)
        if y is not None:
            return y
    return run_step_batched(xp, step, xs, batched)


def linear_step(xp, step: Step, xs: list, batched: list, base: dict):
    """A complex step through an op linear in all its inputs together (OpDef.linear: add, sub, concat, the shape
    ops, sum, mean) that a Pair reaches: its imaginary part is the forward itself on the inputs' imaginary parts
    (zeros for an input not perturbed), its real part the base's output -- a Pair again, where a dense copy
    would cost a complex array per value (ResNet's residual adds, a transformer's bias adds and head reshapes).
    None where a perturbed input is not complex (Sliced, or real): the step then runs as it is."""
    if any(b and not (isinstance(x, Pair) or (not isinstance(x, Sliced) and xp.iscomplexobj(x)))
           for x, b in zip(xs, batched)):
        return None
    im = [x.imag if b else xp.zeros(np.shape(x)) for x, b in zip(xs, batched)]  # a Pair's, or a complex view's
    return Pair(base[step.name], run_step_batched(xp, step, im, batched))


def elementwise_step(xp, step: Step, xs: list, batched: list, base: dict, slopes):
    """A complex step through an elementwise op (tanh, exp, mul by a constant...) that Pairs reach: its imaginary
    part is the sum over the perturbed inputs k of Im x_k times the op's slope in x_k at the base point
    (slopes.of(xp, step, k, base): the op's own forward at x_k + i eps, imaginary part over eps, once per step) --
    the forward's complex step to first order, as the Pairs' real parts (the base's values) already are: with
    h ~ 2^-64 the terms in h^2 and h^3 it drops are far below rounding. A Pair again, where a dense copy costs
    the op's complex form on every element of every copy (complex tanh ~50 ns an element, a deep chain's
    bisection and follow-ups most of their time). None where a perturbed input is not a Pair or a slope is not
    finite: the step then runs on dense complex copies as before."""
    if not all(isinstance(x, Pair) for x, b in zip(xs, batched) if b):
        return None
    rank, imag = np.ndim(base[step.name]), None
    for k in (k for k, b in enumerate(batched) if b):
        slope = slopes.of(xp, step, k, base)
        if slope is None:
            return None
        im = xs[k].imag
        if im.ndim - 1 < rank:  # as run_step_batched: ranks aligned after the batch axis
            im = im.reshape(im.shape[:1] + (1,) * (rank + 1 - im.ndim) + im.shape[1:])
        imag = im * slope if imag is None else imag + im * slope
    return Pair(base[step.name], imag)


def multilinear_step(xp, step: Step, xs: list, batched: list, base: dict):
    """A complex step through a multilinear op (OpDef.multilinear) on (real, imaginary) pairs of real
    arrays: every copy's real part is the base's output (shared: the copies' real parts are the base point,
    up to h^2), its imaginary part the sum over the batched factors k of the forward at (Im x_k, the other
    factors' base values) -- each term one real product, where NumPy's complex product costs four -- returned
    as a Pair (the imaginary part alone; a Pair input's is read as it is). Inputs after the factors only add
    (conv's bias): their imaginary parts join the first term, and an unbatched one is left out. None where
    this does not apply (a batched input that is not complex, no factor batched, the additive inputs partly
    batched): the step then runs on its complex inputs as they are."""
    form = step.op.multilinear
    factors = list(range(len(xs))) if form == "all" else [k for k in form if k < len(xs)]
    rest = [j for j in range(len(xs)) if j not in factors]
    if (not any(batched[k] for k in factors) or len({batched[j] for j in rest}) > 1
            or any(b and not (isinstance(x, Pair) or xp.iscomplexobj(x)) for x, b in zip(xs, batched))):
        return None
    im = [(x.imag if isinstance(x, Pair) else xp.ascontiguousarray(x.imag)) if b else None
          for x, b in zip(xs, batched)]  # a complex array's imaginary part is a strided view: BLAS wants rows
    imag = None
    for k in (k for k in factors if batched[k]):
        args = [im[k] if j == k else base[step.inputs[j]] for j in factors]
        flags = [j == k for j in factors]
        if imag is None and rest and batched[rest[0]]:
            args += [im[j] for j in rest]
            flags += [True] * len(rest)
        term = run_step_batched(xp, step, args, flags)
        if imag is None:
            imag = term
        elif imag.shape == term.shape:
            imag += term
        else:
            imag = imag + term
    return Pair(base[step.name], imag)
