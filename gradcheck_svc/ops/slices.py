"""A stack of copies of a value that differ from it in one slice each, and how ops carry it.

Full-Jacobian finite differences perturb one element at a time. Pushing each perturbed copy
through the graph densely recomputes everything downstream, although most of it is unchanged:
perturbing W[i, j] in x @ W moves only column j of the product, and tanh of that product again
only column j. `Sliced` keeps the stack as the unperturbed value plus, per copy, the index of the
one slice (along one axis) that differs and that slice's values; ops that can keep the change to
one slice compute only the slices. Everything else receives the stack densified (`dense`) and
runs batched as before, so a rule is an optimization, never a requirement.

Rules compute the changed slices with the op's own forward (the finite-difference oracle must stay
independent of every vjp) or, for ops linear in the changed input, by the exact algebra of the
forward (matmul's rank-1 update). tests/oracles/test_fd_slices.py checks every rule against the dense
batched forward on every op's registry cases.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Sliced:
    """B copies of `base`; copy k equals base except at position index[k] along `axis` (negative),
    where it holds values[k]. values: (B,) + base.shape with `axis` removed."""

    base: np.ndarray
    axis: int
    index: np.ndarray  # (B,) intp
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def old(self, xp):
        """The base's slices at `index`, shaped like values (what each copy replaced)."""
        return take_slices(xp, self.base, self.axis, self.index)

    def dense(self, xp):
        """The stack as a (B,) + base.shape array."""
        # in the values' dtype where that is wider (complex-step copies of a real base)
        out = xp.broadcast_to(self.base, (len(self),) + self.base.shape).astype(
            xp.result_type(self.base.dtype, self.values.dtype))
        moved = xp.moveaxis(out, self.axis, 1)  # a view: (B, n_axis, rest)
        moved[xp.arange(len(self)), self.index] = self.values
        return out


def take_slices(xp, value, axis: int, index):
    """value's slices at `index` along `axis`, stacked first: (B,) + shape without axis."""
    return xp.moveaxis(xp.take(value, index, axis=axis), axis, 0)


def one_hot(xp, value, axis: int, flat_index, new_values) -> Sliced:
    """The stack of copies of `value` with element flat_index[k] (into value's flat layout) set to
    new_values[k], as a Sliced along `axis`."""
    shape, p = value.shape, value.ndim + axis
    coords = np.unravel_index(np.asarray(flat_index), shape)
    rest_shape = shape[:p] + shape[p + 1:]
    at = np.ravel_multi_index(coords[:p] + coords[p + 1:], rest_shape) if rest_shape else 0
    # reshape below must be a view; (not take_slices: take() copies a strided value whole first)
    slices = xp.ascontiguousarray(xp.moveaxis(value, axis, 0)[coords[p]])
    slices.reshape(len(coords[p]), -1)[np.arange(len(coords[p])), at] = new_values
    return Sliced(value, axis, coords[p], slices)


def elementwise(xp, op, xs, base_out, attrs):
    """An elementwise op keeps a one-slice change to one slice: its forward on the changed slices,
    with the other inputs' slices at the same positions (broadcast to the output shape first).
    None (densify) where a changed input is itself broadcast along the changed axis, or two changed
    inputs disagree on where they changed."""
    sliced = [x for x in xs if isinstance(x, Sliced)]
    first = sliced[0]
    axis, index = first.axis, first.index
    out_shape = base_out.shape
    rank = len(out_shape)
    for s in sliced:
        if s.axis != axis or not (s.index is index or np.array_equal(s.index, index)):
            return None
        if s.base.ndim + axis < 0 or s.base.shape[axis] != out_shape[axis]:
            return None
    args = []
    for x in xs:
        if isinstance(x, Sliced):  # align the slice's rank with the output's (leading 1s broadcast)
            rest = x.values.shape[1:]
            args.append(x.values.reshape((len(index),) + (1,) * (rank - 1 - len(rest)) + rest))
        else:
            args.append(take_slices(xp, xp.broadcast_to(x, out_shape), axis, index))
    return Sliced(base_out, axis, index, op.forward(xp, *args, **attrs))


def independent(out_axis):
    """The rule of a one-input op that maps the slices along some axes each on its own (pooling:
    every sample and channel; a reduction: every position it does not reduce): its forward on the
    changed slices alone, each given its axis back (size 1). out_axis(axis, attrs) -> where the
    changed axis lands in the output (negative), or None where the op mixes slices along it."""
    def rule(xp, op, xs, base_out, attrs):
        (x,) = xs
        at = out_axis(x.axis, attrs)
        if at is None:
            return None
        y = op.forward(xp, xp.expand_dims(x.values, x.axis), **attrs)
        return Sliced(base_out, at, x.index, xp.squeeze(y, axis=at))
    rule.out_axis = out_axis  # (frozen branches slice the op's selection along it: independent_frozen)
    return rule


def independent_frozen(xp, op, selection, x: Sliced, base_out, attrs):
    """An `independent` op's frozen piece (OpDef.frozen) on a one-slice change, or None (densify): the
    selection sliced at the same positions -- along the output's axis where it is shaped like the output
    (max_pool's argmax), along the input's where it is shaped like the input (max's shares)."""
    at = op.slice_rule.out_axis(x.axis, attrs)
    if at is None:
        return None
    if selection.shape == base_out.shape:
        along = at
    elif selection.shape == x.base.shape:
        along = x.axis
    else:
        return None
    piece = xp.expand_dims(take_slices(xp, selection, along, x.index), along)
    y = op.frozen(xp, piece, xp.expand_dims(x.values, x.axis), **attrs)
    return Sliced(base_out, at, x.index, xp.squeeze(y, axis=at))
