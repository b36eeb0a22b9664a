"""One parameter's result as data: its finite-difference check (FDRow), its comparison with the exact
symbolic gradient and the relation of the two references (SymbolicRow), and what the verdict made of
them (verdict.py sets status, explained_by, failed_by). run.py builds every row through one function
(run.parameter_result); to_dict renders the JSON report's per-parameter keys (a contract: report.py's
docstring), flat as they always were.

How finite differences checked a parameter is data too: the mode of its reference (FDMode) and what
the joint screen did with it (Screen); `checked_by` is only their rendering, "joint, then full" and
the like, for the report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np
from gradcheck_core.report import row_status

from ..oracles.fd_modes import FDMode
from .compare import Comparison, Tolerance
from .jsonnum import json_float

MAX_LISTED = 1000  # gradient/reference values included per parameter
PROVIDED, NOT_PROVIDED = "provided", "not provided"  # a claimed gradient's (verify/claims.py)


def _none() -> np.ndarray:
    return np.zeros(0, np.intp)


class Screen(Enum):
    """What the joint screen (verify/joint_check.py) did with a parameter."""
    NONE = "none"  # not screened: checked on its own from the start
    CLEARED = "cleared"  # the screen passed it: its row shows the whole graph's directional derivatives
    FLAGGED = "flagged"  # flagged, then checked on its own (in full or projected)
    NARROWED = "narrowed"  # flagged, too large to check in full: narrowed to elements (bisection)
    # flagged, not followed up on its own (the follow-up's budget, joint_check.spare): decided by its own
    # directional values (joint_check.Evidence), FAIL where they prove it wrong, else undecided
    BY_SCREEN = "by_screen"


@dataclass
class FDRow:
    """The subject's gradient against finite differences (fd_check.FDCheck, with what the oracle says of
    how it differenced: FDResult's mode, directions and count)."""
    mode: FDMode  # FULL: `reference` has the parameter's shape; PROJECTION, JOINT: directional derivatives
    comparison: Comparison  # subject vs reference, each value allowed the tolerance plus its FD error
    reference: np.ndarray  # first-pass differences, refined where they failed (the narrowed: see Screen)
    error: np.ndarray  # estimated error of each reference value (reference's shape)
    evaluations: int = 0
    screen: Screen = Screen.NONE
    # the comparison's verdict, except for a row the screen cleared: True (where the whole disagreed, the
    # bisection cleared this parameter's half)
    passed: bool = True
    engine_projection: np.ndarray | None = None  # PROJECTION, JOINT: the subject's directional derivatives
    directions: np.ndarray | None = None  # PROJECTION: the oracle's unit directions (k, n)
    refined: np.ndarray = field(default_factory=_none)  # flat indices refined
    undecidable: np.ndarray = field(default_factory=_none)  # flat indices
    unrefined: int = 0  # of undecidable, those left so by fd_check.REFINE_MAX
    # flat indices off on the first pass and never refined: a confirmed mismatch settled the verdict first;
    # left out of the comparison (fd_check.py)
    unconfirmed: np.ndarray = field(default_factory=_none)

    @property
    def checked_by(self) -> str:
        """The report's `fd_checked_by`: "full" | "projection" | "joint" (cleared by the screen) |
        "joint, then full" / "joint, then projection" (flagged, its own check decided) | "joint, then
        bisection" (flagged and narrowed to elements) | "joint, by the screen" (flagged, decided by its own
        directional values: FAIL where they prove it wrong, else undecided; elements not checked one by one)."""
        if self.screen is Screen.NONE or self.screen is Screen.CLEARED:
            return self.mode.value
        if self.screen is Screen.BY_SCREEN:
            return "joint, by the screen"
        return "joint, then " + ("bisection" if self.screen is Screen.NARROWED else self.mode.value)

    @property
    def directional(self) -> bool:
        """Its reference is directional derivatives (projection or joint), not the gradient's elements."""
        return self.mode is not FDMode.FULL


@dataclass
class SymbolicRow:
    """The exact gradient (float64, from the symbolic oracle), the subject against it, and the two
    references against each other (how far to trust finite differences on this graph)."""
    gradient: np.ndarray
    comparison: Comparison  # subject vs symbolic
    fd_vs_symbolic: Comparison  # finite differences vs the symbolic gradient's own projection


