"""Shared by the ONNX tests: where ONNX's shipped test data lives, and a forward of an imported graph."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the optional 'onnx' extra is not installed (pip install '.[onnx]')")

from gradcheck_svc.backend import NUMPY  # noqa: E402
from gradcheck_svc.engine import Program, forward, prepare_feeds  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.validate import Limits  # noqa: E402

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
BIG = Limits(max_elements=10**9)  # VGG-19's fc6 alone holds 100M weights


def engine_values(msg, dtype=np.float64, allow_nonfinite: bool = False) -> dict:
    """Every value of a plain forward of an imported graph (host arrays)."""
    # a forward only: nothing is checked, so a graph without parameters is fine
    graph = load_graph(msg, limits=BIG, allow_nonfinite=allow_nonfinite, require_parameters=False)
    program = Program(graph, dtype)
    return forward(program, NUMPY, prepare_feeds(program, NUMPY), grad=False, keep_values=True).values
