"""The op registry: the only list of ops in the project."""
from __future__ import annotations

from .base import OpDef

REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op '{op.name}' registered twice")
    REGISTRY[op.name] = op
    return op
