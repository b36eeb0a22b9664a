"""Issue 34 item 1: every NumPy function the tracer mirrors, across its argument forms, is NumPy's function.

The functions are read from the tracer's own tables (numpy_protocol.BY_FUNCTION: the registry's NumPy
names; numpy_compose.COMPOSED and METHODS): one without argument forms here fails the coverage test, so a
new one cannot go untested. Elementwise ufuncs get their forms generated (same shape, broadcasting,
scalars on either side); the others list theirs: axes as None, ints, negative ints, tuples and lists, shifts
and indices of both signs, sections that do not divide evenly.

Each form runs twice. As a value: the engine's own forward of the traced graph (every element of the output,
not a loss) equals NumPy's on the same array, or NumPy raises and the tracer raises too. Then view/copy
semantics: the result is updated in place (`y += 1`) and both the input and the result are compared with
NumPy's -- a view must write through to the input, a copy must not; the tracer may refuse (TracerError)
only where NumPy's result shares the input's memory (an update through a view it does not follow)."""
from __future__ import annotations

import numpy as np
import pytest

from gradcheck_client import Tracer
from gradcheck_core.numpy_compose import COMPOSED, METHODS
from gradcheck_core.numpy_protocol import BY_FUNCTION
from gradcheck_core.op_values import OPS
from gradcheck_core.trace_errors import TracerError
from gradcheck_core.traced import Traced
from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, forward, prepare_feeds
from gradcheck_svc.graph import load_graph

R = np.random.default_rng(34)
ARRAYS = {  # positive, distinct values: inside every elementwise op's domain, no ties for sort and max
    "A": R.permutation(24).reshape(2, 3, 4) / 30 + 0.1,
    "B": R.permutation(6).reshape(2, 1, 3) / 8 + 0.2,
    "M": R.permutation(9).reshape(3, 3) / 20 + np.eye(3),
    "V": R.permutation(5) / 7 + 0.1,
}
ROW, COL = np.linspace(0.3, 0.8, 4), np.linspace(0.2, 0.9, 3).reshape(3, 1)


def _name(fn) -> str:
    return getattr(fn, "__name__", str(fn))


# --- the forms --------------------------------------------------------------------------------------

UNARY = sorted(_name(f) for f, op in BY_FUNCTION.items()
               if OPS[op]["arity"] == 1 and OPS[op]["shape"] == "numpy" and not OPS[op]["attrs"]
               and "." not in OPS[op]["numpy"] and _name(f) not in ("isnan", "isinf", "logical_not")) + \
    ["cosh", "sinh", "tan", "exp2", "log2", "log10", "degrees", "rad2deg", "radians", "deg2rad", "fabs",
     "reciprocal", "positive"]
BINARY = sorted(_name(f) for f, op in BY_FUNCTION.items()
                if OPS[op]["arity"] == 2 and OPS[op]["shape"] == "numpy" and not OPS[op]["attrs"]
                and _name(f) not in ("matmul", "logical_and", "logical_or", "logical_xor")) + ["logaddexp"]


def _unary(name):
    f = getattr(np, name)
    return [("A", lambda x: f(x)), ("V", lambda x: f(x[1:]))]


def _binary(name):
    f = getattr(np, name)
    return [("A", lambda x: f(x, x[::-1])), ("A", lambda x: f(x, ROW)), ("A", lambda x: f(COL, x)),
            ("A", lambda x: f(x, 0.5)), ("A", lambda x: f(0.5, x)), ("B", lambda x: f(x, x.reshape(2, 3, 1)))]


def _reduction(name):
    f = getattr(np, name)
    return [("A", lambda x: f(x)), ("A", lambda x: f(x, axis=0)), ("A", lambda x: f(x, axis=-1)),
            ("A", lambda x: f(x, axis=(0, 2))), ("A", lambda x: f(x, axis=(-1, 0), keepdims=True)),
            ("A", lambda x: f(x, axis=[0, 2])), ("A", lambda x: f(x, axis=None, keepdims=True)),
            ("A", lambda x: f(x, axis=3))]


def _argsort_last(x):
    return np.argsort(np.asarray(ARRAYS["A"]), axis=-1)


