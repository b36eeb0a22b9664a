"""Declared surrogates: a custom autograd.Function whose backward is deliberately not the derivative of its
forward (a straight-through estimator, gradient reversal, a clipped backward) says so, and the check
reports it as "declared surrogate, not checked against the derivative" instead of failing it:

    from gradcheck_client.torch import surrogate

    @surrogate("straight-through estimator: the backward passes the gradient of the identity")
    class RoundSTE(torch.autograd.Function):
        ...

(or, without importing gradcheck_client in the model's code, the class attribute
`gradcheck_surrogate = "straight-through estimator"`). The declaration is the class's, so every call of it
is a surrogate; an undeclared Function with the same backward still fails. The rest of the graph is still
checked: the call is an opaque node (opaque.py) whose own check is waived -- its outputs are parameters of
the graph (a wrong gradient after it fails there) and its inputs get the surrogate's own VJP handed back
(a wrong gradient before it, judged against what the surrogate hands back, fails there).
"""
from __future__ import annotations

ATTRIBUTE = "gradcheck_surrogate"  # the class attribute a declaration sets: the reason, a non-empty string


def surrogate(reason: str):
    """Class decorator: declare a custom autograd.Function's backward a deliberate surrogate, for `reason`."""
    if not isinstance(reason, str) or not reason.strip():
        raise TypeError("surrogate(reason): say why the backward is a surrogate (\"straight-through estimator\")")

    def declare(cls):
        setattr(cls, ATTRIBUTE, reason.strip())
        return cls
    return declare


def declared(cls) -> str:
    """The declared reason of a Function class, or "" when it declares none; a declaration that is not a
    non-empty string is refused (never read as no declaration)."""
    reason = getattr(cls, ATTRIBUTE, None)
    if reason is None:
        return ""
    if not isinstance(reason, str) or not reason.strip():
        raise TypeError(f"{cls.__name__}.{ATTRIBUTE} must be a non-empty string saying why its backward is a "
                        f"surrogate, not {reason!r}")
    return reason.strip()


def entry(node) -> dict:
    """The report's entry (data["opaque"]) for a declared surrogate's call: not checked, by declaration."""
    return {"op": node.name, "kind": node.kind, "source": node.source, "module": node.module,
            "parameters": [v.name for _, v in node.outputs], "elements": sum(x.numel() for x in node.inputs),
            "reason": node.surrogate, "verdict": "surrogate",
            "checked": "not against the derivative (declared surrogate); its outputs are parameters of the graph "
                       "(claimed: torch's adjoint) and its inputs get its own VJP handed back",
            "detail": f"declared surrogate ({node.surrogate}), not checked against the derivative"}
