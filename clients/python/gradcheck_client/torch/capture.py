"""Capture a PyTorch forward as a gradcheck graph: a dispatch-mode trace onto the client's tracer.

Every ATen op the forward dispatches (below autograd: a custom autograd.Function's forward is traced
op by op, whatever its backward says) is replayed on tracer Values through NumPy (`ATEN`), so the
graph is the forward's math as torch ran it. An in-place op (`x.mul_(2)`, or `x.data.mul_(2)`, which
autograd does not see) is replayed out of place and `x` names the new value, as the NumPy tracer does.
An op outside the table (cumsum, a torch.library custom op, a C++/CUDA/Triton kernel) with float
outputs is an opaque node (opaque.py): each float output enters the graph as a new parameter holding
torch's value, and check.py verifies the op locally. Inside a custom autograd.Function's forward (no
autograd there) such an op makes the whole Function call opaque (Capture.function_call). An op with only integer or
boolean outputs (argmax, a comparison) gives its trace-time value, a constant, as autograd gives no
gradient through it. An in-place write updates every traced tensor overlapping its memory (a view's
base, the other views: inplace.py); attention, the split family and inert dropout replay as the
registry's ops (attention.py). Faithful or refused: an op random in this run (dropout with p > 0 in
training mode: a re-run would differ; random_op), a read of a detached alias whose memory an in-place
op changed, a read of an output the table
does not replay (native_layer_norm's saved mean), a dtype change away from float64, or a replayed
value whose shape differs from torch's is a TracerError naming the op; a tensor the trace has not
produced (a buffer, a constant) enters as a constant, as autograd would treat it. A RuntimeError torch
raises in an op is a TracerError naming the op and the module running it.
"""
from __future__ import annotations

import functools
import os
import sys
import threading

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from gradcheck_core.op_values import OPS
from gradcheck_core.trace_errors import TracerError
from gradcheck_core.tracer import Tracer, Value
from . import attention, inplace, surrogate
from .inplace import STALE
from .opaque import Opaque

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


def _apply(op: str, *xs, **attrs):
    """Registry op `op` on xs, recorded by the tracer of the traced one(s) (others enter as constants)."""
    tracer = next(x.tracer for x in xs if isinstance(x, Value))
    return tracer.apply(op, *xs, **attrs)


def _pair(v, n: int = 2) -> list:
    return [int(v)] * n if isinstance(v, int) else [int(d) for d in v] * (n if len(v) == 1 else 1)


def _layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
    weight = np.ones(tuple(shape)) if weight is None else weight
    return _apply("layer_norm", *(x, weight) + (() if bias is None else (bias,)), axis=-len(shape), epsilon=eps)


def _reduced(x, reduction: int):
    """torch's loss reduction enum: 0 none, 1 mean, 2 sum."""
    return {0: lambda: x, 1: lambda: np.mean(x), 2: lambda: np.sum(x)}[reduction]()


def _nll_loss(logp, target, weight=None, reduction=1, ignore_index=-100):
    if weight is not None or np.any(target == ignore_index):
        raise TypeError("a class weight or an ignored target is not replayed")
    picked = (_apply("take_along_axis", logp, np.expand_dims(target, 1), axis=1) if len(logp.shape) > 1
              else logp[int(target)])
    return -_reduced(np.squeeze(picked, 1) if len(logp.shape) > 1 else picked, reduction)


def _number(v):
    if v is not None and not isinstance(v, (int, float)):
        raise TypeError("a bound given as a tensor is not replayed")
    return v


