"""A test-only array backend that fails where CuPy fails, on machines without a GPU.

`StrictArray` wraps a NumPy array and refuses everything CuPy refuses or silently turns into a
device-to-host copy: `__array__` / `np.asarray`, `float()` / `int()` / `bool()`, `.item()`,
`.tolist()`, iteration, mixing with NumPy arrays, and NumPy functions or ufuncs called on it.
`XP` is its array module: a forwarding layer over numpy that unwraps the arguments, runs
numpy, and wraps the results, so one op definition runs on it unchanged. The only way out is
`asnumpy` (CuPy's own explicit door), which `Backend.to_host` uses.

Selected with device "strict" (backend.get_backend); never offered to users (not a CLI choice,
not in GetServerInfo). It exists so that `make test` catches, on every commit, the implicit host
transfers that would raise or stall on a real GPU.
"""
from __future__ import annotations

import operator
import types
import weakref

import numpy as np

from .host_erf import numpy_erf

NAME = "strict"


class HostTransferError(TypeError):
    """An implicit device-to-host transfer, or a mix of device and host arrays (CuPy: TypeError)."""


def _refuse(what: str):
    raise HostTransferError(f"strict backend: {what} would copy a device array to the host "
                            "implicitly; use the backend's to_host")


def _unwrap(x, host_ok: bool = False):
    """StrictArray -> its ndarray (recursively in tuples/lists/dicts). A NumPy array here is a
    host array mixed into device code: refused unless host_ok (xp.asarray, the upload door)."""
    t = type(x)
    if t is StrictArray:
        return x._a
    if t is np.ndarray:
        if not host_ok:
            raise HostTransferError("strict backend: a NumPy array mixed with device arrays "
                                    "(CuPy refuses it; upload it with xp.asarray first)")
        return x
    if t is tuple or t is list:
        return t(_unwrap(v, host_ok) for v in x)
    if t is dict:
        return {k: _unwrap(v, host_ok) for k, v in x.items()}
    return x


_wrappers: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id(ndarray) -> its live wrapper


def _wrap_array(x: np.ndarray) -> StrictArray:
    """One wrapper per live ndarray, and a view's wrapper holds its base's: `a.base` is then the
    same object on every call, as on CuPy, so the engine's per-buffer byte counting (which
    follows `.base` by identity) sees one buffer, not one per wrapper."""
    w = _wrappers.get(id(x))
    if w is not None and w._a is x:
        return w
    w = StrictArray(x)
    if isinstance(x.base, np.ndarray):
        w._base = _wrap_array(x.base)
    _wrappers[id(x)] = w
    return w


def _wrap(x):
    """ndarray -> StrictArray; a NumPy scalar from a reduction -> 0-d StrictArray (CuPy's
    reductions return 0-d device arrays, not host scalars)."""
    if isinstance(x, np.ndarray):
        return _wrap_array(x)
    if isinstance(x, np.generic):
        return StrictArray(np.asarray(x))
    if type(x) is tuple or type(x) is list:
        return type(x)(_wrap(v) for v in x)
    return x


def _call(fn, args, kwargs, host_ok=False):
    with np.errstate(all="ignore"):  # CuPy never warns about inf/nan; neither does its stand-in
        return _wrap(fn(*_unwrap(args, host_ok), **_unwrap(kwargs, host_ok)))


# methods of the wrapped ndarray that hand host data out: refused
_HOST_METHODS = {"item", "tolist", "tobytes", "tofile", "dump", "dumps", "__array_interface__",
                 "__array_struct__", "ctypes", "data", "__dlpack__", "__buffer__"}


class StrictArray:
    __slots__ = ("_a", "_base", "__weakref__")
    __array_priority__ = 1000  # NumPy binary operators defer to ours

    def __init__(self, a: np.ndarray):
        self._a, self._base = a, None

    # --- what CuPy refuses (or silently syncs on) --------------------------------
    def __array__(self, *args, **kwargs):
        _refuse("np.asarray / __array__ of a device array")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # `np.float64(2) * a` reaches here (the scalar's operator runs first); CuPy computes it on
        # the device, and so do we. Any other NumPy ufunc on a device array is foreign code.
        if method == "__call__" and ufunc.nin == 2 and not kwargs \
                and any(isinstance(x, (np.generic, int, float, complex)) for x in inputs):
            return _call(ufunc, inputs, {})
        _refuse(f"the NumPy ufunc {ufunc.__name__}.{method} on a device array")

    def __array_function__(self, func, types, args, kwargs):
        _refuse(f"the NumPy function {func.__name__} on a device array")

    def __float__(self):
        _refuse("float() of a device array")

    def __int__(self):
        _refuse("int() of a device array")

    def __index__(self):
        _refuse("using a device array as a Python int")

    def __complex__(self):
        _refuse("complex() of a device array")

    def __bool__(self):
        _refuse("bool() of a device array (an `if` or `and` on array data)")

    def __iter__(self):
        _refuse("iterating over a device array")

    def get(self):
        _refuse("a.get()")

    def __repr__(self):
        return f"StrictArray(shape={self._a.shape}, dtype={self._a.dtype})"

    # --- metadata: host-side on CuPy too --------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T))
    base = property(lambda self: self._base)

    def __len__(self):
        return len(self._a)

    def __getattr__(self, name):
        if name in _HOST_METHODS:
            _refuse(f"a.{name}")
        attr = getattr(self._a, name)
        if callable(attr):
            return lambda *args, **kwargs: _call(attr, args, kwargs)
        return _wrap(attr)

    def __getitem__(self, index):
        return _call(operator.getitem, (self, index), {})

    def __setitem__(self, index, value):
        with np.errstate(all="ignore"):
            self._a[_unwrap(index)] = _unwrap(value)

    def __deepcopy__(self, memo):
        return StrictArray(self._a.copy())


