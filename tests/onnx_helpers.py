"""Shared by the ONNX tests: where ONNX's shipped test data lives, a forward of an imported graph, and the ONNX
tensor that an imported parameter's source_names say torch's tensors make."""
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


# ONNX's gate blocks in torch's numbering (docs/onnx.md): LSTM i, o, f, c of torch's i, f, g, o; GRU z, r,
# h of torch's r, z, n; a plain RNN has one block
GATES = {"lstm_gates": (0, 3, 1, 2), "gru_gates": (1, 0, 2), "rnn_stacked": (0,)}


def torch_image(entries, torch_arrays: dict, shape) -> np.ndarray:
    """The ONNX tensor that source_names says torch's tensors make (of values or of gradients): the sum
    over the torch parameters it merges (one alone: itself) of each, its transpose or its reshape, or the RNN's
    W[d] / R[d] / B[d] = (input bias, hidden bias) per direction with the gate blocks reordered."""
    (relation,) = {e.relation for e in entries}
    names = list(dict.fromkeys(e.name for e in entries))
    if relation in ("same", "transposed", "reshaped"):
        made = {"same": lambda t: t, "transposed": lambda t: t.T, "reshaped": lambda t: t.reshape(shape)}[relation]
        return sum(made(torch_arrays[n]) for n in names)
    order = GATES[relation]
    directions = [[n for n in names if n.endswith("_reverse") == bool(d)] for d in range(shape[0])]
    return np.stack([np.concatenate([np.concatenate([np.split(torch_arrays[n], len(order))[j] for j in order])
                                     for n in group]) for group in directions])
