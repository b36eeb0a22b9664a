"""Capture a PyTorch forward as a gradcheck graph: a dispatch-mode trace onto the client's tracer.

Every ATen op the forward dispatches (below autograd: a custom autograd.Function's forward is traced
op by op, whatever its backward says) is replayed on tracer Values through NumPy (`ATEN`), so the
graph is the forward's math as torch ran it. An in-place op (`x.mul_(2)`, or `x.data.mul_(2)`, which
autograd does not see) is replayed out of place and `x` names the new value, as the NumPy tracer does.
Faithful or refused: an op not in the table, a read of a view or alias whose memory an in-place op
changed, a dtype change away from float64, or a replayed value whose shape differs from torch's is a
TracerError naming the op; a tensor the trace
has not produced (a buffer, a constant) enters as a constant, as autograd would treat it.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..trace_errors import TracerError
from ..tracer import Tracer, Value

aten = torch.ops.aten


def _axes(dims, ndim: int):
    dims = [dims] if isinstance(dims, int) else list(dims or range(ndim))
    return tuple(d % ndim if ndim else 0 for d in dims)


def _sum(x, dims=None, keepdim=False, dtype=None):
    return np.sum(x, axis=_axes(dims, len(x.shape)), keepdims=keepdim) if len(x.shape) else x


def _mean(x, dims=None, keepdim=False, dtype=None):
    return np.mean(x, axis=_axes(dims, len(x.shape)), keepdims=keepdim) if len(x.shape) else x


def _var(x, dims=None, correction=1, keepdim=False):
    n = int(np.prod([x.shape[d] for d in _axes(dims, len(x.shape))]))
    xc = x - np.mean(x, axis=_axes(dims, len(x.shape)), keepdims=True)
    return _mean(xc * xc, dims, keepdim) * (n / (n - (1 if correction is None else correction)))


def _squeeze(a, dims=None):
    dims = range(len(a.shape)) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = tuple(d % len(a.shape) for d in dims if a.shape[d] == 1)
    return np.squeeze(a, axis=axes) if axes else a


def _at(dim: int, key) -> tuple:
    return (slice(None),) * dim + (key,)


# ATen op (overload packet) -> its forward on tracer Values / NumPy arrays; one line each
ATEN = {
    aten.add: lambda a, b, alpha=1: a + b * alpha if alpha != 1 else a + b,
    aten.sub: lambda a, b, alpha=1: a - b * alpha if alpha != 1 else a - b,
    aten.rsub: lambda a, b, alpha=1: b - a * alpha if alpha != 1 else b - a,
    aten.mul: lambda a, b: a * b,
    aten.div: lambda a, b: a / b,
    aten.neg: lambda a: -a,
    aten.pow: lambda a, b: a ** b,
    aten.exp: np.exp, aten.log: np.log, aten.tanh: np.tanh, aten.sin: np.sin, aten.cos: np.cos,
    aten.sqrt: np.sqrt, aten.abs: np.abs,
    aten.rsqrt: lambda a: 1 / np.sqrt(a),
    aten.reciprocal: lambda a: 1 / a,
    aten.sigmoid: lambda a: 1 / (1 + np.exp(-a)),
    aten.relu: lambda a: np.maximum(a, 0.0),
    aten.mm: lambda a, b: a @ b, aten.bmm: lambda a, b: a @ b,
    aten.addmm: lambda c, a, b, beta=1, alpha=1: c * beta + (a @ b) * alpha if (beta, alpha) != (1, 1) else c + a @ b,
    aten.t: lambda a: a.T if len(a.shape) == 2 else a,
    aten.transpose: lambda a, d0, d1: np.swapaxes(a, d0, d1),
    aten.permute: lambda a, dims: np.transpose(a, dims),
    aten.view: lambda a, shape: np.reshape(a, shape), aten._unsafe_view: lambda a, shape: np.reshape(a, shape),
    aten.reshape: lambda a, shape: np.reshape(a, shape),
    aten.expand: lambda a, shape, implicit=False: np.broadcast_to(a, [s if s != -1 else d for s, d in
                                                                      zip(shape, (1,) * (len(shape) - len(a.shape))
                                                                          + tuple(a.shape))]),
    aten.unsqueeze: lambda a, d: np.expand_dims(a, d),
    aten.squeeze: lambda a, d=None: _squeeze(a, d),
    aten.sum: _sum, aten.mean: _mean, aten.var: _var,
    aten.slice: lambda a, d=0, start=None, end=None, step=1: a[_at(d % len(a.shape), slice(start, end, step))],
    aten.select: lambda a, d, i: a[_at(d % len(a.shape), i)],
    aten._softmax: lambda a, d, half: a.tracer.apply("softmax", a, axis=d),
    aten._log_softmax: lambda a, d, half: a.tracer.apply("log_softmax", a, axis=d),
    aten.clone: lambda a, memory_format=None: a, aten.alias: lambda a: a,
    aten.where: lambda c, a, b: np.where(c, a, b),
}
MASKS = {aten.gt: np.greater, aten.lt: np.less, aten.ge: np.greater_equal, aten.le: np.less_equal}


def _replay(func, forward, args, kwargs):
    """The op's forward on tracer Values; arguments its table entry does not take are refused, naming the op."""
    try:
        return forward(*args, **kwargs)
    except TypeError as exc:
        raise TracerError(f"torch op {func.name()} was called with arguments the capture does not replay "
                          f"({exc})") from None


def _traced(a) -> bool:
    return isinstance(a, Value) or isinstance(a, (list, tuple)) and any(_traced(x) for x in a)


