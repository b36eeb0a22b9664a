"""An array module (`xp`) whose arrays are NumPy object arrays of SymPy expressions.

Non-elementwise ops (matmul, reductions, softmax, losses, shape ops,
indexing, constants) get their scalarized symbolic form by running their own
`forward(xp, ...)` with this module as `xp`: one op stays defined in one place
and the oracle never needs a second, hand-written copy of its semantics.
Shape functions are NumPy's own (they work on object arrays); arithmetic goes
through SymPy's operators; the elementwise functions are the registry's own
SymPy forms under their NumPy names (ops/functions.py).

Sums are built flat (`Add(*row)`), and max/min as a balanced tree of binary
Max/Min, so that SymPy's derivative of one element costs O(terms) rather
than O(terms^2) (SymPy's n-ary Max re-evaluates n-1 arguments per partial).
A balanced binary Max splits a two-way tie 1/2-1/2 (Heaviside(0) = 1/2),
the engine's convention too.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import sympy as sp

from ..ops.functions import array_functions
from .mp_eval import Unsupported


def _vectorize(f, nin=1):
    u = np.frompyfunc(f, nin, 1)
    return lambda *xs: np.asarray(u(*xs), dtype=object)


def _axes(axis, ndim) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(sorted(int(a) % ndim for a in axis))


def reduce_rows(x, axis, keepdims, combine):
    """Apply combine(list_of_elements) over the given axes of an object array."""
    x = np.asarray(x, dtype=object)
    axes = _axes(axis, x.ndim)
    keep = [i for i in range(x.ndim) if i not in axes]
    reduced = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))  # not -1: ambiguous when x is empty
    rows = np.transpose(x, keep + list(axes)).reshape(tuple(x.shape[i] for i in keep) + (reduced,))
    out = np.empty(rows.shape[:-1], dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = combine(list(rows[idx]))
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out


def _tree(func):
    def combine(row):
        if not row:
            raise ValueError("zero-size reduction has no identity")
        while len(row) > 1:
            row = [func(row[i], row[i + 1], evaluate=False) if i + 1 < len(row) else row[i]
                   for i in range(0, len(row), 2)]
        return row[0]

    return combine


_add = lambda row: sp.Add(*row)  # noqa: E731


def _lattice(cls):
    """cls(a, b) as a bare node: even unevaluated, SymPy's Min/Max order their arguments by a sort key
    computed over the whole expression tree, exponential in a sort network's depth (shared subtrees)."""
    def make(a, b):
        obj = sp.Expr.__new__(cls, a, b)
        obj._argset = frozenset((a, b))
        return obj
    return _vectorize(make, 2)


_vmin, _vmax = _lattice(sp.Min), _lattice(sp.Max)
MAX_SORT_STEPS = 4096  # elements x rounds of a symbolic sort (2 rows of 32: about a second to differentiate)


def _per_matrix(f, *arrays):
    """f on each (n, n) matrix of stacked object arrays (the last two axes), as sympy Matrices."""
    a = np.asarray(arrays[0], dtype=object)
    lead = a.shape[:-2]
    outs = {}
    for idx in np.ndindex(lead):
        outs[idx] = f(*(sp.Matrix(np.asarray(x, dtype=object)[idx].tolist()) for x in arrays))
    first = np.asarray(outs[next(iter(outs))], dtype=object) if outs else np.empty(0, dtype=object)
    out = np.empty(lead + first.shape, dtype=object)
    for idx, v in outs.items():
        if isinstance(v, sp.MatrixBase):
            out[idx] = np.asarray(v.tolist(), dtype=object)
        else:
            out[idx] = v  # a scalar (det): the element itself, not a 0-d array inside the object array
    return out


# numpy.linalg's square-matrix functions (ops inv, det, solve), by the adjugate: closed forms in the entries
_LINALG = SimpleNamespace(
    inv=lambda a: _per_matrix(lambda m: m.adjugate() / m.det(method="berkowitz"), a),
    det=lambda a: _per_matrix(lambda m: m.det(method="berkowitz"), a),
    solve=lambda a, b: _per_matrix(lambda m, v: m.adjugate() * v / m.det(method="berkowitz"), a, b))


