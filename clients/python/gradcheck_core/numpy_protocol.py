"""NumPy calls on traced values become graph nodes: Value.__array_ufunc__/__array_function__.

Which NumPy function is which op comes from the generated table (op_values.OPS: an op's
`numpy` name, read from the server's registry), never a list kept here. NumPy's arguments
bind by NumPy's own signature: the op's inputs first, then its attributes by the same keyword
names. Anything the op cannot express (`out=`, `dtype=`, a NumPy default the op does not
share) fails at trace time, naming the NumPy function and the argument.
"""
from __future__ import annotations

import functools
import inspect

import numpy

from . import numpy_compose
from .op_values import OPS
from .trace_errors import TracerError, numpy_caller, user_site
from .traced import Traced

def _numpy_function(dotted: str):
    """numpy.NAME, or numpy.linalg.NAME for 'linalg.NAME'."""
    fn = numpy
    for part in dotted.split("."):
        fn = getattr(fn, part)
    return fn


# NumPy function (ufunc or array function) -> op name; aliases resolve to the same object
BY_FUNCTION = {_numpy_function(e["numpy"]): name for name, e in OPS.items() if e["numpy"]}
# comparisons give trace-time booleans by the documented rule (see tracer.py), not nodes
COMPARISONS = (numpy.greater, numpy.greater_equal, numpy.less, numpy.less_equal, numpy.equal, numpy.not_equal)


def _error(message: str) -> Exception:
    return TracerError(message + user_site())


def _function_name(fn) -> str:
    """NumPy's public name of a function (numpy.linalg.norm, not numpy.norm), and the NumPy code that called
    it when that is not the user's own line (np.r_[...] reaches us as numpy.ndim)."""
    module = getattr(fn, "__module__", None) or "numpy"
    name = f"{module}.{getattr(fn, '__name__', fn)}"
    outer = numpy_caller()
    return f"{name} (called inside NumPy's {outer})" if outer else name


def _own_arrays(out, args):
    """A composition's result that is a view only of one of its own intermediate nodes (tensordot's final
    reshape of a matmul) is a new array to the caller, as NumPy's result is: detached, so that updating it in
    place is not refused as an update through a view. A view of the caller's own arrays stays one."""
    given = set()
    for a in args:
        for v in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(v, Traced):
                given.add(id(v._base if v._base is not None else v))
    for y in (out if isinstance(out, list) else (out,)):
        if isinstance(y, Traced) and y._base is not None and id(y._base) not in given:
            y.detach()
    return out


def method(name: str):
    """An ndarray method a traced value answers as NumPy's function of the same name, or None."""
    return numpy_compose.METHODS.get(name) if not name.startswith("_") else None


def _out_refused(ufunc, kwargs) -> Exception:
    return _error(f"{_function_name(ufunc)} with out=: writing a traced value into an existing array (out=, or an "
                  "in-place operator on a NumPy array such as `a += x`) would freeze it into a constant. Build "
                  "a new array instead (`a = a + x`), or use t.constant(x) when a constant is really meant")


def ufunc_call(value, ufunc, method: str, inputs: tuple, kwargs: dict):
    if ufunc in COMPARISONS and method == "__call__" and not kwargs:
        return value.tracer.compare(ufunc, *inputs)
    if "out" in kwargs:
        raise _out_refused(ufunc, kwargs)
    composed = numpy_compose.COMPOSED.get(ufunc)
    if composed is not None and method == "__call__" and not kwargs:
        return _own_arrays(composed(value.tracer, *inputs), inputs)
    op = BY_FUNCTION.get(ufunc)
    if op is None:
        raise _error(f"{_function_name(ufunc)}{'' if method == '__call__' else '.' + method} has no op in the "
                     "server's registry: it cannot be traced (see `gradcheck-svc ops`)")
    if method != "__call__" or kwargs:
        what = f"{_function_name(ufunc)}.{method}" if method != "__call__" else \
            f"{_function_name(ufunc)} with {', '.join(sorted(kwargs))}="
        raise _error(f"{what} cannot be traced: op '{op}' takes only its inputs")
    return value.tracer.apply(op, *inputs)


@functools.lru_cache(maxsize=None)
def _signature(func) -> inspect.Signature:
    """NumPy's function's signature, read once per process (inspect.signature: ~0.1 ms a call, 17 ms of a GRU's
    capture, whose every op asks)."""
    return inspect.signature(func)


def function_call(value, func, args: tuple, kwargs: dict):
    composed = numpy_compose.COMPOSED.get(func)
    if composed is not None:
        try:
            bound = _signature(func).bind(*args, **kwargs)
        except TypeError as exc:
            raise _error(f"{_function_name(func)}: {exc}") from None
        return _own_arrays(composed(value.tracer, *bound.args, **bound.kwargs), args)
    op = BY_FUNCTION.get(func)
    if op is None:
        raise _error(f"{_function_name(func)} has no op in the server's registry: it cannot be traced "
                     "(see `gradcheck-svc ops`)")
    entry = OPS[op]
    try:
        bound = _signature(func).bind(*args, **kwargs)
    except TypeError as exc:
        raise _error(f"{_function_name(func)}: {exc}") from None
    params = list(_signature(func).parameters.values())
    given = bound.arguments
    if entry["arity"] is None:  # variadic: NumPy takes the inputs as one sequence
        inputs, rest = list(given[params[0].name]), params[1:]
    else:
        inputs, rest = [given[p.name] for p in params[:entry["arity"]] if p.name in given], params[entry["arity"]:]
    attrs = {}
    for p in rest:
        if p.name not in entry["attrs"]:
            if p.name in given and given[p.name] is not p.default:
                raise _error(f"{_function_name(func)}: argument '{p.name}' cannot be traced (op '{op}' has no "
                             "such attribute)")
            continue
        if p.name in given:
            v = given[p.name]
        elif p.default is inspect.Parameter.empty or p.default is numpy._NoValue:
            continue  # NumPy has no default of its own here: the op's applies
        else:
            v = p.default  # NumPy's default, made explicit: the op's may differ (numpy.take's axis)
        if p.name == "axis" and isinstance(v, list) and func is not numpy.expand_dims:
            raise _error(f"{_function_name(func)}: axis {v} is a list, which NumPy refuses here (TypeError: 'list' "
                         "object cannot be interpreted as an integer): pass an int or a tuple")
        if v is None:
            if entry["attrs"][p.name] is None:
                continue  # the same meaning on both sides (all axes)
            raise _error(f"{_function_name(func)} with {p.name}=None has no op equivalent (op '{op}' takes "
                         f"an explicit {p.name}): pass {p.name}")
        attrs[p.name] = list(v) if isinstance(v, tuple) else v
    return value.tracer.apply(op, *inputs, **attrs)
