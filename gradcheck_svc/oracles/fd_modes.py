"""The finite-difference modes, as data: what a parameter's differences are taken over.

A StrEnum, so the oracle's own strings (finite_diff.MODES, FDResult.mode, options.fd.mode) compare
equal to its members and JSON writes each as its value (tests/verify/test_verify_layout.py keeps the two
lists the same).
"""
from __future__ import annotations

from enum import StrEnum


class FDMode(StrEnum):
    AUTO = "auto"  # an option only: each parameter's mode by cost (FiniteDifferences.mode_for)
    FULL = "full"  # every element: the reference has the parameter's shape
    PROJECTION = "projection"  # random directions per parameter: the reference is k directional derivatives
    JOINT = "joint"  # random directions spanning all parameters at once (verify/joint_check.py)
