"""Replays of the ops eval-mode models dispatch on CPU beside capture.ATEN's one-liners: scaled-dot-product
attention (every CPU backend: `_scaled_dot_product_flash_attention_for_cpu`, the math path's own op, and
`_safe_softmax`, which the math path decomposes to), the split family (LSTM/GRU gates, `chunk`, `unbind`)
and `native_dropout` where it is the identity. Each is written with the registry's ops on tracer Values,
so the references differentiate it; an argument outside what is written here is a TypeError, which
makes the op an opaque node (capture._replay), never a guess.

Masks: torch's causal mask is top-left aligned (query i sees keys j <= i); a boolean mask keeps True. A
masked score is -inf, a constant of the graph (capture.nonfinite_constants lets such constants through
validation, the parameters still being refused NaN/Inf). A row with every key masked is NaN in one
backend and 0 in another: refused (TypeError), as a value the replay would not reproduce.
"""
from __future__ import annotations

import numpy as np

from gradcheck_core.tracer import Value


def _apply(op: str, *xs, **attrs):
    tracer = next(x.tracer for x in xs if isinstance(x, Value))
    return tracer.apply(op, *xs, **attrs)


def _additive(mask, shape) -> object:
    """The attention mask as a term added to the scores: 0 where kept, -inf where masked (a bool mask), or
    the float mask itself (a constant or a traced value)."""
    if isinstance(mask, Value):
        return mask
    mask = np.asarray(mask)
    if mask.dtype == bool:
        mask = np.where(mask, 0.0, -np.inf)
    full = np.broadcast_to(mask, shape)
    if np.any(np.all(np.isneginf(full), axis=-1)):
        raise TypeError("an attention mask that masks every key of a query is not replayed")
    return mask


def _grouped(q, k, v):
    """Grouped-query attention (enable_gqa): each of k's and v's heads serves q.heads / k.heads consecutive
    heads of q, as torch's repeat_interleave over the head dimension (-3) -- a take of k's and v's heads."""
    if len(q.shape) < 3 or len(k.shape) != len(q.shape) or q.shape[:-3] != k.shape[:-3] \
            or k.shape[:-1] != v.shape[:-1] or q.shape[-3] % k.shape[-3]:
        raise TypeError("grouped-query attention whose heads of q are not a multiple of k's is not replayed")
    heads = np.repeat(np.arange(k.shape[-3]), q.shape[-3] // k.shape[-3])
    axis = len(k.shape) - 3
    return _apply("take", k, heads, axis=axis), _apply("take", v, heads, axis=axis)


def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v, dropout 0 (a positive one is refused before: capture.random_op)."""
    if enable_gqa and q.shape[:-2] != k.shape[:-2]:
        k, v = _grouped(q, k, v)
    if dropout_p or q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1]:
        raise TypeError("dropout, or attention whose heads of q and k/v differ without enable_gqa, is not replayed")
    length, source = q.shape[-2], k.shape[-2]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
    if is_causal:
        scores = scores + np.triu(np.full((length, source), -np.inf), 1)
    if attn_mask is not None:
        scores = scores + _additive(attn_mask, tuple(scores.shape))
    return _apply("softmax", scores, axis=-1) @ v


def flash_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """aten::_scaled_dot_product_flash_attention_for_cpu: its output (its logsumexp is not replayed). It is
    handed k and v with fewer heads than q only when the caller asked for grouped-query attention (torch
    refuses differing heads otherwise before dispatching)."""
    return sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa=len(q.shape) >= 3
                and len(k.shape) == len(q.shape) and q.shape[-3] != k.shape[-3])


def math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, dropout_mask=None, scale=None,
         enable_gqa=False):
    """aten::_scaled_dot_product_attention_math: its output (its attention weights are not replayed)."""
    if dropout_mask is not None:
        raise TypeError("a dropout mask is not replayed")
    return sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def safe_softmax(x, dim, dtype=None):
    """softmax, which _safe_softmax is wherever a row keeps a finite entry (a fully masked row is 0 there)."""
    known = x.value if isinstance(x, Value) else np.asarray(x)
    if known is None or np.any(np.all(np.isneginf(known), axis=dim)):
        raise TypeError("a fully masked row (or an unknown value) is not replayed")
    return _apply("softmax", x, axis=dim)


def _pieces(a, sizes: list, dim: int) -> list:
    dim %= len(a.shape)
    starts = np.cumsum([0, *sizes])
    return [a[(slice(None),) * dim + (slice(int(s), int(s + n)),)] for s, n in zip(starts, sizes)]


def split(a, size: int, dim: int = 0) -> list:
    n = a.shape[dim]
    return _pieces(a, [min(size, n - s) for s in range(0, n, size)] if n else [0], dim)


def split_sizes(a, sizes, dim: int = 0) -> list:
    return _pieces(a, list(sizes), dim)


def chunk(a, chunks: int, dim: int = 0) -> list:
    return split(a, -(-a.shape[dim] // chunks) or 1, dim)


def unbind(a, dim: int = 0) -> list:
    dim %= len(a.shape)
    return [a[(slice(None),) * dim + (i,)] for i in range(a.shape[dim])]


def dropout(a, p, train):
    """native_dropout where it is the identity (train False or p 0: capture.random_op refused the rest)."""
    return a
