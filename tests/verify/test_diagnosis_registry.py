"""Diagnosis over the whole op registry: for every differentiable op, a planted wrong rule (its vjp
scaled by 1.5) is named rule_error at the op's node, and a corrupted saved input is named
cache_corruption there -- caught by the fingerprints, or, with integrity off, inferred by localization.
Parametrized over the registry, so a new op is covered without editing this file."""
import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, forward, parse_fault, prepare_feeds
from gradcheck_svc.ops.registry import REGISTRY
from gradcheck_svc.verify import VerifyOptions, verify

from op_cases import DIFFERENTIABLE, op_graph, registered_scaled_rule


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
