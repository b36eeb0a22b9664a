"""Copies of a parameter that an exporter stored as tensors of their own: tied, not separate.

A tied output head (`head.weight = emb.weight`, or `x @ emb.weight.T`) reaches ONNX as the weight
under one name (read by the Gather) and its transpose under a name the exporter made (`onnx::MatMul_N`,
`val_N`, the dynamo optimizer's `permute`), read by the head's MatMul. Torch's gradient of the weight
is the sum over both reads; checking the copy as a parameter of its own (or holding it constant)
checks half of it -- a wrong PASS. So a copy is emitted as a node of the parameter it copies
(identity, transpose, reshape or broadcast): the parameter's gradient is the sum of every place it is used.

A copy is found by value: an exporter-made float initializer (no torch name) whose elements are a
held weight's exactly -- the same shape, its transpose (2-D), or the same elements in another shape --
or the weight repeated over leading dimensions ("broadcast": the dynamo optimizer folds an nn.RNN's first
step, h0 @ W_hh.T + b_hh with h0 = 0, into a constant that is b_hh over the batch; held constant, the
gradient of b_hh would lose that step's part), or a block of it ("sliced": the TorchScript exporter's
constant folding stores `self.pos_embed[:, :T]` or `self.w[:3, :3]` of a weight also read whole as an
initializer of its own; held constant, the weight's gradient would lose what reaches it through the slice).
Only weights whose elements are pairwise distinct are matched (a trained or randomly initialized
weight's are; a zero or ones tensor's are not, and two such tensors equal by chance are no tie), and
a copy matching more than one weight is left as it is.

The dynamo exporter also gives a tied pair one name: torch.export lists both (`emb.weight`,
`head.weight`) in its signature and reads the later one everywhere, while named_parameters() keeps
the first. `torch_aliases` finds such pairs: a listed parameter held by no initializer whose own
module's node reads another module's parameter, the fx node saying torch read that one.
"""
from __future__ import annotations

import numpy as np

from .provenance import MADE, _fx_parameters, _module, _context

RELATIONS = ("same", "transposed", "reshaped", "broadcast", "sliced")  # how a copy's elements are its parameter's


def _key(value: np.ndarray) -> tuple:
    flat = np.ascontiguousarray(value, dtype=np.float64).reshape(-1)
    return flat.size, np.sort(flat).tobytes()


def _relation(copy: np.ndarray, base: np.ndarray) -> str | None:
    if copy.shape == base.shape and np.array_equal(copy, base):
        return "same"
    if copy.ndim == 2 and base.ndim == 2 and copy.shape == base.shape[::-1] and np.array_equal(copy, base.T):
        return "transposed"
    if np.array_equal(copy.reshape(-1), base.reshape(-1)):
        return "reshaped"
    return None


def find_ties(inits: dict, copies: set[str], bases: set[str]) -> dict[str, tuple[str, str]]:
    """{copy: (base, relation)} for each of `copies` whose elements are exactly one of `bases`'
    (module docstring); `inits`: every initializer's value."""
    by_key: dict[tuple, list[str]] = {}
    sizes = {inits[c].size for c in copies if inits[c].dtype.kind == "f" and inits[c].size > 1}
    for b in sorted(bases):
        v = inits[b]  # (sorted and compared only where a copy of its size exists: most models have none)
        if v.dtype.kind == "f" and v.size in sizes and np.unique(v).size == v.size:
            by_key.setdefault(_key(v), []).append(b)
    out = {}
    for c in sorted(copies):
        v = inits[c]
        if v.dtype.kind != "f" or v.size <= 1:
            continue
        found = [(b, r) for b in by_key.get(_key(v), ()) if b != c and (r := _relation(v, inits[b]))]
        if len(found) == 1:
            out[c] = found[0]
    out |= _broadcasts(inits, copies - set(out), bases)
    return out | _slices(inits, copies - set(out), bases)


