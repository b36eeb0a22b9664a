"""Floats for the JSON report: NaN and Inf spelled as in the protobuf JSON mapping."""
from __future__ import annotations

import math


def json_float(x):
    """A JSON-safe float; None stays None (an absent value)."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x