class SympyArrays:
    """The `xp` handed to op forwards by the symbolic oracle."""

    # shape and indexing: NumPy's own functions work on object arrays
    reshape = staticmethod(np.reshape)
    transpose = staticmethod(np.transpose)
    expand_dims = staticmethod(np.expand_dims)
    squeeze = staticmethod(np.squeeze)
    broadcast_to = staticmethod(np.broadcast_to)
    tile = staticmethod(np.tile)
    concatenate = staticmethod(np.concatenate)
    take = staticmethod(np.take)
    take_along_axis = staticmethod(np.take_along_axis)
    einsum = staticmethod(np.einsum)  # object arrays: products and flat sums of SymPy terms
    moveaxis = staticmethod(np.moveaxis)
    swapaxes = staticmethod(np.swapaxes)
    where = staticmethod(np.where)
    arange = staticmethod(np.arange)
    pad = staticmethod(np.pad)
    # convolution and pooling windows are strided views; NumPy's work on object arrays too
    lib = SimpleNamespace(stride_tricks=SimpleNamespace(as_strided=np.lib.stride_tricks.as_strided))
    linalg = _LINALG
    float32, float64, int64, bool_ = np.float32, np.float64, np.int64, np.bool_

    # NumPy's names for the registry's elementwise functions (exp, log, sqrt, tanh, maximum, ...)
    # are added below from ops/functions.py; logaddexp is NumPy's, no op of ours
    logaddexp = staticmethod(_vectorize(
        lambda a, b: sp.log(sp.exp(a, evaluate=False) + sp.exp(b, evaluate=False), evaluate=False), 2))

    @staticmethod
    def asarray(a, dtype=None):
        a = np.asarray(a)
        return a.astype(dtype) if dtype is not None and a.dtype != object else a

    @staticmethod
    def full(shape, value, dtype=None):
        return np.full(shape, sp.Float(value), dtype=object)

    @staticmethod
    def zeros(shape, dtype=None):  # (col2im's accumulator: windows_adjoint adds SymPy terms into it)
        return np.full(shape, sp.Integer(0), dtype=object)

    @staticmethod
    def isfinite(x):
        return np.ones(np.shape(x), dtype=bool)  # symbols stand for finite reals

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return reduce_rows(x, axis, keepdims, _add)

    @staticmethod
    def prod(x, axis=None, keepdims=False):
        return reduce_rows(x, axis, keepdims, lambda row: sp.Mul(*row))

    @staticmethod
    def max(x, axis=None, keepdims=False):
        return reduce_rows(x, axis, keepdims, _tree(sp.Max))

    @staticmethod
    def min(x, axis=None, keepdims=False):
        return reduce_rows(x, axis, keepdims, _tree(sp.Min))

    @staticmethod
    def sort(x, axis=-1):
        """Ascending along axis by an odd-even transposition network of binary Min/Max (top_k's forward):
        each element a SymPy expression of the inputs, the same function as a numeric sort."""
        x = np.moveaxis(np.array(x, dtype=object), axis, -1)
        n = x.shape[-1]
        if n * x.size > MAX_SORT_STEPS:  # n rounds of n/2 comparisons per row: bounded, not a hang
            raise Unsupported(f"a symbolic sort of {x.size // max(n, 1)} rows of {n} elements needs "
                              f"{n * x.size // 2} comparisons, over {MAX_SORT_STEPS // 2}")
        for r in range(n):
            for i in range(r % 2, n - 1, 2):
                a, b = x[..., i].copy(), x[..., i + 1].copy()
                x[..., i], x[..., i + 1] = _vmin(a, b), _vmax(a, b)
        return np.moveaxis(x, -1, axis)

    @staticmethod
    def matmul(a, b):
        a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        va, vb = a.ndim == 1, b.ndim == 1
        if va:
            a = a[None, :]
        if vb:
            b = b[:, None]
        out = reduce_rows(a[..., :, :, None] * b[..., None, :, :], -2, False, _add)
        if va:
            out = out[..., 0, :]
        if vb:
            out = out[..., 0]
        return out

    def __getattr__(self, name):
        raise Unsupported(f"the symbolic array module has no '{name}'")


def _outer_unevaluated(function):
    """function's SymPy form with its outermost call left unevaluated.

    evaluate=False there: SymPy's automatic simplification of exp/log (logcombine,
    assumption queries) cost more than everything else on a softmax row. The form is
    built once on placeholders; each call substitutes the arguments below the top."""
    holes = [sp.Dummy() for _ in range(function.arity)]
    template = function.sympy(*holes)
    if template.is_Atom:  # a constant form (isnan of a symbol standing for a finite real: 0)
        return _vectorize(lambda *args: template, function.arity)

    def build(*args):
        sub = dict(zip(holes, args))
        return template.func(*[a.xreplace(sub) for a in template.args], evaluate=False)

    return _vectorize(build, function.arity)


for _name, _function in array_functions().items():
    if _name not in vars(SympyArrays):  # NumPy's own array functions (where, ...) come first
        setattr(SympyArrays, _name, staticmethod(_outer_unevaluated(_function)))
del _name, _function

SYMPY_XP = SympyArrays()
