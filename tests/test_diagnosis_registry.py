"""Diagnosis over the whole op registry: for every differentiable op, a planted wrong rule (its vjp
scaled by 1.5) is named rule_error at the op's node, and a corrupted saved input is named
cache_corruption there -- caught by the fingerprints, or, with integrity off, inferred by localization.
Parametrized over the registry, so a new op is covered without editing this file."""
import contextlib
import dataclasses

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, forward, parse_fault, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import all_ops
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify

# ops a gradient flows through (sign, floor, ceil have a vjp but no differentiable input: nothing to plant)
DIFFERENTIABLE = [op for op in all_ops() if op.vjp is not None and op.cases is not None
                  and any(op.is_differentiable(i) for i in range(op.arity or 1))]


def op_graph(op_name, case, rng):
    """loss = sum(op(inputs) * r): every output element weighs differently."""
    b = GraphBuilder(op_name)
    op = REGISTRY[op_name]
    names = []
    for i, x in enumerate(case.inputs):
        x = np.asarray(x)
        names.append(b.input(f"in{i}", x, requires_grad=x.dtype.kind == "f" and op.is_differentiable(i)))
    y = b.node(op_name, *names, name="y", **case.attrs)
    shape = load_graph(_probe(b)).specs["y"].shape
    b.output(b.node("sum", b.node("mul", y, b.input("r", rng.uniform(0.5, 1.5, size=shape)), name="yr"), name="L"))
    return load_graph(b.build())


def _probe(b):
    """The graph so far, with sum(y) as its loss: to learn y's shape."""
    p = GraphBuilder("probe")
    p.msg.CopyFrom(b.msg)
    p.output(p.node("sum", "y", name="_probe_sum"))
    return p.build()


@contextlib.contextmanager
def registered_scaled_rule(op, factor: float, suffix: str):
    """A copy of `op` named op.name + suffix whose vjp is `factor` times the right one (a planted
    wrong rule), registered for the block."""
    bad = dataclasses.replace(op, name=f"{op.name}{suffix}",
                              vjp=lambda xp, g, saved, **a: tuple(None if v is None else factor * v
                                                                  for v in op.vjp(xp, g, saved, **a)))
    register(bad)
    try:
        yield bad
    finally:
        del REGISTRY[bad.name]


@pytest.fixture
def scaled_rule(request):
    with registered_scaled_rule(request.param, 1.5, "_bad") as bad:
        yield bad


@pytest.mark.parametrize("scaled_rule", DIFFERENTIABLE, ids=lambda o: o.name, indirect=True)
def test_wrong_rule_is_named_at_its_node(scaled_rule, rng):
    case = REGISTRY[scaled_rule.name[:-4]].cases(rng)[0]
    report = verify(op_graph(scaled_rule.name, case, rng))
    assert report.verdict == "fail"
    errors = [(f.node, f.cause) for f in report.findings if f.severity == "error"]
    assert errors == [("y", "rule_error")], report.to_text()


def saved_float_value(op):
    """The name ('in0', 'in1', ... or 'y') of a float value the op saves for its backward, or None."""
    case = op.cases(np.random.default_rng(0))[0]
    graph = op_graph(op.name, case, np.random.default_rng(0))
    program = Program(graph, np.float64)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY))
    return next((s.source for node, s in tape.store.slots()
                 if node == "y" and s.source is not None and s.tensor.dtype.kind == "f"), None)


SAVING = [op for op in DIFFERENTIABLE if saved_float_value(op) is not None]


def test_most_ops_save_something_to_corrupt():
    assert {"mul", "exp", "matmul", "relu", "max", "cross_entropy"} <= {op.name for op in SAVING}


@pytest.mark.parametrize("integrity", ["check", "off"])
@pytest.mark.parametrize("op", SAVING, ids=lambda o: o.name)
def test_corrupted_saved_value_is_named_at_its_node(op, integrity, rng):
    case = op.cases(rng)[0]
    graph = op_graph(op.name, case, rng)
    value = saved_float_value(op)
    report = verify(graph, VerifyOptions(faults=(parse_fault(f"{value}:scale:-1.7"),), integrity=integrity))
    assert "y" in report.faults[0].readers
    assert report.verdict == "fail", report.to_text()
    causes = {(f.node, f.cause) for f in report.findings if f.severity == "error"}
    assert ("y", "cache_corruption") in causes, report.to_text()
