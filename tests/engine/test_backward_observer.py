"""The backward loop is the chain rule; what happens beside it is an observer's (engine/observers.py): the
memory accounting the memory profile reads, and the recording fault localization reads."""
from __future__ import annotations

import numpy as np
import pytest
from graphs_memory import chain, mlp, residual

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.engine.memory import owner
from gradcheck_svc.engine.observers import AdjointRecorder

GRAPHS = {"residual": residual, "mlp": mlp, "chain": lambda: chain(12)}


def _bytes(arrays) -> int:
    return sum({id(owner(a)): owner(a).nbytes for a in arrays}.values())


@pytest.fixture(scope="module", params=list(GRAPHS))
def run(request):
    program = Program(GRAPHS[request.param](), np.float64)
    feeds = prepare_feeds(program, NUMPY)
    tape = forward(program, NUMPY, feeds)
    return program, feeds, tape, backward(tape, observer=AdjointRecorder(tape))


def test_the_accounting_drops_every_adjoint_it_held(run):
    """After backward the meter holds what the caller holds: the graph's inputs, the loss and the parameters'
    gradients (counted as gradients) -- every adjoint of an intermediate value was dropped when its step had
    used it, including those passed through as an input's own (add's)."""
    program, feeds, tape, grads = run
    live = tape.live
    assert live.grads == _bytes(grads.values()) > 0
    assert live.current == _bytes([*feeds.values(), *grads.values(), tape.loss])
    assert live.peak > live.current


def test_the_recorder_sees_each_contribution_the_chain_rule_sums(run):
    """Each parameter's gradient is the sum of the vjp contributions the observer was shown for it, and the
    recorded adjoints end with the gradients themselves."""
    program, feeds, tape, grads = run
    to = {(s.name, k): name for s in program.steps for k, name, _ in s.grad_targets}
    for p in program.params:
        parts = [g for key, g in tape.contributions.items() if to[key] == p]
        assert parts, p
        np.testing.assert_allclose(sum(parts), grads[p], rtol=1e-12, atol=1e-300)
        assert tape.adjoints[p] is grads[p]
