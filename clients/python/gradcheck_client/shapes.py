"""Output shapes of traced ops, without the server: a few generic shape rules.

Which rule an op follows is not decided here: scripts/gen_client_ops.py tries these rules
against the server's own shape inference (every op's test cases, every attribute choice) and
writes the first that agrees into op_values.OPS; tests/test_client_ops_drift.py keeps that
table current. A new op whose shapes no rule reproduces fails the generator, by name.

Each rule: (input shapes, attributes with defaults filled in, the op's table entry) -> shape.
"""
from __future__ import annotations

import numpy as np

# a zero-stride array of any shape costs one element: enough to ask NumPy for a result's shape
_KIND_DTYPE = {"float": np.float64, "int64": np.int64, "bool": np.bool_}


def _stand_ins(shapes, kinds):
    return [np.broadcast_to(np.zeros((), _KIND_DTYPE[kinds[min(i, len(kinds) - 1)]]), s)
            for i, s in enumerate(shapes)]


def numpy_rule(shapes, attrs, entry):
    """The op's NumPy function (op_values.VALUES) on stand-ins of the inputs' shapes."""
    from .op_values import VALUES

    given = {k: v for k, v in attrs.items() if v is not None}
    with np.errstate(all="ignore"):
        return tuple(np.shape(VALUES[entry["name"]](*_stand_ins(shapes, entry["inputs"]), **given)))


def broadcast(shapes, attrs, entry):
    return tuple(np.broadcast_shapes(*shapes))


def same(shapes, attrs, entry):
    return tuple(shapes[0])


def scalar(shapes, attrs, entry):
    return ()


def reduce(shapes, attrs, entry):
    """Input 0 without the `axis` axes (all when None), kept as size 1 with keepdims."""
    shape, axis = tuple(shapes[0]), attrs.get("axis")
    r = len(shape)
    axes = range(r) if axis is None else [axis] if isinstance(axis, int) else axis
    axes = {a % r if r else a for a in axes}
    if attrs.get("keepdims"):
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def constant(shapes, attrs, entry):
    return tuple(np.shape(np.asarray(attrs["value"], dtype=np.float64)))


def onnx_slice(shapes, attrs, entry):
    """starts/ends/axes/steps, each entry a Python slice on its axis."""
    shape = tuple(shapes[0])
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = attrs.get("axes") or list(range(len(starts)))
    steps = attrs.get("steps") or [1] * len(starts)
    index = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        index[ax] = slice(st, en, sp)
    return tuple(len(range(*s.indices(d))) for s, d in zip(index, shape))


RULES = {"numpy": numpy_rule, "broadcast": broadcast, "same": same, "scalar": scalar, "reduce": reduce,
         "constant": constant, "slice": onnx_slice}


def output_shape(entry: dict, shapes: list, attrs: dict) -> tuple:
    return RULES[entry["shape"]](shapes, attrs, entry)
