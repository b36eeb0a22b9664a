"""The memory profile's inference figures are counted beside the reported gradient run's forward
(a second MemoryMeter handed the forward loop's own calls) instead of by a no-grad forward of their own: the twin's timeline must be, step
for step and byte for byte, the one a no-grad forward records -- over graphs with views, in-place
writes, multi-consumer values, derived saved tensors and integer inputs, with and without a
checkpoint policy (a checkpoint's kept and pending values are held on the meter, never the twin's)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import EXAMPLES
from graphs_memory import chain, mlp, residual

from gradcheck_svc.backend import get_backend
from gradcheck_svc.engine import backward, checkpoint_plan, forward, prepare_feeds
from gradcheck_svc.engine.program import program_of
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder

CPU = get_backend("cpu")


def _views_and_writes():
    """c += w (a graph input written in place), a reshape view of it, relu_ over it, a transpose."""
    b = GraphBuilder("views")
    w = b.input("w", [[1.0, -2.0], [3.0, -4.0]], requires_grad=True)
    acc = b.node("add", b.input("c", [[0.5, -0.5], [-1.5, 2.0]]), w, name="acc", inplace=True)
    flat = b.node("reshape", acc, name="flat", shape=[4])
    b.node("relu", acc, name="clipped", inplace=True)
    t = b.node("transpose", b.node("mul", acc, w, name="m"), name="t")
    b.output(b.node("add", b.node("sum", flat, name="s1"), b.node("sum", t, name="s2"), name="L"))
    return load_graph(b.build())


GRAPHS = {
    "views_and_writes": _views_and_writes,
    "residual": residual,
    "dropout_mlp": mlp,
    "chain": lambda: chain(12),
    **{name: (lambda name=name: load_graph(EXAMPLES / f"{name}.json"))
       for name in ("inplace_relu", "broadcasting", "shared_value", "mlp_cross_entropy", "softmax_logsumexp")},
}


def _rows(timeline):
    return list(timeline.kinds), list(timeline.names), list(timeline.numbers)


INPLACE = {"views_and_writes", "inplace_relu"}  # (checkpointing them is refused: test_inplace.py)
CASES = [(name, policy) for name in sorted(GRAPHS) for policy in ("none", "every:2")
         if policy == "none" or name not in INPLACE]


@pytest.mark.parametrize("name, policy", CASES)
def test_the_twin_is_the_no_grad_forwards_timeline(name, policy):
    graph = GRAPHS[name]()
    program = program_of(graph, np.float64)
    assert bool(program.inplace_root) == (name in INPLACE)
    run = forward(program, CPU, prepare_feeds(program, CPU), grad=True, record_timeline=True, integrity="check",
                  checkpoint=checkpoint_plan(program, policy), inference_twin=True)
    backward(run)  # (the twin is the forward's: what the backward holds never reaches it)
    inference = forward(program, CPU, prepare_feeds(program, CPU), grad=False, record_timeline=True)
    assert _rows(run.inference.timeline) == _rows(inference.live.timeline)
    assert len(run.inference.timeline) == len(program.steps)
