"""matmul with NumPy semantics: 1-D operands are promoted, leading (batch)
dimensions broadcast."""
from __future__ import annotations

from ..errors import GraphError
from .base import FLOAT, REALS, Case, OpDef, Spec, broadcast_shapes, save_inputs
from .registry import register
from .slices import Sliced


def _infer(node, specs, attrs):
    a, b = specs[0].shape, specs[1].shape
    if not a or not b:
        raise GraphError("matmul operands must have at least 1 dimension", node=node)
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise GraphError(f"matmul inner dimensions differ: {list(a)} @ {list(b)}", node=node)
    batch = broadcast_shapes(node, [a2[:-2], b2[:-2]])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return Spec(out, FLOAT), {"ranks": (len(a), len(b))}


def _matmul(xp, a, b, ranks):
    ra, rb = ranks
    la, lb = a.ndim - ra, b.ndim - rb
    if la == 0 and lb == 0:
        return xp.matmul(a, b)
    # Batched evaluation: promote vectors and align batch ranks after the
    # leading batch axes so NumPy's broadcasting pairs the right dimensions.
    if ra == 1:
        a = xp.expand_dims(a, -2)
    if rb == 1:
        b = xp.expand_dims(b, -1)
    ca, cb = a.ndim - la, b.ndim - lb  # core ranks, now >= 2
    r = max(ca, cb)
    a = a.reshape(a.shape[:la] + (1,) * (r - ca) + a.shape[la:])
    b = b.reshape(b.shape[:lb] + (1,) * (r - cb) + b.shape[lb:])
    if la < lb:
        a = a.reshape((1,) * (lb - la) + a.shape)
    elif lb < la:
        b = b.reshape((1,) * (la - lb) + b.shape)
    y = xp.matmul(a, b)
    if rb == 1:
        y = y[..., 0]
    if ra == 1:
        y = y[..., 0, :] if rb != 1 else y[..., 0]
    return y


def _save(xs, y, ranks, needs_input_grad=None):
    """b for a's gradient, a for b's: a data operand's partner is not kept (as torch.matmul's backward
    saves), an empty array of its own in its place (a view would keep the buffer it views)."""
    need_a, need_b = needs_input_grad or (True, True)
    a, b = xs
    return (a if need_b else a.reshape(-1)[:0].copy(), b if need_a else b.reshape(-1)[:0].copy())


def _batch_summed(xp, u, v):
    """sum over the batch of u_s^T v_s, u (*S, M, K) and v (*S, M, N) -> (K, N), as one matrix product
    (the batch folded into the contraction): a weight's gradient in x[S, 1, D] @ W[D, N] without the
    (S, D, N) stack of outer products that the engine would sum afterwards."""
    if u.shape[:-2] != v.shape[:-2]:  # one side broadcast along the batch: the stack is what there is
        return xp.matmul(xp.swapaxes(u, -1, -2), v)
    return xp.matmul(xp.reshape(u, (-1, u.shape[-1])).T, xp.reshape(v, (-1, v.shape[-1])))


def _vjp(xp, g, saved, ranks, needs_input_grad=None):
    a, b = saved
    need_a, need_b = needs_input_grad or (True, True)  # a data operand's GEMM is skipped
    ra, rb = ranks
    a2 = a[None, :] if ra == 1 else a
    b2 = b[:, None] if rb == 1 else b
    g2 = g
    if rb == 1:
        g2 = xp.expand_dims(g2, -1)
    if ra == 1:
        g2 = xp.expand_dims(g2, -2)
    ga = (_batch_summed(xp, xp.swapaxes(g2, -1, -2), xp.swapaxes(b2, -1, -2)) if b2.ndim > 2 == a2.ndim
          else xp.matmul(g2, xp.swapaxes(b2, -1, -2))) if need_a else None
    gb = (_batch_summed(xp, a2, g2) if a2.ndim > 2 == b2.ndim
          else xp.matmul(xp.swapaxes(a2, -1, -2), g2)) if need_b else None
    if ra == 1 and need_a:
        ga = ga[..., 0, :]
    if rb == 1 and need_b:
        gb = gb[..., 0]
    return ga, gb  # batch dimensions are summed back to each input's shape by the engine


def _sliced(xp, op, xs, base_out, attrs):
    """One changed slice of a 2-D operand through a @ b. A changed column of b (or row of a) is
    one column (row) of the product: that slice alone, by the forward. A change along the
    contracted axis reaches every element, but as a rank-1 update of the unperturbed product:
    base + (new - old) outer (the other operand's matching row/column) -- B x M x N work instead of
    B x M x K x N. None (densify) for any other layout."""
    a, b = xs
    if attrs["ranks"] != (2, 2) or isinstance(a, Sliced) == isinstance(b, Sliced):
        return None
    if isinstance(b, Sliced):
        if b.axis == -1:
            return Sliced(base_out, -1, b.index, _matmul(xp, a, b.values.T, (2, 2)).T)
        return base_out + xp.take(a, b.index, axis=1).T[:, :, None] * (b.values - b.old(xp))[:, None, :]
    if a.axis == -2:
        return Sliced(base_out, -2, a.index, _matmul(xp, a.values, b, (2, 2)))
    return base_out + (a.values - a.old(xp))[:, :, None] * xp.take(b, a.index, axis=0)[:, None, :]


def _cases(rng):
    pairs = [((2, 3), (3, 4)), ((3,), (3, 2)), ((2, 3), (3,)), ((4,), (4,)),
             ((2, 2, 3), (3, 4)), ((1, 2, 3), (5, 3, 2)), ((5, 1, 2, 3), (4, 3, 1)),
             ((4, 1, 3), (3, 2)), ((3,), (4, 3, 2)), ((2, 3), (2, 3, 2))]  # a batch summed in one product (vjp)
    return [Case([REALS.sample(rng, a), REALS.sample(rng, b)]) for a, b in pairs]


register(OpDef(
    name="matmul", forward=_matmul, vjp=_vjp, infer=_infer, arity=2, input_kinds=(FLOAT, FLOAT),
    save=_save, cases=_cases, numpy="matmul", torch="torch.matmul", sliced=_sliced, sliced_axes=(-2, -1),
    multilinear=(0, 1),
    doc="a @ b with NumPy semantics (vectors promoted, batch dimensions broadcast)"))
