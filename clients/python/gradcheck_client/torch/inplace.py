"""What an in-place write does to the other tensors sharing its memory, for the capture (capture._inplace).

A write into a tensor w (`gates.sigmoid_()` on one LSTM gate, `y[:, 0].mul_(2)` on a view, `base.add_(1)`
under its views) changes every tensor whose elements lie in the storage positions w covers -- and no
other: the four gates of an LSTM step are views of one tensor that never overlap. Each traced tensor t
overlapping w gets its new value as the graph's own function of the values: its old value and w's new
one, element by element (`take` from their concatenation), so the references differentiate through the
write as torch's autograd does (CopySlices, a view's regenerated grad_fn). Positions are exact (every
element's storage offset, from shape, strides and offset), not a bounding range.

What cannot be followed this way is marked stale (capture._lift refuses a later read): a tensor of
another dtype over the same bytes, a storage of more than MAX_POSITIONS elements, a write whose
elements overlap each other.
"""
from __future__ import annotations

import numpy as np
import torch

from gradcheck_core.tracer import Value

MAX_POSITIONS = 1 << 22  # storage elements whose offsets are computed for one write
STALE = "stale"


def positions(t: torch.Tensor):
    """The storage offset of each element of t (t's shape), or None when its storage is too large."""
    n = t.untyped_storage().nbytes() // t.element_size()
    if n > MAX_POSITIONS:
        return None
    return torch.arange(n).as_strided(tuple(t.shape), t.stride(), t.storage_offset()).numpy()


def shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def overlaps(t: torch.Tensor, written: torch.Tensor, pw=None) -> bool:
    """Whether t has an element in written's storage positions (True where they cannot be computed). pw:
    positions(written), where the caller has them (one write, many tensors)."""
    pt, pw = positions(t), positions(written) if pw is None else pw
    return t.dtype != written.dtype or pt is None or pw is None or bool(np.isin(pt, pw).any())


def refreshed(t: torch.Tensor, old, written: torch.Tensor, new, pw=None):
    """t's value after the write of `new` into `written`: None if they do not overlap, STALE if it cannot be
    followed, else t's old value with the overlapped elements taken from `new` (a Value or an array). pw:
    positions(written), where the caller has them."""
    if t.dtype != written.dtype:
        return STALE
    pt, pw = positions(t), positions(written) if pw is None else pw
    if pt is None or pw is None:
        return STALE
    pt, pw = pt.reshape(-1), pw.reshape(-1)
    hit = np.isin(pt, pw)
    if not hit.any():
        return None
    if len(np.unique(pw)) != len(pw):
        return STALE
    order = np.argsort(pw, kind="stable")
    slot = order[np.searchsorted(pw[order], pt[hit])]
    src = np.arange(len(pt))
    src[hit] = len(pt) + slot
    pieces = (np.reshape(old, (-1,)), np.reshape(new, (-1,)))
    traced = next((x for x in (old, new) if isinstance(x, Value)), None)
    if traced is None:
        return np.reshape(np.concatenate(pieces)[src], tuple(t.shape))
    flat = traced.tracer.apply("concat", *pieces, axis=0)
    return np.reshape(traced.tracer.apply("take", flat, src, axis=0), tuple(t.shape))