class Capture(TorchDispatchMode):
    """Replays each ATen op on tracer Values; `values` maps a tensor (by identity) to its Value."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer
        self.values: dict[int, tuple[torch.Tensor, Value]] = {}  # id -> (tensor, kept alive: ids stay unique)
        self.produced: list[tuple[torch.Tensor, Value]] = []  # every op output, in order
        self.detached: set[int] = set()  # tensors made by detach (constants sharing a traced tensor's memory)
        self.stale: set[int] = set()  # tensors whose memory an in-place op changed after they were made
        self.modules: list[str] = []  # the module path being run (module hooks push and pop it)
        self.where: dict[str, str] = {}  # node name -> "module PATH (Class), FILE:LINE": where the user made it

    def bind(self, tensor: torch.Tensor, value: Value) -> None:
        self.values[id(tensor)] = (tensor, value)

    def _lift(self, a):
        if isinstance(a, torch.Tensor):
            if id(a) in self.stale:
                raise TracerError("a tensor is read after an in-place op changed its memory through another tensor "
                                  "(a view or a detached alias): it cannot be replayed faithfully")
            hit = self.values.get(id(a))
            if hit is not None and hit[0] is a:
                return hit[1]
            return a.detach().cpu().numpy()  # not produced by the trace: a constant
        if isinstance(a, (list, tuple)):
            return type(a)(self._lift(x) for x in a)
        return a

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        lifted, named = [self._lift(a) for a in args], {k: self._lift(v) for k, v in kwargs.items()}
        if not any(_traced(a) for a in [*lifted, *named.values()]):
            return out  # an op on constants only (torch's own setup, the cotangent): its value is a constant
        packet = func.overloadpacket
        if packet == aten.detach:  # a stop-gradient: the trace-time value, as a constant
            self._record(out, self.tracer.constant(lifted[0]), func)
            self.detached.add(id(out))
        elif func._schema.is_mutable:
            self._inplace(func, args, lifted, named)
        elif packet in MASKS:
            pass  # a comparison: its trace-time value, a boolean mask (the tracer's comparison rule)
        elif packet not in ATEN:
            raise TracerError(f"torch op {func.name()} cannot be traced into a gradcheck graph (not in "
                              "gradcheck_client/torch/capture.py's ATEN table)")
        elif isinstance(out, torch.Tensor) and out.dtype != torch.float64:
            raise TracerError(f"torch op {func.name()} made a {out.dtype} tensor from traced values: check in "
                              "float64 (the inputs are converted; a cast inside the function is not traced)")
        else:
            self._record(out, _replay(func, ATEN[packet], lifted, named), func)
        return out

    def _inplace(self, func, args, lifted, named) -> None:
        """x.add_(y) and the like: the out-of-place op's value, and x names it from now on (as the tracer's own
        in-place rule). A write through a detached alias of the whole of x (`x.data.mul_(3)`) changes x's
        value as well, unseen by autograd: the graph follows the values (x names the new one), so the
        references differentiate what was computed, and torch's gradient, which missed the write, fails. Any
        other tensor sharing the memory (a view, another alias) now holds a value the trace does not: reading
        it later is refused (_lift)."""
        packet = getattr(aten, func.overloadpacket.__name__.rstrip("_"), None)
        target = args[0]
        if packet not in ATEN or id(target) not in self.values:
            raise TracerError(f"torch op {func.name()} writes in place with no out-of-place form here: it cannot "
                              "be replayed faithfully (write it out of place)")
        if id(target) in self.detached:
            owner = self._aliased(target)
            if owner is None:
                raise TracerError(f"torch op {func.name()} writes in place through a detached alias of part of a "
                                  "traced tensor: it cannot be replayed faithfully (write it out of place)")
            target, lifted = owner, [self.values[id(owner)][1], *lifted[1:]]
        memory = target.untyped_storage().data_ptr()
        self.stale |= {i for i, (t, _) in self.values.items() if t is not target and
                       t.untyped_storage().data_ptr() == memory}
        self._record(target, _replay(func, ATEN[packet], lifted, named), func)

    def _aliased(self, alias: torch.Tensor):
        """The traced (not detached) tensor an alias covers whole (same memory, shape and strides), or None."""
        def same(t):
            return (t.untyped_storage().data_ptr() == alias.untyped_storage().data_ptr() and t.shape == alias.shape
                    and t.stride() == alias.stride() and t.storage_offset() == alias.storage_offset())
        owners = [t for i, (t, _) in self.values.items() if i not in self.detached and t is not alias and same(t)]
        return owners[0] if len(owners) == 1 else None

    def _record(self, out, value, func) -> None:
        if not isinstance(out, torch.Tensor):
            raise TracerError(f"torch op {func.name()} returned {type(out).__name__}: not traced")
        if not isinstance(value, Value):
            value = self.tracer.constant(np.asarray(value))
        if tuple(value.shape) != tuple(out.shape):
            raise TracerError(f"torch op {func.name()}: replayed with shape {list(value.shape)}, torch made "
                              f"{list(out.shape)}")
        if value.value is None:  # an op the tracer does not evaluate locally (softmax): torch's value is its value
            value.value = out.detach().cpu().numpy()
        self.bind(out, value)
        self.produced.append((out, value))
        self.where.setdefault(value.name, ", ".join(filter(None, [self.modules[-1] if self.modules else "",
                                                                   _user_line()])))


_SKIP = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))


def _user_line() -> str:
    """FILE:LINE of the innermost frame outside torch and gradcheck_client: the user's line that made an op."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else ""
