"""graph.proto's Claims -> ir.Claims: the gradients other code computed, checked against the graph.

Each claimed gradient names a parameter and has its shape; each claimed adjoint names a node (the
loss included) and has that node's shape; every value is finite (a NaN in a claim is no gradient to
verify: it is refused, naming it, like a NaN in input data). Errors name the claim as
`claimed gradient 'NAME'` / `claimed adjoint 'NAME'`, the same words for a request and an .npz file.
"""
from __future__ import annotations

import numpy as np
from gradcheck_core.hints import hint

from ..errors import GraphError
from .ir import Claims


def decode_claims(msg, parameters: list[str], specs: dict, nodes: list[str], decode_tensor) -> Claims | None:
    """None when the graph message carries no claims (the engine is the subject)."""
    if not msg.HasField("claimed"):
        return None
    c = msg.claimed
    if not len(c.gradients) and not len(c.adjoints):
        raise GraphError("holds no gradient and no adjoint (give at least one parameter's gradient)",
                         field="claimed")
    gradients = {name: _value(c.gradients[name], name, "gradient", parameters, specs, decode_tensor)
                 for name in sorted(c.gradients)}
    adjoints = {name: _value(c.adjoints[name], name, "adjoint", nodes, specs, decode_tensor)
                for name in sorted(c.adjoints)}
    # a float32 backward (a GPU training step) carries float32 rounding: its claims get float32's tolerance
    float32 = any((t.dtype or "float64") == "float32" for t in [*c.gradients.values(), *c.adjoints.values()])
    return Claims(gradients, adjoints, "float32" if float32 else "float64")


def _value(t, name: str, what: str, allowed: list[str], specs: dict, decode_tensor) -> np.ndarray:
    where = f"claimed {what} '{name}'"
    if name not in allowed:
        kind = "parameter (an input with requires_grad)" if what == "gradient" else "node"
        raise GraphError(f"names no {kind} of the graph{hint(name, allowed)}", field=where)
    value, dtype = decode_tensor(t, where)
    if not dtype.startswith("float"):
        raise GraphError(f"must be float32 or float64, got {dtype}", field=where)
    want = tuple(specs[name].shape)
    if value.shape != want:
        raise GraphError(f"has shape {list(value.shape)}, the {'parameter' if what == 'gradient' else 'node'} "
                         f"has shape {list(want)}", field=where)
    bad = ~np.isfinite(value)
    if bad.any():
        index = [int(i) for i in np.argwhere(bad)[0]]
        raise GraphError(f"holds {int(bad.sum())} NaN/Inf value(s), first {value[tuple(index)]} at index {index}",
                         field=where)
    return np.asarray(value, dtype=np.float64)
