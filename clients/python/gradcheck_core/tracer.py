"""A define-by-run tracer: ordinary Python arithmetic records a gradcheck.v1.Graph.

    from gradcheck_core.tracer import Tracer, ops
    t = Tracer("seed")
    w, x = t.param("w", 3.0), t.param("x", 2.0)
    z = (w * x).named("z")
    loss = (z ** 2) / 4
    graph = t.graph(loss)            # a gradcheck.v1.Graph message

    h = t.input("h", np.ones((2, 3))); W = t.param("W", np.eye(3))
    loss = ops.tanh(h @ W).sum()     # any registry op: ops.NAME(*inputs, **attrs)

Like PyTorch's eager mode, every value also carries its concrete NumPy value
(for the ops in op_values.py, generated from the server's registry), so
Python control flow may look at data: `if loss > 1: ...`. Such control flow is BAKED IN at trace time: the graph
records only the branch that was taken (and the loop iterations that ran)
with these input values. The server verifies that graph; it does not
re-decide the branch. Re-trace when the inputs change which way it goes.

The NumPy values exist only to let Python decide branches at trace time;
the server recomputes everything with its own engine. Ops without a local
value (op_values.WITHOUT_VALUE: softmax, gelu, ...) still trace fine; only
looking at their value (`bool()`, comparisons) raises TracerError.

The tracer refuses rather than lies: converting a traced value into a plain number or array
(`float()`, `int()`, `np.float64()`, `math.exp()`, `np.asarray()`, storing it into a NumPy array)
would freeze it into a constant and drop its gradient, so it raises TracerError naming the user's
line and the fix (the NumPy function, or `t.constant(v)` when a constant is really meant; `v.value`
reads the trace-time value on purpose). In-place operators follow NumPy's aliasing (`y = x; y += 1`
moves both names to the new node); writes through views, or into an array a live view shares, are
refused.

Plain NumPy code traces too: `np.tanh(x @ w)`, `np.sum(x, axis=1, keepdims=True)`,
`np.maximum(x, 0)`, `np.where(x > 0, x, 0)`, `np.concatenate([a, b])`, `x.T`, `x.reshape(...)`,
`x[0]`, `x[:, 1:3]`, `x[idx]` record the registry's ops (numpy_protocol.py, indexing.py: the
NumPy name of each op comes from the registry, through the generated op_values.OPS). `.shape`,
`.ndim` and `len()` are right for every op, from the shape rules the generator checked against
the server's shape inference (shapes.py). An op the registry lacks fails when it is traced.

The comparison rule: `<`, `<=`, `>`, `>=`, `==` and `!=` between traced values (or a traced
value and a number) compare the trace-time values and give a NumPy boolean array, never a
node. It may select (`np.where(x > 0, x, 0)`: the mask is a constant of the graph) or decide
a branch; branching (`bool()` of a traced value or of such a comparison) warns once per trace
(TracerWarning), as torch.jit.trace does, because the branch is baked into the graph. Values
are still hashable by identity (they are graph nodes).
"""
from __future__ import annotations

import re
import warnings
import weakref
from collections.abc import Callable

import numpy as np
from gradcheck.v1 import graph_pb2

from . import faithful, indexing, numpy_protocol
from .graphio import set_attrs
from .op_values import OPS, REQUIRED, VALUES
from .shapes import output_shape
from .trace_errors import TracerError, TracerWarning, UnknownOpError, user_site
from .traced import Traced

__all__ = ["Tracer", "TracerError", "constant",
           "TracerWarning", "UnknownOpError", "Value", "exp", "log", "ops", "relu", "sigmoid",
           "tanh"]


class TracedBool(np.ndarray):
    """A comparison of trace-time values: a NumPy boolean array that warns when it decides a branch."""

    def __array_finalize__(self, obj):
        self.tracer = getattr(obj, "tracer", None)

    def __bool__(self):
        if self.tracer is not None:
            self.tracer._warn_branch()
        return bool(np.asarray(self))


# Trace-time values (NumPy), so Python can branch on data: generated from the server's
# registry into op_values.py (scripts/gen_client_ops.py); ops without one trace without a value.
_EAGER: dict[str, Callable] = VALUES