@dataclass
class ParameterResult:
    name: str
    shape: tuple
    gradient: np.ndarray  # the subject's dL/dp (the engine's, or the claim), float64 on the host
    fd: FDRow
    symbolic: SymbolicRow | None  # None: the symbolic oracle did not run
    tolerance: Tolerance
    # atol's term as applied (compare.Tolerance.absolute): atol * max(1, max|ref|), or less for a float64
    # gradient that vanishes (held to its own size); None for a row the joint screen cleared
    absolute: float | None = None
    # why finite differences could neither confirm nor clear the parameter (None: they decided): its row is
    # "undecided" and the verdict is not a pass (an fd_unresolved finding says why)
    unresolved: str | None = None
    status: str = ""  # verdict.py: "ok" | "ok (precision)" | "ok (kink)" | "affected" | "undecided" | "FAIL" |
    # "not provided" (claimed gradients: no claim for it)
    explained_by: str | None = None  # the finding cause that excuses a failed comparison
    failed_by: str | None = None  # the error finding's cause that fails this parameter
    # graph.ir.SourceName: the names it has in the framework that made the model (merged, transposed or
    # derived initializers of an ONNX export; empty when its own name says it all)
    source_names: list = field(default_factory=list)
    # under claimed gradients (verify/claims.py): PROVIDED | NOT_PROVIDED ("" when the engine is the subject);
    # vs_engine (compare.Comparison) the claim against the engine's own gradient
    claim: str = ""
    vs_engine: Comparison | None = None

    @property
    def verdict_reference(self) -> str:
        return "symbolic" if self.symbolic is not None else "finite_differences"

    @property
    def verdict_comparison(self) -> Comparison:
        """The comparison `passed` and `status` are judged on (the subject vs the verdict reference)."""
        if self.symbolic is not None:
            return self.symbolic.comparison
        return replace(self.fd.comparison, passed=self.fd.passed)

    @property
    def passed(self) -> bool:
        """The subject agrees with the verdict's reference (a claim not provided never does)."""
        # verdict_comparison's own `passed`, read without building that Comparison (a dataclass replace per
        # call: 1,024 calls, ~0.1 s, on one chain_256 report)
        agrees = self.symbolic.comparison.passed if self.symbolic is not None else self.fd.passed
        return self.claim != NOT_PROVIDED and agrees

    def to_dict(self, arrays: bool = False) -> dict:
        """The report's keys for this parameter. arrays: the listed values stay float64 NumPy arrays where
        finite (Report.to_json's: json_text writes an array's numbers in C, not a Python float each)."""
        fd, c = self.fd, self.fd.comparison
        d = {
            "name": self.name,
            "shape": list(self.shape),
            "fd_mode": fd.mode.value,
            "fd_checked_by": fd.checked_by,
            "gradient": _listed(self.gradient, arrays),
            "reference": _listed(fd.reference, arrays),
            "max_abs_error": json_float(c.max_abs_error),
            "max_rel_error": json_float(c.max_rel_error),
            "worst_index": list(c.worst_index),
            "engine_at_worst": json_float(c.engine_at_worst),
            "reference_at_worst": json_float(c.reference_at_worst),
            "tolerance": {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol,
                          **({} if self.absolute is None else {"absolute": json_float(self.absolute)})},
            "passed": self.passed,
            "gradient_norm": json_float(np.linalg.norm(self.gradient)),
            "fd_evaluations": fd.evaluations,
            **_fd_error_keys(fd, arrays),
        }
        if self.gradient.size > MAX_LISTED:
            d["truncated"] = True
        if fd.engine_projection is not None:
            d["engine_projection"] = _listed(fd.engine_projection, arrays)
        d["fd_passed"] = fd.passed
        d["verdict_reference"] = self.verdict_reference
        d["status"] = row_status(self.status, self.passed)
        d["explained_by"] = self.explained_by
        d["failed_by"] = self.failed_by
        d["source_names"] = [s.to_dict() for s in self.source_names]
        if self.claim:
            d["claim"] = self.claim
        if self.vs_engine is not None:
            v = self.vs_engine
            d["vs_engine"] = {"max_abs_error": json_float(v.max_abs_error), "worst_index": list(v.worst_index),
                              "claimed_at_worst": json_float(v.engine_at_worst),
                              "engine_at_worst": json_float(v.reference_at_worst), "agree": v.passed}
        d["symbolic"], d["fd_vs_symbolic"] = _symbolic_keys(self.symbolic, arrays)
        return d


def _listed(a: np.ndarray, arrays: bool = False):
    """The first MAX_LISTED values, flat: a list (non-finite ones spelt as json_float does), or with `arrays`
    the float64 array itself when all are finite."""
    v = np.asarray(a, dtype=np.float64).reshape(-1)[:MAX_LISTED]
    # finite values have a finite sum (one that overflows takes the long way below, to the same floats): one
    # C call, not isfinite's array and all()'s Python wrapper (2,048 arrays in chain_256's report)
    if math.isfinite(np.add.reduce(v)):
        return v if arrays else v.tolist()
    return [json_float(x) for x in v.tolist()]


def _fd_error_keys(fd: FDRow, arrays: bool) -> dict:
    worst = np.ravel_multi_index(fd.comparison.worst_index, np.shape(fd.reference)) if fd.comparison.worst_index \
        else 0
    return {"fd_error": _listed(fd.error, arrays),
            "fd_error_at_worst": json_float(fd.error.reshape(-1)[worst]) if fd.error.size else 0.0,
            "fd_refined": int(len(fd.refined)),
            "fd_undecidable": [int(i) for i in fd.undecidable],  # flat, like reference
            "fd_unconfirmed": [int(i) for i in fd.unconfirmed]}


def _symbolic_keys(s: SymbolicRow | None, arrays: bool) -> tuple:
    if s is None:
        return None, None
    c, f = s.comparison, s.fd_vs_symbolic
    return ({"gradient": _listed(s.gradient, arrays), "max_abs_error": json_float(c.max_abs_error),
             "max_rel_error": json_float(c.max_rel_error), "worst_index": list(c.worst_index),
             "engine_at_worst": json_float(c.engine_at_worst),
             "symbolic_at_worst": json_float(c.reference_at_worst), "passed": c.passed},
            {"max_abs_error": json_float(f.max_abs_error), "max_rel_error": json_float(f.max_rel_error),
             "worst_index": list(f.worst_index), "fd_at_worst": json_float(f.engine_at_worst),
             "symbolic_at_worst": json_float(f.reference_at_worst), "agree": f.passed})
