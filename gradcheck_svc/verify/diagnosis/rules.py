"""One op's vjp evaluated in isolation, at values the caller chooses (the forward's, in float64
or the engine's dtype): what the rule itself says, apart from what the backward read."""
from __future__ import annotations

import numpy as np

from ...engine.executor import fit
from ...engine.program import Step


def rule_contribution(step: Step, xs: list, y, a: np.ndarray, k: int, shape: tuple, xp=np):
    """The step's vjp contribution to input k, evaluated in isolation at inputs xs and output y."""
    saved = step.op.save(xs, y, **step.attrs) if step.op.save else tuple(xs)
    with np.errstate(all="ignore"):
        g = step.op.vjp(xp, a, saved, **step.attrs)[k]
        return np.asarray(fit(xp, xp.asarray(g), shape), dtype=np.float64)
