"""Integrity checking compares what the backward reads with what was saved, by value: a saved
tensor changed in place (same array object, same buffer) between forward and backward is a
corruption event naming its node, for small tensors (kept as bytes) and large ones (word sums)."""
import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder


def graph(n):
    b = GraphBuilder("g")
    x = b.input("x", np.linspace(-1, 1, n), requires_grad=True)
    b.output(b.node("sum", b.node("tanh", b.node("sin", x, name="s"), name="t"), name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("n", [4, 100_000], ids=["small", "large"])
def test_a_saved_tensor_changed_in_place_is_caught_by_value(n):
    program = Program(graph(n), np.float64)
    clean = forward(program, NUMPY, prepare_feeds(program, NUMPY), integrity="check")
    backward(clean)
    assert clean.store.events == []
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY), integrity="check")
    saved = tape.store._tensors["t"][0]  # tanh saves its output; change one element in place
    saved.reshape(-1)[n // 2] += 1e-12
    backward(tape)
    assert [(e.kind, e.node, e.slot) for e in tape.store.events] == [("corruption", "t", 0)]
    assert tape.store.events[0].tensor is saved