class _Node:
    """One graph value (an input or a node's output): what the recorded graph refers to. A Value names
    the node it currently holds; an in-place operator moves the Value to the new node, so every Python
    name bound to that Value sees the update, as with a NumPy array."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value):
        self.name = name
        self.value = value  # np.ndarray, or None when not known at trace time


# ops whose NumPy counterpart returns a view of its input (basic slicing, reshape, transpose...):
# an in-place update through such a result, or of its base while it lives, would write both in NumPy
VIEW_OPS = frozenset({"slice", "reshape", "transpose", "squeeze", "expand_dims", "broadcast_to"})

# the user's line converts with np.asarray/np.array (and kin): the fix is to drop the call
_ASARRAY = re.compile(r"\b(asarray|asanyarray|ascontiguousarray|asfarray|array)\(")

_CONVERSION = ("converting a traced value to a Python or NumPy number or a plain array (float(), int(), "
               "math.*, np.float64(), np.asarray(), .item(), .tolist(), storing it into a NumPy array) would "
               "freeze its trace-time value into a constant and silently drop its gradient")


# ndarray methods that hand out plain numbers or bytes: the same refusal as float()
_FREEZING_METHODS = frozenset({"item", "tolist", "tobytes", "itemset"})


class Value(Traced):
    """A traced value: a graph input or the output of a recorded node."""

    __array_priority__ = 1000  # numpy scalars/arrays on the left defer to our reflected operators

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return numpy_protocol.ufunc_call(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return numpy_protocol.function_call(self, func, args, kwargs)

    def __init__(self, tracer: Tracer, node: _Node, base: Value | None = None):
        self.tracer = tracer
        self._node = node
        self._base = base  # the Value this one is a NumPy view of (in-place rules), or None
        self._readonly = ""  # the NumPy function whose read-only view this is (np.diagonal), or ""
        # live views of this Value: id -> weak reference (not a WeakSet: that compares members with ==,
        # which on traced values is the elementwise comparison rule)
        self._views: dict[int, weakref.ref] = {}

    @property
    def name(self) -> str:
        return self._node.name

    @property
    def value(self):
        """The trace-time value (np.ndarray, or None when its op has no local evaluation). Reading it is
        reading data: the graph does not depend on it."""
        return self._node.value

    @value.setter
    def value(self, v) -> None:
        self._node.value = v

    def named(self, name: str) -> Value:
        """Give this value's node a readable name (shown in reports); returns self."""
        self.tracer._rename(self, name)
        return self

    # arithmetic records nodes
    def __add__(self, o): return self.tracer.apply("add", self, o)
    def __radd__(self, o): return self.tracer.apply("add", o, self)
    def __sub__(self, o): return self.tracer.apply("sub", self, o)
    def __rsub__(self, o): return self.tracer.apply("sub", o, self)
    def __mul__(self, o): return self.tracer.apply("mul", self, o)
    def __rmul__(self, o): return self.tracer.apply("mul", o, self)
    def __truediv__(self, o): return self.tracer.apply("div", self, o)
    def __rtruediv__(self, o): return self.tracer.apply("div", o, self)
    def __pow__(self, o): return self.tracer.apply("pow", self, o)
    def __rpow__(self, o): return self.tracer.apply("pow", o, self)
    def __matmul__(self, o): return self.tracer.apply("matmul", self, o)
    def __rmatmul__(self, o): return self.tracer.apply("matmul", o, self)
    def __neg__(self): return self.tracer.apply("neg", self)
    # // and % as NumPy's floor_divide and remainder (numpy_compose: floor(a / b), a - b * floor(a / b))
    def __floordiv__(self, o): return np.floor_divide(self, o)
    def __rfloordiv__(self, o): return np.floor_divide(o, self)
    def __mod__(self, o): return np.remainder(self, o)
    def __rmod__(self, o): return np.remainder(o, self)

    @property
    def real(self) -> Value:
        """A float array's real part is the array itself (NumPy: a view sharing its memory)."""
        return self

    def view(self, *args, **kwargs):
        raise TracerError("x.view() of a traced value cannot be traced (a NumPy view reinterpreting its memory): "
                          "use x itself" + user_site())
    def __pos__(self): return Value(self.tracer, self._node)  # a new array object, as NumPy's +x
    def __abs__(self): return self.tracer.apply("abs", self)

    # in-place operators: NumPy's aliasing (`y = x; y += 1` changes x too), see _inplace
    def __iadd__(self, o): return self._inplace("add", o)
    def __isub__(self, o): return self._inplace("sub", o)
    def __imul__(self, o): return self._inplace("mul", o)
    def __itruediv__(self, o): return self._inplace("div", o)
    def __ipow__(self, o): return self._inplace("pow", o)
    def __imatmul__(self, o): return self._inplace("matmul", o)

    def _inplace(self, op: str, o) -> Value:
        """`x op= o` updates the array object x in NumPy, so every name bound to it sees the new value: here
        the Value moves to the new node. A write through a view (or into a base a live view shares) would
        change both arrays in NumPy: refused rather than traced as if they were separate."""
        if self._readonly:
            raise TracerError(f"in-place update of '{self.name}'{user_site()}: NumPy's {self._readonly} is a "
                              "read-only view (ValueError: assignment destination is read-only); write "
                              f"`y = np.{self._readonly}(...) + ...` (a new array)")
        if self._base is not None:
            raise TracerError(f"in-place update of '{self.name}', a view of '{self._base.name}'{user_site()}: "
                              "NumPy would write through to the base array; the tracer does not follow views. "
                              "Write it without the view (e.g. np.where or np.concatenate on the whole array)")
        live = [v for v in (r() for r in self._views.values()) if v is not None]
        if live:
            raise TracerError(f"in-place update of '{self.name}' while a view of it ('{live[0].name}') is in use"
                              f"{user_site()}: NumPy would change the view too; the tracer does not follow "
                              f"views. Write `{self.name} = {self.name} ...` (a new array) or drop the view first")
        out = self.tracer.apply(op, self, o)
        if out.shape != self.shape:
            raise TracerError(f"in-place {op} would change the shape of '{self.name}' from {list(self.shape)} to "
                              f"{list(out.shape)}{user_site()} (NumPy refuses it too)")
        self._node = out._node
        return self

    def detach(self) -> None:
        """This Value is a copy in NumPy, not a view (x[0, 1] is a scalar): in-place updates are its own."""
        if self._base is not None:
            self._base._views.pop(id(self), None)
            self._base = None

    def __setitem__(self, key, value):
        raise TracerError(f"assignment into the traced value '{self.name}'{user_site()} cannot be traced: build "
                          "the new array instead (np.where(mask, new, x), np.concatenate of the pieces)")

    # NumPy's functions of the same name, which check NumPy's argument forms (numpy_protocol)
    def sum(self, axis=None, keepdims=False): return np.sum(self, axis=axis, keepdims=keepdims)
    def mean(self, axis=None, keepdims=False): return np.mean(self, axis=axis, keepdims=keepdims)
    def max(self, axis=None, keepdims=False): return np.max(self, axis=axis, keepdims=keepdims)
    def min(self, axis=None, keepdims=False): return np.min(self, axis=axis, keepdims=keepdims)

    # NumPy's array methods and attributes
    @property
    def T(self) -> Value:
        return self.tracer.apply("transpose", self)

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return self.tracer.apply("transpose", self, axes=list(axes) if axes else None)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self.tracer.apply("reshape", self, shape=[int(d) for d in shape])

    def __getattr__(self, name):
        # the other ndarray methods (var, std, prod, ravel, squeeze, astype, copy...): NumPy's function of
        # the same name, traced as any NumPy call (numpy_protocol)
        if name in _FREEZING_METHODS:
            self._refuse_conversion()
        method = numpy_protocol.method(name)
        if method is None:
            raise AttributeError(f"traced values have no attribute '{name}'")
        return lambda *args, **kwargs: method(self, *args, **kwargs)

    def __getitem__(self, key):
        return indexing.getitem(self, key)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d traced value")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def dtype(self):
        v = self._node.value
        return v.dtype if v is not None else np.dtype(np.float64)

    # looking at data: answered from the trace-time value (the branch gets baked in)
    def _known(self) -> np.ndarray:
        if self.value is None:
            raise TracerError(f"the value of '{self.name}' is not known at trace time (its op has no "
                              "local evaluation); data-dependent control flow cannot use it")
        return self.value

    def __bool__(self):
        known = self._known()
        self.tracer._warn_branch()
        return bool(known)

    def _refuse_conversion(self, *args, **kwargs):
        site = user_site()
        if _ASARRAY.search(site):  # np.asarray(x) cannot hand back x (NumPy does not dispatch it): say to drop it
            raise TracerError(f"np.asarray()/np.array() of the traced value '{self.name}'{site} would freeze it "
                              "into a constant and drop its gradient: drop the call, a traced value already is "
                              "an array to NumPy's functions (np.asarray(x) -> x, np.array(x) -> x.copy(), a "
                              "list of traced values -> np.stack(...)), or use t.constant(x) when a constant "
                              "is really meant")
        raise TracerError(f"'{self.name}' is a traced value: {_CONVERSION}{user_site()}. Use the NumPy function "
                          "on the traced value instead (np.exp(x), not math.exp(x); np.stack/np.concatenate, not "
                          "filling an array), or t.constant(x) (gradcheck_core.tracer.constant(x)) when a "
                          "constant is really meant")

    # every way Python and NumPy turn an object into a number or a plain array: refused (see above)
    __float__ = __int__ = __index__ = __complex__ = __array__ = _refuse_conversion
    __round__ = __trunc__ = __floor__ = __ceil__ = _refuse_conversion

    # the comparison rule (module docstring): trace-time values, never nodes
    def __gt__(self, o): return self.tracer.compare(np.greater, self, o)
    def __ge__(self, o): return self.tracer.compare(np.greater_equal, self, o)
    def __lt__(self, o): return self.tracer.compare(np.less, self, o)
    def __le__(self, o): return self.tracer.compare(np.less_equal, self, o)
    def __eq__(self, o): return self.tracer.compare(np.equal, self, o)
    def __ne__(self, o): return self.tracer.compare(np.not_equal, self, o)
    __hash__ = object.__hash__  # hashable by identity: values are graph nodes

    @property
    def shape(self) -> tuple:
        return self.tracer._shapes[self.name]

    def __repr__(self) -> str:
        return f"<Value {self.name} shape={list(self.shape)}>"


