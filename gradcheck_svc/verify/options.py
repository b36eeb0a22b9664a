"""VerifyOptions: what one verification is asked to do (engine, oracles, diagnosis)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine.faults import Fault
from ..oracles.finite_diff import FDOptions
from ..oracles.symbolic import SymbolicOptions

DTYPES = {"float32": np.float32, "float64": np.float64}


@dataclass
class VerifyOptions:
    dtype: str | None = None  # None: the graph's declared float dtype
    device: str = "cpu"
    fd: FDOptions = field(default_factory=FDOptions)
    faults: tuple[Fault, ...] = ()
    atol: float | None = None
    rtol: float | None = None
    checkpoint: object = "none"  # none | sqrt | every:K | node names (list or "a,b"), see engine/checkpoint.py
    memory_timeline: bool = False  # record live bytes after every step (for --memory-plot)
    # the memory profile (the report's `memory`): an inference forward and a checkpointed what-if besides
    # the gradient run (verify/engine_run.py); off: only the gradient run, and `memory` is empty
    memory_profile: bool = True
    optimizer: str = "none"  # none | sgd | momentum | adam | adamw: its state joins the training figure
    optimizer_dtype: str | None = None  # the optimizer state's dtype (None: the engine's)
    integrity: str = "check"  # saved-tensor fingerprints: "off" | "check"
    allow_inplace_hazards: bool = False  # compute the (wrong) gradient instead of stopping
    localize: bool = True  # find the faulty node when a parameter fails
    symbolic: SymbolicOptions = field(default_factory=SymbolicOptions)
