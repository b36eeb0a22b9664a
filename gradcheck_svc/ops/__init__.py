"""Operator registry. Importing this package registers every op family."""
from __future__ import annotations

from . import elementwise, expr, linalg, nn, reduce, shape  # noqa: F401  (registration side effects)
from . import conv, normalization, pad, pool  # noqa: F401  (the CNN op set, for ONNX models)
from . import numpy_math  # noqa: F401  (the NumPy functions no composition gives exactly)
from . import activations, einsum, layer_norm, masks, scatter  # noqa: F401  (transformers', MobileNets' and masks' ops)
from . import grid_sample, resize, topk  # noqa: F401  (spatial transformers, U-Nets' upsampling, MoE routing)
from .base import OpDef
from .registry import REGISTRY

OPSET_VERSION = 1


def get_op(name: str) -> OpDef | None:
    return REGISTRY.get(name)


def all_ops() -> list[OpDef]:
    return [REGISTRY[k] for k in sorted(REGISTRY)]