def _binary(op):
    def forward(self, other):
        return _call(op, (self, other), {})

    def reflected(self, other):
        return _call(op, (other, self), {})

    def inplace(self, other):
        with np.errstate(all="ignore"):
            self._a = op(self._a, _unwrap(other))  # numpy's in-place op returns the same array
        return self
    return forward, reflected, inplace


for _name, _op, _iop in [("add", operator.add, operator.iadd), ("sub", operator.sub, operator.isub),
                         ("mul", operator.mul, operator.imul), ("truediv", operator.truediv, operator.itruediv),
                         ("floordiv", operator.floordiv, operator.ifloordiv), ("mod", operator.mod, operator.imod),
                         ("pow", operator.pow, operator.ipow), ("matmul", operator.matmul, operator.imatmul),
                         ("and", operator.and_, operator.iand), ("or", operator.or_, operator.ior),
                         ("xor", operator.xor, operator.ixor), ("lshift", operator.lshift, operator.ilshift),
                         ("rshift", operator.rshift, operator.irshift)]:
    _f, _r, _ = _binary(_op)
    _, _, _i = _binary(_iop)
    setattr(StrictArray, f"__{_name}__", _f)
    setattr(StrictArray, f"__r{_name}__", _r)
    setattr(StrictArray, f"__i{_name}__", _i)
for _name, _op in [("lt", operator.lt), ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge),
                   ("eq", operator.eq), ("ne", operator.ne)]:
    setattr(StrictArray, f"__{_name}__", _binary(_op)[0])
for _name, _op in [("neg", operator.neg), ("pos", operator.pos), ("abs", operator.abs),
                   ("invert", operator.invert)]:
    setattr(StrictArray, f"__{_name}__", (lambda op: lambda self: _call(op, (self,), {}))(_op))
StrictArray.__hash__ = None  # arrays are unhashable (and __eq__ is elementwise)


class _Forward:
    """A numpy object (a function, ufunc or submodule) seen through the strict layer."""

    def __init__(self, target, host_ok=False):
        self._target, self._host_ok = target, host_ok

    def __call__(self, *args, **kwargs):
        return _call(self._target, args, kwargs, self._host_ok)

    def __getattr__(self, name):
        return _forward(getattr(self._target, name))


def _forward(attr, host_ok=False):
    if isinstance(attr, type) or isinstance(attr, np.dtype) or not (callable(attr) or hasattr(attr, "__dict__")):
        return attr  # dtypes and scalar types (xp.float64, xp.uint64), constants (xp.pi, xp.newaxis)
    return _Forward(attr, host_ok)


class StrictModule(types.ModuleType):
    """The `xp` of the strict backend: numpy's API, on StrictArrays only. A real module object
    with every numpy name in its __dict__, because SymPy's lambdify reads a module's __dict__."""

    def __init__(self):
        super().__init__(NAME)
        for name in dir(np):
            if name.startswith("_") or name in ("asnumpy", "errstate", "frompyfunc", "vectorize"):
                continue
            try:
                target = getattr(np, name)
            except AttributeError:  # deprecated aliases that raise on access
                continue
            setattr(self, name, _forward(target, host_ok=name in ("asarray", "array")))  # the upload door
        self.ndarray = StrictArray

    @staticmethod
    def asnumpy(a) -> np.ndarray:
        """The one explicit device-to-host door (cupy.asnumpy)."""
        if isinstance(a, StrictArray):
            return a._a.copy()
        if isinstance(a, np.ndarray):
            return a
        _refuse(f"asnumpy of a {type(a).__name__}")


XP = StrictModule()


def _strict_erf(x):
    return _wrap(numpy_erf(_unwrap(x)))  # numpy's erf, on the unwrapped array


StrictModule.strict_erf = staticmethod(_strict_erf)
