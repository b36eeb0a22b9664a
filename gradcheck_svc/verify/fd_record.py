"""One parameter's finite differences as a record and back: the oracle's FDResult and its check
(fd_check.FDCheck) as JSON-able metadata plus named arrays (what an FD shard stores: fd_shards.py).

The fields are read from the dataclasses themselves, so a field added to either travels without a
second list to keep: FDCheck's arrays under their own names, FDResult's under fd_NAME, its mode,
evaluation count and method and the comparison in the metadata. Directions are the caller's (a shard stores
their digest: they are regenerated from the seed).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..oracles.fd_modes import FDMode
from ..oracles.finite_diff import FDResult
from .compare import Comparison
from .fd_check import FDCheck

_CHECK_ARRAYS = tuple(f.name for f in dataclasses.fields(FDCheck) if f.name != "comparison")
_RESULT_ARRAYS = ("reference", "noise")  # FDResult's arrays stored; directions: the caller's
_RESULT_META = ("mode", "evaluations", "method")


def to_record(ref: FDResult, check: FDCheck) -> tuple[dict, dict]:
    """(metadata, arrays) of one parameter's differences and their check."""
    meta = {"mode": str(ref.mode), "evaluations": int(ref.evaluations), "method": str(ref.method),
            "comparison": _json(dataclasses.asdict(check.comparison))}
    arrays = {f"fd_{k}": np.asarray(getattr(ref, k)) for k in _RESULT_ARRAYS}
    arrays.update({k: np.asarray(getattr(check, k)) for k in _CHECK_ARRAYS})
    return meta, arrays


def from_record(meta: dict, arrays: dict, directions: np.ndarray | None = None) -> tuple[FDResult, FDCheck]:
    """to_record's inverse; `directions`: a projection's (k, n) directions, which the record does not hold."""
    c = meta["comparison"]
    comparison = Comparison(**{**c, "worst_index": tuple(c["worst_index"])})
    ref = FDResult(mode=FDMode(meta["mode"]), directions=directions, evaluations=meta["evaluations"],
                   method=meta.get("method", "central"),  # a record from before complex steps: central
                   **{k: arrays[f"fd_{k}"] for k in _RESULT_ARRAYS})
    return ref, FDCheck(comparison, **{k: arrays[k] for k in _CHECK_ARRAYS})


def _json(d: dict) -> dict:
    """The comparison's numbers as JSON values (NumPy scalars to Python's, the index as a list)."""
    return {k: [int(x) for x in v] if isinstance(v, tuple) else bool(v) if isinstance(v, (bool, np.bool_))
            else float(v) for k, v in d.items()}