def _attr_form(op: str, key: str, kind: str, v):
    """An attribute in the form the server's schema takes (graph/validate.py), decided here: NumPy's scalar for
    a list of integers (np.reshape(x, -1), np.broadcast_to(x, 4)) becomes the one-element list; a sequence where
    one integer is wanted is refused now, naming it, not later by the server."""
    if isinstance(v, tuple):
        v = list(v)
    if kind == "ints" and isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return [int(v)]
    if kind == "int" and isinstance(v, list):
        if len(v) == 1:
            return int(v[0])
        raise TracerError(f"op '{op}' takes one integer '{key}', got {v}{user_site()}")
    return v


def _plain(o):
    return o._known() if isinstance(o, Value) else o


class Tracer:
    def __init__(self, name: str = "", dtype: str = "float64"):
        self.name = name
        self.dtype = dtype
        self._inputs: list[tuple[_Node, bool, str]] = []
        self._nodes: list[tuple[_Node, str, list[_Node], dict]] = []
        self._names: set[str] = set()
        self._shapes: dict[str, tuple] = {}
        self._count = 0
        self._warned = False

    def _warn_branch(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn("a traced value decided a Python branch: the branch taken with these inputs is baked "
                          "into the graph (re-trace when the inputs would change it)", TracerWarning, stacklevel=3)

    def compare(self, ufunc, a, b) -> TracedBool:
        """The comparison rule: the trace-time values compared, as a boolean array (no node)."""
        out = np.asarray(ufunc(_plain(a), _plain(b))).view(TracedBool)
        out.tracer = self
        return out

    def fresh_name(self, prefix: str) -> str:
        """A name no value of this trace has yet, PREFIX_N (claimed: the next call gives another)."""
        while True:
            self._count += 1
            name = f"{prefix}_{self._count}"
            if name not in self._names:
                return name

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise TracerError(f"name '{name}' is already used in this trace")
        self._names.add(name)
        return name

    def _rename(self, v: Value, name: str) -> None:
        self._claim(name)
        self._names.discard(v.name)
        if v.name in self._shapes:
            self._shapes[name] = self._shapes.pop(v.name)
        v._node.name = name  # records refer to nodes; names are resolved when the graph is built

    def input(self, name: str, value, requires_grad: bool = False, dtype: str | None = None) -> Value:
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise TracerError(f"input '{name}': cannot use {arr.dtype} data in a trace{user_site()}")
        dtype = dtype or ({"b": "bool", "i": "int64", "u": "int64"}.get(arr.dtype.kind) or self.dtype)
        if requires_grad and not dtype.startswith("float"):
            # a gradient is checked only for float data: say so now, not at the server
            raise TracerError(f"parameter '{name}' has {dtype} data{user_site()}: a checked gradient needs float "
                              f"data (give floats, e.g. np.asarray(..., dtype=float), or make it an input)")
        node = _Node(self._claim(name), arr.astype({"bool": bool, "int64": np.int64}.get(dtype, np.float64)))
        self._shapes[name] = arr.shape
        self._inputs.append((node, requires_grad, dtype))
        return Value(self, node)

    def constant_input(self, v: Value) -> None:
        """Make the input `v` a constant of the graph: its requires_grad cleared (an opaque torch output autograd
        does not track: torch gives no gradient through it, gradcheck_client/torch/capture.py)."""
        self._inputs = [(n, False, d) if n is v._node else (n, g, d) for n, g, d in self._inputs]

    def param(self, name: str, value, dtype: str | None = None) -> Value:
        """An input whose gradient is checked (requires_grad). Integer data (`t.param("w", 3)`) is taken
        as the trace's float dtype: a parameter is always real-valued; booleans are refused."""
        if dtype is None and np.asarray(value).dtype.kind in "iu":
            dtype = self.dtype
        return self.input(name, value, requires_grad=True, dtype=dtype)

    def constant(self, value, name: str | None = None) -> Value:
        """A constant of the graph: NumPy data, or a traced value's trace-time value on purpose (no gradient
        flows through it: the graph records the number, as a stop-gradient would)."""
        if isinstance(value, Value):
            value = value._known()
        return self.input(name or self.fresh_name("const"), value)

    def _lift(self, x, kind: str = "float") -> Value:
        if isinstance(x, Value):
            if x.tracer is not self:
                raise TracerError(f"'{x.name}' belongs to another trace")
            return x
        arr = np.asarray(x)
        if arr.dtype.kind not in "biuf":
            raise TracerError(f"cannot use {type(x).__name__} {x!r} as a value in a trace")
        # a constant takes the kind the op wants at this input: a where mask bool, indices int64,
        # numbers the trace's float dtype
        return self.input(self.fresh_name("const"), arr, dtype=self.dtype if kind == "float" else kind)

    def apply(self, op: str, *inputs, name: str | None = None, **attrs) -> Value:
        """Record node `op` (any op in the server's registry) on `inputs` with `attrs`."""
        entry = OPS.get(op)
        if entry is None:
            raise UnknownOpError(f"op '{op}' is not in the server's registry (see `gradcheck-svc ops`); "
                                 "it cannot be traced")
        if entry["arity"] is not None and len(inputs) != entry["arity"] or entry["arity"] is None and not inputs:
            want = "at least 1" if entry["arity"] is None else entry["arity"]
            raise TracerError(f"op '{op}' takes {want} input(s), got {len(inputs)}")
        attrs = {k: v for k, v in attrs.items() if v is not None}
        unknown = sorted(set(attrs) - set(entry["attrs"]))
        missing = [k for k, d in entry["attrs"].items() if d is REQUIRED and k not in attrs]
        if unknown or missing:
            raise TracerError(f"op '{op}': " + "; ".join(
                ([f"unknown attribute(s) {', '.join(unknown)} (it takes: {', '.join(entry['attrs']) or 'none'})"]
                 if unknown else []) + ([f"missing attribute(s) {', '.join(missing)}"] if missing else [])))
        attrs = {k: _attr_form(op, k, entry["kinds"][k], v) for k, v in attrs.items()}
        kinds = entry["inputs"]
        xs = [self._lift(x, kinds[min(i, len(kinds) - 1)] if kinds else "float") for i, x in enumerate(inputs)]
        full = {k: d for k, d in entry["attrs"].items() if d is not REQUIRED} | attrs
        try:
            shape = output_shape(entry, [self._shapes[x.name] for x in xs], full)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            shapes = ", ".join(str(list(self._shapes[x.name])) for x in xs)
            raise TracerError(f"op '{op}' on shapes {shapes}: {exc}{user_site()}") from None
        value = None
        if op in _EAGER and all(x.value is not None for x in xs):
            with np.errstate(all="ignore"):
                value = np.asarray(_EAGER[op](*(x.value for x in xs), **attrs), dtype=np.float64)
        node = _Node(self._claim(name) if name else self.fresh_name(op), value)
        base = None
        if op in VIEW_OPS:  # NumPy gives a view here: in-place updates of either would reach the other
            base = xs[0]._base if xs[0]._base is not None else xs[0]
        out = Value(self, node, base)
        if base is not None:
            base._views[id(out)] = weakref.ref(out)
        self._shapes[node.name] = tuple(shape)
        self._nodes.append((node, op, [x._node for x in xs], attrs))
        return out

    def graph(self, loss: Value, name: str | None = None) -> graph_pb2.Graph:
        """The recorded graph with `loss` as output, pruned to what the loss depends on."""
        if not isinstance(loss, Value) or loss.tracer is not self:
            raise TracerError(f"the loss must be a value traced by this Tracer, got {type(loss).__name__} (does it "
                              "depend on any parameter?)")
        if loss.size != 1:
            # the server would refuse it; say how to reduce it here
            raise TracerError(f"the loss must be a scalar, got shape {list(loss.shape)}: reduce it (loss.sum(), "
                              "or gradcheck_svc.check(f, ...), which reduces it with a random cotangent)")
        producers = {id(n): (n, op, xs, attrs) for n, op, xs, attrs in self._nodes}
        needed, stack = set(), [loss._node]
        while stack:  # iterative: deep traces do not hit Python's recursion limit
            n = stack.pop()
            if id(n) in needed:
                continue
            needed.add(id(n))
            if id(n) in producers:
                stack.extend(producers[id(n)][2])
        msg = graph_pb2.Graph(name=name if name is not None else self.name, opset_version=1, output=loss.name)
        for n, requires_grad, dtype in self._inputs:
            if id(n) in needed:
                t = msg.inputs.add(name=n.name, requires_grad=requires_grad).value
                t.dtype, t.shape[:] = dtype, list(n.value.shape)
                t.data[:] = n.value.reshape(-1).astype(np.float64).tolist()
        for n, op, xs, attrs in self._nodes:
            if id(n) in needed:
                set_attrs(msg.nodes.add(name=n.name, op=op, inputs=[x.name for x in xs]), attrs)
        return msg


def constant(value) -> Value:
    """A traced value's trace-time value as a constant of its graph (see Tracer.constant): the explicit way to
    say "this number, not this function of the parameters"."""
    if not isinstance(value, Value):
        if faithful.PLAIN_RUN.get():  # check() running f on NumPy arrays: the number it marks
            return value
        raise TracerError("constant() takes a traced value (NumPy data needs no marking: it is a constant)")
    return value.tracer.constant(value)


class _Ops:
    """ops.NAME(*inputs, **attrs) records op NAME: every registry op, no list kept here."""

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)
        if op not in OPS:  # at trace time, naming it (not later, at the server)
            raise UnknownOpError(f"op '{op}' is not in the server's registry (see `gradcheck-svc ops`)")

        def record(*inputs, name: str | None = None, **attrs):
            tracers = {x.tracer for x in inputs if isinstance(x, Value)}
            if len(tracers) != 1:
                raise TracerError(f"ops.{op} needs traced values from exactly one Tracer")
            return tracers.pop().apply(op, *inputs, name=name, **attrs)

        record.__name__ = op
        return record


ops = _Ops()
tanh, exp, log, sigmoid, relu = ops.tanh, ops.exp, ops.log, ops.sigmoid, ops.relu
