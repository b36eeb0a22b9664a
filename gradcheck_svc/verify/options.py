"""VerifyOptions: what one verification is asked to do (engine, oracles, diagnosis); check(): the one
place its values are validated.

Options are checked once, at the edge a verification enters by: a request's or a command's option values
in request.verify_options (errors name options.X or the flag), the Python API's VerifyOptions in
run.verify. Below that edge nothing checks them again: the engine and the oracles trust what they get.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..engine.faults import Fault
from ..engine.checkpoint import parse_policy
from ..engine.saved import INTEGRITY_MODES
from ..errors import OptionError
from ..oracles.fd_complex import METHODS as FD_METHODS
from ..oracles.finite_diff import MODES as FD_MODES
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
    # the memory profile (the report's `memory`): the inference figures (counted beside the gradient run's
    # forward) and a checkpointed what-if besides the gradient run (verify/engine_run.py); off: only the
    # gradient run, and `memory` is empty
    memory_profile: bool = True
    optimizer: str = "none"  # none | sgd | momentum | adam | adamw: its state joins the training figure
    optimizer_dtype: str | None = None  # the optimizer state's dtype (None: the engine's)
    integrity: str = "check"  # saved-tensor fingerprints: "off" | "check"
    allow_inplace_hazards: bool = False  # compute the (wrong) gradient instead of stopping
    localize: bool = True  # find the faulty node when a parameter fails
    symbolic: SymbolicOptions = field(default_factory=SymbolicOptions)


def check(options: VerifyOptions, field=lambda name: name) -> None:
    """Every option that is wrong whatever the graph (FD settings and tolerances that would make the verdict
    meaningless, an unknown dtype or integrity mode, a checkpoint policy that does not parse) is a user error,
    raised before any work. Each is named as the options table names it (gradcheck_core/options.py:
    fd_mode, directions, atol, ...); `field` maps that name to what the error names (options.fd_mode for a
    request, --fd for a command)."""
    for name in ("atol", "rtol"):
        value = getattr(options, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise OptionError(f"{value} is not a finite number >= 0", field=field(name))
    fd = options.fd
    if fd.mode not in FD_MODES:
        raise OptionError(f"unknown fd_mode '{fd.mode}' (expected one of {', '.join(FD_MODES)})",
                          field=field("fd_mode"))
    if fd.method not in FD_METHODS:
        raise OptionError(f"unknown fd_method '{fd.method}' (expected {' or '.join(FD_METHODS)})",
                          field=field("fd_method"))
    if fd.directions is not None and fd.directions < 1:
        raise OptionError(f"{fd.directions}: needs at least 1 direction", field=field("directions"))
    if fd.seed < 0:
        raise OptionError(f"seed must be 0 or more, got {fd.seed}", field=field("seed"))
    if options.symbolic.max_elements < 0:  # 0 skips the oracle as --symbolic off does; below it means nothing
        raise OptionError(f"symbolic budget must be 0 or more, got {options.symbolic.max_elements}",
                          field=field("symbolic_budget"))
    if options.dtype is not None and options.dtype not in DTYPES:
        raise OptionError(f"unknown dtype '{options.dtype}' (expected float32 or float64)", field=field("dtype"))
    if options.integrity not in INTEGRITY_MODES:
        raise OptionError(f"unknown integrity mode '{options.integrity}' (expected off or check)",
                          field=field("integrity"))
    try:
        parse_policy(options.checkpoint)
    except OptionError as exc:
        raise OptionError(exc.reason, field=field("checkpoint")) from None