def _broadcasts(inits: dict, copies: set[str], bases: set[str]) -> dict[str, tuple[str, str]]:
    """{copy: (base, "broadcast")} for each of `copies` that is exactly one of `bases` repeated over leading
    dimensions (module docstring), the bases' elements pairwise distinct as find_ties wants them."""
    tails = {inits[c].shape[k:] for c in copies if inits[c].dtype.kind == "f" for k in range(1, inits[c].ndim)}
    by_shape: dict[tuple, list[str]] = {}
    for b in sorted(bases):
        v = inits[b]  # (only shapes some copy ends with: most models have none)
        if v.dtype.kind == "f" and v.shape in tails and v.size > 1 and np.unique(v).size == v.size:
            by_shape.setdefault(v.shape, []).append(b)
    out = {}
    for c in sorted(copies):
        v = inits[c]
        found = [b for k in range(1, v.ndim) for b in by_shape.get(v.shape[k:], ())
                 if b != c and np.array_equal(v, np.broadcast_to(inits[b], v.shape))]
        if len(found) == 1:
            out[c] = (found[0], "broadcast")
    return out


def block_start(copy: np.ndarray, base: np.ndarray) -> tuple | None:
    """Where `copy` lies in `base` as a contiguous block of the same rank (base[start:start + copy.shape]),
    or None. The base's elements are pairwise distinct (find_ties), so the copy's first element fixes the
    start: one scan of the base, then one comparison."""
    if copy.ndim != base.ndim or copy.size >= base.size or any(c > b for c, b in zip(copy.shape, base.shape)):
        return None
    at = np.flatnonzero(base.reshape(-1) == copy.reshape(-1)[0])
    if at.size != 1:
        return None
    start = np.unravel_index(int(at[0]), base.shape)
    if any(s + c > b for s, c, b in zip(start, copy.shape, base.shape)):
        return None
    block = base[tuple(slice(s, s + c) for s, c in zip(start, copy.shape))]
    return tuple(int(s) for s in start) if np.array_equal(block, copy) else None


def _slices(inits: dict, copies: set[str], bases: set[str]) -> dict[str, tuple[str, str]]:
    """{copy: (base, "sliced")} for each of `copies` that is exactly one block of one of `bases` (module
    docstring), the bases' elements pairwise distinct as find_ties wants them."""
    wanted = [c for c in sorted(copies) if inits[c].dtype.kind == "f" and inits[c].size > 1]
    distinct = [b for b in sorted(bases) if inits[b].dtype.kind == "f" and inits[b].size > 1 and any(
        inits[c].ndim == inits[b].ndim and inits[c].size < inits[b].size for c in wanted)]
    distinct = [b for b in distinct if np.unique(inits[b]).size == inits[b].size]
    out = {}
    for c in wanted:
        found = [b for b in distinct if b != c and block_start(inits[c], inits[b]) is not None]
        if len(found) == 1:
            out[c] = (found[0], "sliced")
    return out


def copy_candidates(inits: dict, exported: list[str]) -> set[str]:
    """Float initializers with no torch name: exporter-made ones, and in a dynamo export (its signature's
    parameters `exported`) every one it does not list."""
    listed = set(exported)
    return {n for n, v in inits.items() if v.dtype.kind == "f" and (MADE.match(n) or (listed and n not in listed))}


def torch_aliases(model, held: set[str], exported: list[str]) -> dict[str, str]:
    """{held initializer: the torch name named_parameters() gives it} for a dynamo export's tied pairs
    (module docstring): `emb.weight` listed and held by nothing, the Gather of module `emb` reading
    `head.weight` (fx: %p_head_weight): one tensor, named_parameters()' name the first listed."""
    order = {p: i for i, p in enumerate(exported)}
    missing = [p for p in exported if p not in held]
    if not missing:
        return {}
    ctx = _context(model)
    found: dict[str, set[str]] = {}  # missing parameter -> held parameters its module reads as another's
    for node in model.graph.node:
        module, _ = _module(node)
        if not module:
            continue
        own = [p for p in missing if p.rsplit(".", 1)[0] == module]
        if not own:
            continue
        read = [n for n in node.input if n in held and n.rsplit(".", 1)[0] != module]
        told = set(_fx_parameters(node, module, ctx))
        for p in own:
            found.setdefault(p, set()).update(n for n in read if n in told and
                                              n.rsplit(".", 1)[-1] == p.rsplit(".", 1)[-1])
    out = {}
    for p, xs in found.items():
        if len(xs) == 1:
            (x,) = xs
            if order[p] < order.get(x, -1) and x not in out:
                out[x] = p
    return out