def _embedding(w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """A lookup; torch's gradient of a padding row is zero and scale_grad_by_freq scales it, by convention, not
    as the derivative: refused rather than failed."""
    if scale_grad_by_freq or padding_idx >= 0 and np.any(idx == padding_idx):
        raise TracerError("torch op aten::embedding with padding_idx or scale_grad_by_freq: torch's gradient there "
                          "is a convention (zero, or scaled), not the derivative, so it cannot be checked")
    return _apply("take", w, idx, axis=0)


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise TypeError("a transposed convolution is not replayed")
    n = len(w.shape) - 2
    return _apply("conv", *(x, w) + (() if b is None else (b,)), strides=_pair(stride, n),
                  pads=_pair(padding, n) * 2, dilations=_pair(dilation, n), group=groups)


def _pool(op: str, x, kernel, stride=(), padding=0, *rest, **kw):
    n = len(kernel) if not isinstance(kernel, int) else 2
    return _apply(op, x, kernel_shape=_pair(kernel, n), strides=_pair(stride or kernel, n),
                  pads=_pair(padding, n) * 2, **kw)


def _max_pool(x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _pool("max_pool", x, kernel, stride, padding, dilations=_pair(dilation, len(_pair(kernel))),
                 ceil_mode=ceil_mode)


def _avg_pool(x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        raise TypeError("divisor_override is not replayed")
    return _pool("avg_pool", x, kernel, stride, padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad)


def _index_positions(shape, indices) -> np.ndarray:
    """The flat positions aten.index picks from a tensor of `shape` (torch's advanced indexing is NumPy's: an
    index tensor per dimension, None for a whole one, the indexed dimensions moved as NumPy moves them)."""
    whole = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(tuple(shape))
    return whole[tuple(slice(None) if i is None else np.asarray(i) for i in indices)]


def _index(a, indices):
    """a[indices] (`v[[0, 2]]`, `x[mask]`): a take from the flattened a at the positions picked."""
    return _apply("take", np.reshape(a, (-1,)), _index_positions(a.shape, indices), axis=0)


def _index_put(a, indices, values, accumulate=False):
    """a with a[indices] = values, out of place: each element from a or from values (a take from their
    concatenation, as inplace.refreshed writes). torch's result where an element is written twice is not
    defined (accumulate=False), and accumulate=True sums: both declined (an opaque node)."""
    if accumulate:
        _refuse("index_put with accumulate=True")
    picked = _index_positions(a.shape, indices)
    flat = picked.reshape(-1)
    if len(np.unique(flat)) != len(flat):
        _refuse("index_put writing an element twice")
    n = int(np.prod(a.shape, dtype=np.int64))
    src = np.arange(n)
    src[flat] = n + np.arange(flat.size)
    both = _apply("concat", np.reshape(a, (-1,)), np.reshape(np.broadcast_to(values, picked.shape), (-1,)), axis=0)
    return np.reshape(_apply("take", both, src, axis=0), tuple(a.shape))


# The ATen ops that are the registry's op of the same name, tensor for tensor, without attributes. Their
# entries are derived from the registry's own table (gradcheck_core.op_values.OPS, generated from it), so an
# op the registry renames or drops, or gives an attribute, fails here at import, naming it.
SAME_AS_REGISTRY = ("mul", "div", "neg", "pow", "exp", "log", "tanh", "sin", "cos", "sqrt", "abs", "where")
# the registry's op on the ATen op's positional tensors; anything else (div's rounding_mode=) is a TypeError,
# which makes the op an opaque node (_replay)
_BY_ARITY = {1: lambda op, a: _apply(op, a), 2: lambda op, a, b: _apply(op, a, b),
             3: lambda op, a, b, c: _apply(op, a, b, c)}


def _registry_op(name: str):
    entry = OPS.get(name)
    if entry is None or entry["attrs"] or entry["arity"] not in _BY_ARITY:
        raise ImportError(f"capture.SAME_AS_REGISTRY: '{name}' is not an op of the registry with a fixed arity and "
                          "no attributes (see `gradcheck-svc ops`)")
    return functools.partial(_BY_ARITY[entry["arity"]], name)


# ATen op (overload packet) -> its forward on tracer Values / NumPy arrays: the registry's own ops, then
# one line each for the ops that translate torch's arguments
ATEN = {getattr(aten, name): _registry_op(name) for name in SAME_AS_REGISTRY} | {
    aten.add: lambda a, b, alpha=1: a + b * alpha if alpha != 1 else a + b,
    aten.sub: lambda a, b, alpha=1: a - b * alpha if alpha != 1 else a - b,
    aten.rsub: lambda a, b, alpha=1: b - a * alpha if alpha != 1 else b - a,
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
    # layers: the registry's ops (`gradcheck-svc ops`); tests/torch/test_torch_claims.py's LAYERS checks each
    aten.native_layer_norm: _layer_norm,
    aten.gelu: lambda a, approximate="none": _apply("gelu", a, approximate=approximate),
    aten.silu: lambda a: a / (1 + np.exp(-a)),
    aten.leaky_relu: lambda a, slope=0.01: _apply("leaky_relu", a, negative_slope=slope),
    aten.elu: lambda a, alpha=1.0, scale=1.0, input_scale=1.0: _apply("elu", a, alpha=alpha, scale=scale)
    if input_scale == 1 else _refuse("input_scale"),
    aten.hardtanh: lambda a, lo=-1.0, hi=1.0: _apply("clip", a, min=lo, max=hi),
    aten.clamp: lambda a, lo=None, hi=None: _apply("clip", a, min=_number(lo), max=_number(hi)),
    aten.amax: lambda a, dims=(), keepdim=False: np.max(a, axis=_axes(dims, len(a.shape)), keepdims=keepdim),
    aten.amin: lambda a, dims=(), keepdim=False: np.min(a, axis=_axes(dims, len(a.shape)), keepdims=keepdim),
    aten.cat: lambda xs, d=0: _apply("concat", *xs, axis=d),
    aten.stack: lambda xs, d=0: _apply("concat", *(np.expand_dims(x, d) for x in xs), axis=d),
    aten.logsumexp: lambda a, dims, keepdim=False: _apply("logsumexp", a, axis=dims[0], keepdims=keepdim)
    if len(dims) == 1 else _refuse("logsumexp over several axes"),
    aten.mse_loss: lambda a, b, reduction=1: _reduced((a - b) * (a - b), reduction),
    aten.nll_loss_forward: _nll_loss,
    aten.embedding: _embedding,
    aten.convolution: _convolution,
    aten.max_pool2d_with_indices: _max_pool, aten.max_pool2d: _max_pool,
    aten.avg_pool2d: _avg_pool,
    aten.baddbmm: lambda c, a, b, beta=1, alpha=1: c * beta + (a @ b) * alpha,
    # eval-mode models (attention.py): attention on every CPU backend, the split family, dropout where inert
    aten._scaled_dot_product_flash_attention_for_cpu: attention.flash_for_cpu,
    aten._scaled_dot_product_attention_math: attention.math,
    aten._safe_softmax: attention.safe_softmax,
    aten.split: attention.split, aten.unsafe_split: attention.split,
    aten.split_with_sizes: attention.split_sizes, aten.unsafe_split_with_sizes: attention.split_sizes,
    aten.chunk: attention.chunk, aten.unsafe_chunk: attention.chunk, aten.unbind: attention.unbind,
    aten.native_dropout: attention.dropout,
    # what in-place writes (`y[:, 0] = z`, masked_fill_, fill_, zero_) replay as, out of place
    aten.copy: lambda a, src, non_blocking=False: src + np.zeros(tuple(a.shape)),
    aten.masked_fill: lambda a, mask, value: np.where(mask, value, a),
    aten.fill: lambda a, value: np.broadcast_to(np.asarray(value, dtype=np.float64), tuple(a.shape)) + 0 * a,
    aten.zero: lambda a: np.zeros(tuple(a.shape)),
    aten.index: _index, aten.index_put: _index_put,  # `v[[0, 2]]`, and `v[[0, 2]] = w` (index_put_)
}


def _refuse(what: str):
    raise TypeError(f"{what} is not replayed")


MASKS = {aten.gt: np.greater, aten.lt: np.less, aten.ge: np.greater_equal, aten.le: np.less_equal}


def random_op(func, args, kwargs) -> bool:
    """Whether the op draws random numbers in this call: one torch tags as seeded, unless its only randomness is a
    dropout switched off here (attention's dropout_p 0; native_dropout with p 0 or train False: eval mode)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    named = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    named.update(zip([a.name for a in func._schema.arguments], args))
    named.update(kwargs)
    if "dropout_p" in named:
        return bool(named["dropout_p"])
    if func.overloadpacket == aten.native_dropout:
        return named.get("train") is not False and bool(named["p"])
    return True


def _replay(forward, args, kwargs):
    """The op's forward on tracer Values, or (None, why) when its entry declines these arguments (a weighted
    nll_loss, a transposed convolution): the op is then an opaque node."""
    try:
        return forward(*args, **kwargs), ""
    except TypeError as exc:
        return None, str(exc)


def _floats(out) -> list:
    """The floating-point tensors among an op's outputs."""
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [t for t in outs if isinstance(t, torch.Tensor) and t.is_floating_point()]


class ComplexIntermediate(TracerError):
    """A complex tensor made from traced values: not captured. check() refuses it as any TracerError; the drop-in
    (drop_in.py) lets torch's own checks decide alone, as for complex inputs and outputs."""


def _complex(out) -> list:
    """The complex tensors among an op's outputs."""
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [t for t in outs if isinstance(t, torch.Tensor) and t.is_complex()]


def _leaves(args, kwargs) -> list:
    return torch.utils._pytree.tree_leaves((list(args), dict(kwargs)))


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
        self.unreplayed: dict[int, tuple[torch.Tensor, str]] = {}  # outputs the table does not replay -> op
        self.opaque: list[Opaque] = []  # the opaque nodes, in order (opaque.py)
        self.frames: list[dict] = []  # the custom Function calls running, outermost first (function_call)
        self.detach_sites: dict[int, str] = {}  # a detach's output -> where it was made
        self.cuts: list[str] = []  # where the forward cut torch's graph on a traced tensor (values.py names them)

    def __enter__(self):
        """While capturing, a .numpy() read of a traced tensor (this thread's) is recorded as a cut."""
        self._numpy, thread = torch.Tensor.numpy, threading.get_ident()

        def numpy(t, *args, **kwargs):
            if threading.get_ident() == thread and self.values.get(id(t), (None,))[0] is t:
                self.cut(".numpy()")
            return self._numpy(t, *args, **kwargs)
        torch.Tensor.numpy = numpy
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.numpy = self._numpy
        return super().__exit__(*exc)

    def bind(self, tensor: torch.Tensor, value: Value) -> None:
        self.values[id(tensor)] = (tensor, value)

    def cut(self, what: str, where: str | None = None) -> None:
        """Record a cut of torch's graph on a traced tensor (a detached alias read, .item(), no_grad, .numpy())."""
        if any(frame.get("surrogate") for frame in self.frames):  # inside a declared surrogate's forward: its
            return  # backward is declared not the derivative of its values, so no cut there is one of torch's graph
        site = f"{what} ({self._where() if where is None else where})"
        if site not in self.cuts:
            self.cuts.append(site)

    def _lift(self, a):
        if isinstance(a, torch.Tensor):
            if id(a) in self.detach_sites and self.values.get(id(a), (None,))[0] is a:
                self.cut("a .detach()/.data alias read", self.detach_sites[id(a)])
            if id(a) in self.stale:
                raise TracerError("a tensor is read after an in-place op changed its memory through another tensor "
                                  "(a view or a detached alias): it cannot be replayed faithfully")
            hit = self.values.get(id(a))
            if hit is not None and hit[0] is a:
                return hit[1]
            lost = self.unreplayed.get(id(a))
            if lost is not None and lost[0] is a:
                raise TracerError(f"an output of torch op {lost[1]} that the capture does not replay (a saved "
                                  f"statistic, indices) is read{self._at()}: it cannot be traced")
            return a.detach().cpu().numpy()  # not produced by the trace: a constant
        if isinstance(a, (list, tuple)):
            return type(a)(self._lift(x) for x in a)
        return a

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self._untraced_target(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except RuntimeError as exc:  # torch's own error, in one line naming the op and where
            raise TracerError(f"torch op {func.name()} raised{self._at()}: "
                              f"{(str(exc).strip().splitlines() or [''])[0][:300]}") from None
        lifted, named = [self._lift(a) for a in args], {k: self._lift(v) for k, v in kwargs.items()}
        if not any(_traced(a) for a in [*lifted, *named.values()]):
            return out  # an op on constants only (torch's own setup, the cotangent): its value is a constant
        packet = func.overloadpacket
        if random_op(func, args, kwargs):
            raise TracerError(f"torch op {func.name()} is random{self._at()}: a re-run differs, so it cannot be "
                              "checked (put the module in eval() mode, or draw the randomness outside the function)")
        if not torch.is_grad_enabled() and not self.frames:
            self.cut(f"torch op {func.name()} under torch.no_grad")
        if packet == aten.detach:  # a stop-gradient: the trace-time value, as a constant
            # -- except inside a backward pass the function runs (torch.autograd.grad, create_graph=True: a
            # gradgradcheck), where autograd unpacks a saved output through a detach and re-attaches its
            # history, and a backward's own detach is a path the references follow: the same value
            in_backward = torch._C._current_graph_task_id() != -1
            self._record(out, lifted[0] if in_backward else self.tracer.constant(lifted[0]), func)
            self.detached.add(id(out))
            self.detach_sites[id(out)] = self._where()
        elif packet == aten._local_scalar_dense:
            self.cut(".item()")
        elif func._schema.is_mutable:
            for tensor, value in before:  # a constant written with traced values (`out[:, 0] = x`): its old value
                self.bind(tensor, self.tracer.constant(value))
            lifted[0] = self._lift(args[0])
            self._inplace(func, args, lifted, named)
        elif _complex(out):  # not a constant (its derivative is not zero), and no registry op is complex
            raise ComplexIntermediate(f"torch op {func.name()} made a {_complex(out)[0].dtype} tensor from traced "
                                      f"values{self._at()}: complex intermediates are not captured")
        elif packet in MASKS or not _floats(out):
            pass  # a comparison, an argmax: its trace-time value, a constant (no gradient flows through it)
        elif any(t.dtype != torch.float64 for t in _floats(out)):
            raise TracerError(f"torch op {func.name()} made a {_floats(out)[0].dtype} tensor from traced values"
                              f"{self._at()}: check in float64 (the inputs are converted; a cast inside the "
                              "function is not traced)")
        elif packet not in ATEN:
            self._opaque(func, args, kwargs, out)
        else:
            value, declined = _replay(ATEN[packet], lifted, named)
            if value is None:
                self._opaque(func, args, kwargs, out, f"its arguments are outside the capture's entry ({declined})")
                return out
            self._record_all(out, value, func)
        return out

    def _record_all(self, out, value, func) -> None:
        """An op's outputs bound to its replay: each one of a list (split) to each value, else the first output
        (the others -- saved statistics, indices -- are marked not replayed)."""
        if isinstance(value, list):
            for tensor, v in zip(out, value, strict=True):
                self._record(tensor, v, func)
            return
        first = out[0] if isinstance(out, (tuple, list)) else out
        self._record(first, value, func)
        for extra in (out[1:] if isinstance(out, (tuple, list)) else ()):
            if isinstance(extra, torch.Tensor):
                self.unreplayed[id(extra)] = (extra, func.name())

    def _where(self) -> str:
        """The module path running and the user's line: where an op is being made -- in a backward pass the
        function runs (gradgradcheck), said so: the op is one of a backward's, the line where that pass began
        or a custom backward's own."""
        backward = "in a backward pass, " if torch._C._current_graph_task_id() != -1 else ""
        return backward + ", ".join(filter(None, [self.modules[-1] if self.modules else "", _user_line()]))

    def _at(self) -> str:
        return f" (at {self._where()})" if self._where() else ""

    def _opaque(self, func, args, kwargs, out, reason: str = "") -> None:
        """An op outside the table: its float outputs enter as new parameters holding torch's values (an
        Opaque node, checked on its own by check.py). Inside a custom Function's forward, autograd keeps
        nothing of it: the outermost Function call becomes the opaque node instead (function_call)."""
        if self.frames:
            self.frames[0]["inside"] = self.frames[0]["inside"] or func.name()
            return
        traced = [isinstance(a, torch.Tensor) and _traced(self._lift(a)) for a in _leaves(args, kwargs)]
        self.opaque.append(Opaque.of_op(func, args, kwargs, traced, self._binding(out, func.name()),
                                        self._where(), self, reason))

    def _binding(self, out, label: str) -> list:
        """Each float output of an opaque call bound to a new parameter holding torch's value."""
        leaves, short = [], label.split("::")[-1].split(".")[0]
        for t in _floats(out):
            value = self.tracer.param(self.tracer.fresh_name(f"opaque_{short}"), t.detach().cpu().numpy())
            self.bind(t, value)
            self.where.setdefault(value.name, self._where())
            leaves.append((t, value))
        return leaves

    def settle(self) -> None:
        """After the forward: an opaque output autograd does not track, where grad mode was on, is one torch
        gives no gradient through (zeros_like, a non-differentiable op): a constant input of the graph, as
        autograd treats it. Under torch.no_grad an op on traced values is refused (torch would miss its
        derivative, and the graph could not say so)."""
        for node in list(self.opaque):
            untracked = [(t, v) for t, v in node.outputs if not t.requires_grad]
            if untracked and not node.grad_enabled:
                raise TracerError(f"torch op {node.name} ran on traced values under torch.no_grad at {node.source}: "
                                  "it cannot be checked as an opaque node")
            for _, v in untracked:
                self.tracer.constant_input(v)
            node.outputs = [(t, v) for t, v in node.outputs if t.requires_grad]
            if not node.outputs:
                self.opaque.remove(node)

    def function_call(self, cls, args, out, module: str) -> bool:
        """After a custom Function's call returns: True when it is opaque (an op of its forward is outside
        the table), its outputs then bound to new parameters; False when its forward was traced op by op."""
        frame = self.frames.pop()
        declared = surrogate.declared(cls)  # a declared surrogate is an opaque node whose own check is waived
        if not (frame["inside"] or declared) or self.frames:
            return False
        traced = [isinstance(a, torch.Tensor) and _traced(self._lift(a)) for a in args]
        why = f"declared surrogate ({declared})" if declared else \
            f"its forward calls {frame['inside']}, which the capture does not replay"
        with _disable_current_modes():  # (its copies of the arguments are ours, no ops of the function's to record)
            node = Opaque.of_function(cls, args, traced, self._binding(out, cls.__name__), why, module, self)
        node.surrogate = declared
        self.opaque.append(node)
        return True

    def _untraced_target(self, func, args, kwargs) -> list:
        """Before an in-place op writes traced values into a tensor the trace has not produced (a constant, or a
        view of one: `out = torch.zeros(3); out[1:] = x`), copies of it and of its base: their old values,
        which become constants of the graph, so the write is replayed on them (_inplace)."""
        if not func._schema.is_mutable or not args or not isinstance(args[0], torch.Tensor):
            return []
        target = args[0]
        if id(target) in self.values or not any(id(t) in self.values for t in _leaves(args[1:], kwargs)
                                                if isinstance(t, torch.Tensor)):
            return []
        base = target._base
        pairs = [(base, base.detach().cpu().numpy().copy())] if base is not None and id(base) not in self.values \
            else []
        return pairs + [(target, target.detach().cpu().numpy().copy())]

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
        value, declined = _replay(ATEN[packet], lifted, named)
        if value is None:
            raise TracerError(f"torch op {func.name()} writes in place with arguments the capture does not replay "
                              f"({declined}): write it out of place")
        self._record(target, value, func)
        self._overlapping(target, value)

    def _overlapping(self, target, value) -> None:
        """After a write into target: each other traced tensor over the same memory takes its new value
        (inplace.refreshed: a view of the base, the base of a view); one that cannot follow it -- a detached
        alias (a constant), another dtype -- is stale: reading it later is refused (_lift)."""
        pw = None  # the write's storage positions, computed once for all the tensors sharing its memory
        for i, (t, old) in list(self.values.items()):
            if t is target or not inplace.shares(t, target):
                continue
            if pw is None:
                pw = inplace.positions(target)
            new = STALE if i in self.detached else inplace.refreshed(t, old, target, value, pw)
            if new is STALE and inplace.overlaps(t, target, pw):
                self.stale.add(i)
            elif new is not None and new is not STALE:
                self.bind(t, new if isinstance(new, Value) else self.tracer.constant(np.asarray(new)))

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
        self.where.setdefault(value.name, self._where())


# torch, this package and the core's tracer (gradcheck_core): frames there are ours, not the user's
_SKIP = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)),
         os.path.dirname(sys.modules[Tracer.__module__].__file__))


def _user_line() -> str:
    """FILE:LINE of the innermost frame outside torch, gradcheck_client and gradcheck_core: the user's line
    that made an op."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else ""


def raised_at(exc: BaseException, capture: Capture) -> str:
    """' (at MODULE, FILE:LINE)' for an error torch raised outside an op (autograd's own checks): the module
    running when it was raised and the innermost line of the user's code in its traceback."""
    tb, line = exc.__traceback__, ""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not name.startswith(_SKIP):
            line = f"{name}:{tb.tb_lineno}"
        tb = tb.tb_next
    where = ", ".join(filter(None, [capture.modules[-1] if capture.modules else "", line]))
    return f" (at {where})" if where else ""


def nonfinite_constants(graph) -> bool:
    """Whether the captured graph holds NaN/Inf only in constants (a causal mask's -inf buffer, attention's
    masked scores), every parameter finite: those are part of the function torch ran, so its validation
    lets them through (allow_nonfinite, as the ONNX door does for a model's own constants), while a
    parameter holding NaN/Inf is still refused."""
    bad = [i for i in graph.inputs if not np.isfinite(np.asarray(i.value.data, dtype=np.float64)).all()]
    return bool(bad) and not any(i.requires_grad for i in bad)
