"""NumPy calls on traced values become graph nodes: Value.__array_ufunc__/__array_function__.

Which NumPy function is which op comes from the generated table (op_values.OPS: an op's
`numpy` name, read from the server's registry), never a list kept here. NumPy's arguments
bind by NumPy's own signature: the op's inputs first, then its attributes by the same keyword
names. Anything the op cannot express (`out=`, `dtype=`, a NumPy default the op does not
share) fails at trace time, naming the NumPy function and the argument.
"""
from __future__ import annotations

import inspect

import numpy

from .op_values import OPS
from .trace_errors import TracerError

# NumPy function (ufunc or array function) -> op name; aliases resolve to the same object
BY_FUNCTION = {getattr(numpy, e["numpy"]): name for name, e in OPS.items() if e["numpy"]}
# comparisons give trace-time booleans by the documented rule (see tracer.py), not nodes
COMPARISONS = (numpy.greater, numpy.greater_equal, numpy.less, numpy.less_equal, numpy.equal, numpy.not_equal)


def _error(message: str) -> Exception:
    return TracerError(message)


def _function_name(fn) -> str:
    return f"numpy.{getattr(fn, '__name__', fn)}"


def ufunc_call(value, ufunc, method: str, inputs: tuple, kwargs: dict):
    if ufunc in COMPARISONS and method == "__call__" and not kwargs:
        return value.tracer.compare(ufunc, *inputs)
    op = BY_FUNCTION.get(ufunc)
    if op is None:
        raise _error(f"{_function_name(ufunc)} has no op in the server's registry: it cannot be traced "
                     "(see `gradcheck-svc ops`)")
    if method != "__call__" or kwargs:
        what = f"{_function_name(ufunc)}.{method}" if method != "__call__" else \
            f"{_function_name(ufunc)} with {', '.join(sorted(kwargs))}="
        raise _error(f"{what} cannot be traced: op '{op}' takes only its inputs")
    return value.tracer.apply(op, *inputs)


def function_call(value, func, args: tuple, kwargs: dict):
    op = BY_FUNCTION.get(func)
    if op is None:
        raise _error(f"{_function_name(func)} has no op in the server's registry: it cannot be traced "
                     "(see `gradcheck-svc ops`)")
    entry = OPS[op]
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except TypeError as exc:
        raise _error(f"{_function_name(func)}: {exc}") from None
    params = list(inspect.signature(func).parameters.values())
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
        if v is None:
            if entry["attrs"][p.name] is None:
                continue  # the same meaning on both sides (all axes)
            raise _error(f"{_function_name(func)} with {p.name}=None has no op equivalent (op '{op}' takes "
                         f"an explicit {p.name}): pass {p.name}")
        attrs[p.name] = list(v) if isinstance(v, tuple) else v
    return value.tracer.apply(op, *inputs, **attrs)
