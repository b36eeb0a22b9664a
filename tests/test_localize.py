"""Localization: the first node where the engine's gradient goes wrong, and its cause.

A planted op with a wrong derivative rule (registered for the test only, removed after) sits somewhere
in a larger graph; the diagnosis must name exactly that node as rule_error."""
import dataclasses

import numpy as np
import pytest
import torch

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import get_op
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify

from conftest import EXAMPLES


@pytest.fixture
def buggy_square():
    """square with a wrong rule, d/dx = 3x (a typo'd derivative), registered for one test."""
    op = dataclasses.replace(get_op("square"), name="buggy_square",
                             vjp=lambda xp, g, saved, **_: (g * 3.0 * saved[0],))
    register(op)
    yield op.name
    del REGISTRY[op.name]


def chain(n: int, bad_at: int | None, width: int = 3, batch: int = 2, bad_op: str = "buggy_square"):
    """n nodes: x @ W, then (sin, mul by a, tanh) repeated, the bad op at position bad_at."""
    rng = np.random.default_rng(7)
    b = GraphBuilder(f"chain{n}")
    h = b.node("matmul", b.input("x", rng.uniform(-1, 1, (batch, width))),
               b.input("W", rng.uniform(-1, 1, (width, width)), requires_grad=True), name="n0")
    a = b.input("a", rng.uniform(0.5, 1.5, (width,)), requires_grad=True)
    cycle = ["sin", "mul", "tanh"]
    for i in range(1, n - 1):
        if i == bad_at:
            h = b.node(bad_op, h, name=f"n{i}")
        elif cycle[i % 3] == "mul":
            h = b.node("mul", h, a, name=f"n{i}")
        else:
            h = b.node(cycle[i % 3], h, name=f"n{i}")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


def test_planted_rule_error_is_named_in_a_50_node_graph(buggy_square):
    report = verify(chain(50, bad_at=31))
    assert report.verdict == "fail"
    [f] = report.findings
    assert (f.node, f.op, f.cause, f.severity) == ("n31", "buggy_square", "rule_error", "error")
    assert sorted(f.parameters) == ["W", "a"]
    # the worst element: the rule gives 3x where the derivative is 2x, times the incoming adjoint
    assert f.worst.engine == pytest.approx(1.5 * f.worst.reference, rel=1e-6)


def test_planted_rule_error_in_large_values_uses_projections(buggy_square):
    report = verify(chain(12, bad_at=7, width=40, batch=16))
    [f] = report.findings
    assert (f.node, f.cause) == ("n7", "rule_error")
    assert f.worst.index[0] == "direction"


def test_no_localize_gives_the_verdict_only(buggy_square):
    report = verify(chain(20, bad_at=5), VerifyOptions(localize=False))
    assert report.verdict == "fail" and report.findings == []


def test_two_independent_faults_are_both_named(buggy_square):
    b = GraphBuilder("two")
    p = b.input("p", [0.5, -1.0], requires_grad=True)
    q = b.input("q", [2.0, 0.25], requires_grad=True)
    left = b.node("buggy_square", b.node("sin", p, name="sp"), name="bad_left")
    right = b.node("buggy_square", b.node("cos", q, name="cq"), name="bad_right")
    b.output(b.node("sum", b.node("add", b.node("exp", left, name="el"), right, name="s"), name="L"))
    report = verify(load_graph(b.build()))
    named = sorted((f.node, tuple(f.parameters), f.cause) for f in report.findings)
    assert named == [("bad_left", ("p",), "rule_error"), ("bad_right", ("q",), "rule_error")]


def test_a_correct_graph_downstream_of_nothing_wrong_is_not_blamed(buggy_square):
    """The faulty node is the one with a right incoming adjoint: not its (right) neighbours."""
    report = verify(chain(9, bad_at=1))
    [f] = report.findings
    assert f.node == "n1"


def test_kept_adjoints_match_torch_retain_grad():
    graph = load_graph(EXAMPLES / "seed.json")
    program = Program(graph, np.float64)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY))
    backward(tape, keep_adjoints=True)
    w = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    x = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    z = w * x
    a = z * z
    z.retain_grad()
    a.retain_grad()
    (a / 4).backward()
    assert float(tape.adjoints["z"]) == z.grad.item() and float(tape.adjoints["a"]) == a.grad.item()
    assert float(tape.adjoints["w"]) == w.grad.item()
    assert float(tape.contributions[("z", 0)]) == w.grad.item()  # mul's contribution to w