FORMS = {
    **{n: _unary(n) for n in UNARY},
    **{n: _binary(n) for n in BINARY},
    **{n: _reduction(n) for n in ("sum", "mean", "max", "min", "prod")},
    "isnan": [("A", lambda x: np.where(np.isnan(x), 0.0, x))],
    "isinf": [("A", lambda x: np.where(np.isinf(x), 0.0, x))],
    "logical_not": [("A", lambda x: np.where(np.logical_not(np.isnan(x)), x, 0.0))],
    "logical_and": [("A", lambda x: np.where(np.logical_and(np.isnan(x), np.isinf(x)), 0.0, x))],
    "logical_or": [("A", lambda x: np.where(np.logical_or(np.isnan(x), np.isinf(x)), 0.0, x))],
    "logical_xor": [("A", lambda x: np.where(np.logical_xor(np.isnan(x), np.isinf(x)), 0.0, x))],
    "matmul": [("A", lambda x: x @ ARRAYS["A"].transpose(0, 2, 1)), ("A", lambda x: np.matmul(x, ROW)),
               ("V", lambda x: np.matmul(x[:4], x[1:])), ("M", lambda x: np.matmul(COL.T, x))],
    "broadcast_to": [("V", lambda x: np.broadcast_to(x, (2, 5))), ("B", lambda x: np.broadcast_to(x, (4, 2, 2, 3))),
                     ("V", lambda x: np.broadcast_to(x[:1], 3)), ("V", lambda x: np.broadcast_to(x, (5, 2)))],
    "concatenate": [("A", lambda x: np.concatenate([x, x * 2])), ("A", lambda x: np.concatenate([x, x], axis=-1)),
                    ("A", lambda x: np.concatenate((x, x[:, :1]), axis=1)),
                    ("A", lambda x: np.concatenate([x, x], axis=None)),
                    ("A", lambda x: np.concatenate([x, x], axis=3))],
    "expand_dims": [("A", lambda x: np.expand_dims(x, 0)), ("A", lambda x: np.expand_dims(x, -1)),
                    ("A", lambda x: np.expand_dims(x, (0, 4))), ("A", lambda x: np.expand_dims(x, (-1, 1)))],
    "reshape": [("A", lambda x: np.reshape(x, -1)), ("A", lambda x: np.reshape(x, (4, -1))),
                ("A", lambda x: np.reshape(x, [6, 4])), ("A", lambda x: x.reshape(3, 8)),
                ("A", lambda x: np.reshape(x, (5, -1)))],
    "squeeze": [("B", lambda x: np.squeeze(x)), ("B", lambda x: np.squeeze(x, axis=1)),
                ("B", lambda x: np.squeeze(x, axis=-2)), ("B", lambda x: np.squeeze(x, axis=(1,))),
                ("B", lambda x: np.squeeze(x, axis=0))],
    "take": [("A", lambda x: np.take(x, [0, 2], axis=1)), ("A", lambda x: np.take(x, [-1, 0, 0], axis=-1)),
             ("A", lambda x: np.take(x, [[1], [0]], axis=0)), ("A", lambda x: np.take(x, [3], axis=1))],
    "take_along_axis": [("A", lambda x: np.take_along_axis(x, _argsort_last(x), axis=-1)),
                        ("A", lambda x: np.take_along_axis(x, np.zeros((1, 3, 4), dtype=np.int64), axis=0))],
    "tile": [("V", lambda x: np.tile(x, 2)), ("B", lambda x: np.tile(x, (2, 1))),
             ("V", lambda x: np.tile(x, (2, 1, 3))), ("B", lambda x: np.tile(x, [1, 2, 1]))],
    "transpose": [("A", lambda x: np.transpose(x)), ("A", lambda x: np.transpose(x, (2, 0, 1))),
                  ("A", lambda x: np.transpose(x, (-1, 0, 1))), ("A", lambda x: x.transpose(1, 0, 2)),
                  ("A", lambda x: x.T), ("A", lambda x: np.transpose(x, [0, 1]))],
    "where": [("A", lambda x: np.where(x > 0.5, x, 0.0)), ("A", lambda x: np.where(x > 0.5, 1.0, x)),
              ("A", lambda x: np.where(ROW > 0.5, x, x * 2))],
    "det": [("M", lambda x: np.linalg.det(x))],
    "inv": [("M", lambda x: np.linalg.inv(x))],
    "solve": [("M", lambda x: np.linalg.solve(x, COL)), ("M", lambda x: np.linalg.solve(x, COL.reshape(-1)))],
    "array_split": [("A", lambda x: np.array_split(x, 2)), ("A", lambda x: np.array_split(x, 3, axis=1)),
                    ("A", lambda x: np.array_split(x, 3, axis=-1)), ("A", lambda x: np.array_split(x, [1, -1], axis=2)),
                    ("A", lambda x: np.array_split(x, [-2, 5], axis=-1)),
                    ("A", lambda x: np.array_split(x, [3, 1], 1))],
    "split": [("A", lambda x: np.split(x, 2)), ("A", lambda x: np.split(x, [1, 3], axis=-1)),
              ("A", lambda x: np.split(x, [-1], axis=1)), ("A", lambda x: np.split(x, 3, axis=2))],
    "clip": [("A", lambda x: np.clip(x, 0.3, 0.6)), ("A", lambda x: np.clip(x, None, 0.5)),
             ("A", lambda x: np.clip(x, ROW, 0.7)), ("A", lambda x: x.clip(0.2, 0.5)),
             ("A", lambda x: np.clip(x, 0.6, 0.3))],  # a_min > a_max: all a_max, as NumPy allows
    # issue 44: // and % (the operators dispatch to these) as NumPy's floor(a / b) and a - b floor(a / b)
    "floor_divide": _binary("floor_divide") + [("A", lambda x: x // 0.07), ("A", lambda x: 1.0 // x)],
    "remainder": _binary("remainder") + [("A", lambda x: x % 0.07), ("A", lambda x: 1.0 % x),
                                         ("A", lambda x: x % -0.07)],
    "column_stack": [("V", lambda x: np.column_stack([x, x * 2])), ("M", lambda x: np.column_stack((x, x[:, 0])))],
    "hstack": [("V", lambda x: np.hstack([x, x[:2]])), ("M", lambda x: np.hstack((x, x)))],
    "vstack": [("V", lambda x: np.vstack([x, x])), ("M", lambda x: np.vstack((x, x[:1])))],
    "stack": [("A", lambda x: np.stack([x, x])), ("A", lambda x: np.stack([x, x * 2], axis=-1)),
              ("A", lambda x: np.stack((x, x), axis=2)), ("A", lambda x: np.stack([x, x], axis=-4))],
    "copy": [("A", lambda x: np.copy(x)), ("A", lambda x: x.copy())],
    "cumsum": [("A", lambda x: np.cumsum(x)), ("A", lambda x: np.cumsum(x, axis=0)),
               ("A", lambda x: np.cumsum(x, axis=-1)), ("B", lambda x: np.cumsum(x, axis=1)),
               ("A", lambda x: x.cumsum(1))],
    "diag": [("V", lambda x: np.diag(x)), ("V", lambda x: np.diag(x, k=1)), ("V", lambda x: np.diag(x, -2)),
             ("M", lambda x: np.diag(x)), ("M", lambda x: np.diag(x, k=-1))],
    "diagonal": [("M", lambda x: np.diagonal(x)), ("M", lambda x: np.diagonal(x, offset=1)),
                 ("M", lambda x: x.diagonal(-1))],
    "dot": [("V", lambda x: np.dot(x, x)), ("M", lambda x: np.dot(x, COL)), ("A", lambda x: np.dot(x, ROW)),
            ("A", lambda x: np.dot(x, ARRAYS["A"].transpose(1, 2, 0))), ("M", lambda x: x.dot(x)),
            ("V", lambda x: np.dot(x, 2.0))],
    "inner": [("V", lambda x: np.inner(x, x)), ("A", lambda x: np.inner(x, ROW)), ("M", lambda x: np.inner(x, x))],
    "outer": [("V", lambda x: np.outer(x, x[:3])), ("M", lambda x: np.outer(x, ROW))],
    "vdot": [("M", lambda x: np.vdot(x, x.T))],
    "tensordot": [("A", lambda x: np.tensordot(x, ARRAYS["A"], axes=([1, 2], [1, 2]))),
                  ("A", lambda x: np.tensordot(x, ROW, axes=1)),
                  ("A", lambda x: np.tensordot(x, ARRAYS["A"], axes=([-1, 0], [2, 0]))),
                  ("M", lambda x: np.tensordot(x, x, axes=0))],
    "einsum": [("A", lambda x: np.einsum("ijk,k->ij", x, ROW)), ("A", lambda x: np.einsum("ijk->kj", x)),
               ("M", lambda x: np.einsum("ij,jk", x, x)), ("M", lambda x: np.einsum("ii->i", x)),
               ("A", lambda x: np.einsum("bij,bkj->bik", x, x)), ("M", lambda x: np.einsum("ij", x)),
               ("M", lambda x: np.einsum("ij->ji", x))],  # one operand: NumPy's result is a view of it
    "flip": [("A", lambda x: np.flip(x)), ("A", lambda x: np.flip(x, 0)), ("A", lambda x: np.flip(x, axis=-1)),
             ("A", lambda x: np.flip(x, (0, 2))), ("A", lambda x: np.flip(x, axis=()))],
    "fliplr": [("A", lambda x: np.fliplr(x))],
    "flipud": [("A", lambda x: np.flipud(x))],
    "moveaxis": [("A", lambda x: np.moveaxis(x, 0, -1)), ("A", lambda x: np.moveaxis(x, -1, 0)),
                 ("A", lambda x: np.moveaxis(x, (0, 1), (2, 0))), ("A", lambda x: np.moveaxis(x, 1, 1))],
    "swapaxes": [("A", lambda x: np.swapaxes(x, 0, -1)), ("A", lambda x: x.swapaxes(1, 2)),
                 ("A", lambda x: np.swapaxes(x, 1, 1))],
    "norm": [("V", lambda x: np.linalg.norm(x)), ("M", lambda x: np.linalg.norm(x)),
             ("A", lambda x: np.linalg.norm(x, axis=-1)), ("A", lambda x: np.linalg.norm(x, axis=(0, 2))),
             ("V", lambda x: np.linalg.norm(x, ord=1)), ("V", lambda x: np.linalg.norm(x, ord=np.inf)),
             ("A", lambda x: np.linalg.norm(x, ord=2, axis=1, keepdims=True)),
             ("M", lambda x: np.linalg.norm(x, ord="fro")), ("M", lambda x: np.linalg.norm(x, ord=2))],
    "pad": [("A", lambda x: np.pad(x, 1)), ("A", lambda x: np.pad(x, ((1, 0), (0, 2), (1, 1)))),
            ("M", lambda x: np.pad(x, (2, 1), mode="reflect")), ("M", lambda x: np.pad(x, 1, mode="edge")),
            ("M", lambda x: np.pad(x, ((0, 2), (1, 0)), mode="wrap")),
            ("M", lambda x: np.pad(x, 1, constant_values=0.5))],
    "repeat": [("A", lambda x: np.repeat(x, 2)), ("A", lambda x: np.repeat(x, [1, 0, 2], axis=1)),
               ("A", lambda x: np.repeat(x, 2, axis=-1)), ("A", lambda x: x.repeat(3, axis=0))],
    "roll": [("A", lambda x: np.roll(x, 1)), ("A", lambda x: np.roll(x, -5)), ("A", lambda x: np.roll(x, 2, axis=1)),
             ("A", lambda x: np.roll(x, -1, axis=-1)), ("A", lambda x: np.roll(x, (1, 2), axis=0)),
             ("A", lambda x: np.roll(x, [1, -2], axis=(0, 2))), ("A", lambda x: np.roll(x, (1, 2))),
             ("A", lambda x: np.roll(x, 3, axis=(1, 2))), ("A", lambda x: np.roll(x, 4, axis=2)),
             ("A", lambda x: np.roll(x, 24)), ("A", lambda x: np.roll(x, (1, 2, 3), axis=(0, 1)))],
    "rot90": [("A", lambda x, k=k: np.rot90(x, k)) for k in range(-1, 6)] +
             [("A", lambda x: np.rot90(x, 1, axes=(1, 2))), ("A", lambda x: np.rot90(x, 3, axes=(-1, 0)))],
    "sort": [("A", lambda x: np.sort(x)), ("A", lambda x: np.sort(x, axis=0)), ("A", lambda x: np.sort(x, axis=None))],
    "std": [("A", lambda x: np.std(x)), ("A", lambda x: np.std(x, axis=-1, ddof=1)),
            ("A", lambda x: np.std(x, axis=(0, 2), keepdims=True)), ("A", lambda x: x.std(0))],
    "var": [("A", lambda x: np.var(x)), ("A", lambda x: np.var(x, axis=1, ddof=1)),
            ("A", lambda x: np.var(x, axis=(-1, 0))), ("A", lambda x: x.var(axis=2, keepdims=True))],
    "trace": [("M", lambda x: np.trace(x)), ("M", lambda x: np.trace(x, offset=1)), ("M", lambda x: x.trace(-1))],
    "triu": [("M", lambda x: np.triu(x)), ("M", lambda x: np.triu(x, 1)), ("A", lambda x: np.triu(x, -1))],
    "tril": [("M", lambda x: np.tril(x)), ("M", lambda x: np.tril(x, -1)), ("A", lambda x: np.tril(x, 2))],
    "ravel": [("A", lambda x: np.ravel(x)), ("A", lambda x: x.ravel())],
    # ndarray methods (METHODS) not already named above
    "astype": [("A", lambda x: x.astype(float)), ("A", lambda x: x.astype(np.float64, copy=False))],
    "flatten": [("A", lambda x: x.flatten())],
    "methods": [("A", lambda x: x.prod(axis=1)), ("B", lambda x: x.squeeze()), ("A", lambda x: x.sum(axis=(0, 1))),
                ("A", lambda x: x.max(-1, keepdims=True)), ("A", lambda x: x.mean(axis=[0]))],
}


def _methods_covered():
    """Method names the forms call (x.name(...)), read from their source."""
    import inspect

    names = set()
    for forms in FORMS.values():
        for _, fn in forms:
            src = inspect.getsource(fn)
            names |= {m for m in METHODS if f"x.{m}(" in src}
    return names


def test_every_mirrored_function_and_method_has_argument_forms():
    functions = {_name(f) for f in BY_FUNCTION} | {_name(f) for f in COMPOSED}
    assert functions - set(FORMS) == set()
    assert set(METHODS) - _methods_covered() - {"sort"} == set()  # x.sort() in place: refused, see below


# --- running a form -----------------------------------------------------------------------------------


def _flat(out):
    """A result as one flat array (NumPy or traced: np.concatenate dispatches to the tracer)."""
    parts = list(out) if isinstance(out, list) else [out]
    return np.concatenate([np.ravel(p) * 1.0 for p in parts]) if len(parts) > 1 else np.ravel(parts[0]) * 1.0


def _updated(fn):
    """fn, then every piece of its result updated in place; the input and the pieces after it, flat."""
    def run(x):
        out = fn(x)
        pieces = list(out) if isinstance(out, list) else [out]
        for p in pieces:
            p += 1.0
        return np.concatenate([np.ravel(x) * 1.0] + [np.ravel(p) * 1.0 for p in pieces])
    return run


def _engine_value(fn, x):
    """The engine's forward of the traced fn(x): every element (a node's kept value, not the loss)."""
    t = Tracer("form")
    out = fn(t.param("x", x))
    if not isinstance(out, Traced):  # no node: a trace-time constant (the comparison rule)
        return np.asarray(out, dtype=np.float64)
    c = np.linspace(0.5, 1.5, out.size).reshape(out.shape) if out.shape else 1.0
    program = Program(load_graph(t.graph((out * c).sum())), np.float64)
    values = forward(program, NUMPY, prepare_feeds(program, NUMPY), grad=False, keep_values=True).values
    return np.asarray(values[out.name], dtype=np.float64)


def _numpy(fn, x):
    try:
        return fn(x.copy()), None
    except Exception as exc:  # noqa: BLE001  (NumPy refuses the form: so must the tracer)
        return None, exc


CASES = [pytest.param(name, k, id=f"{name}-{k}") for name in sorted(FORMS) for k in range(len(FORMS[name]))]


@pytest.mark.parametrize("name, k", CASES)
def test_the_traced_form_computes_numpys_value(name, k):
    shape, fn = FORMS[name][k]
    x = ARRAYS[shape]
    want, refused = _numpy(lambda a: _flat(fn(a)), x)
    if refused is not None:
        with pytest.raises(Exception):  # noqa: B017  (NumPy's own error or the tracer's)
            _engine_value(lambda v: _flat(fn(v)), x)
        return
    try:
        got = _engine_value(lambda v: _flat(fn(v)), x)
    except TracerError:
        return  # refused, naming the construct: never a different function (test_trace_faithful.py)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name, k", CASES)
def test_an_in_place_update_of_the_result_reaches_the_input_exactly_as_in_numpy(name, k):
    shape, fn = FORMS[name][k]
    x = ARRAYS[shape]
    out, refused = _numpy(fn, x)
    if refused is not None or any(np.asarray(p).dtype.kind != "f" for p in (out if isinstance(out, list) else [out])):
        return  # the form itself is refused (above), or its result is no float array to update
    if not all(isinstance(p, np.ndarray) for p in (out if isinstance(out, list) else [out])):
        return  # a NumPy scalar (np.sum(x)): += makes a new one in both, nothing to alias
    try:
        _engine_value(lambda v: _flat(fn(v)), x)
    except TracerError:
        return  # the form itself is refused by the tracer (the test above allows it)
    want, refused = _numpy(_updated(fn), x)
    if refused is not None:  # NumPy refuses the update (a read-only view: diagonal, broadcast_to)
        with pytest.raises(TracerError):
            _engine_value(_updated(fn), x)
        return
    try:
        got = _engine_value(_updated(fn), x)
    except TracerError as exc:
        y = x.copy()
        pieces = fn(y)
        views = any(np.shares_memory(p, y) for p in (pieces if isinstance(pieces, list) else [pieces]))
        assert views and "view" in str(exc), f"refused an update NumPy makes on a copy: {exc}"
        return
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_sorting_a_traced_value_in_place_is_refused_naming_the_function():
    t = Tracer()
    with pytest.raises(TracerError, match=r"x = np.sort\(x\)"):
        t.param("x", ARRAYS["V"]).sort()
