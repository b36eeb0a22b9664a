"""One finding per cause, and the same note whatever decided: a recompute mismatch under the checkpoint
policy in force is the one finding for every gradient it changed; an input within a finite-difference
step of a kink is noted whichever rung of the step ladder (or the symbolic oracle) settled the value."""
import numpy as np
import pytest

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.ops.base import FLOAT, OpDef, Spec
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify


@pytest.fixture
def flaky_op():
    """A test-only op whose second evaluation is off by 0.01 (the first forward or its recompute,
    depending on the run): a recompute that differs from the first forward."""
    calls = [0]

    def fwd(xp, x):
        calls[0] += 1
        return x + 0.01 if calls[0] == 2 else x * 1.0
    op = register(OpDef(name="test_flaky", forward=fwd, vjp=lambda xp, g, s: (g,),
                        infer=lambda node, specs, attrs: (Spec(specs[0].shape, FLOAT), attrs),
                        arity=1, input_kinds=(FLOAT,), doc="test only"))
    try:
        yield op
    finally:
        del REGISTRY[op.name]


def _chain_with(op_name):
    rng = np.random.default_rng(5)
    b = GraphBuilder("flaky")
    h = b.input("x", rng.uniform(-1, 1, size=(2, 4)))
    for k in range(6):
        w = b.input(f"W{k}", rng.standard_normal((4, 4)) / 2, requires_grad=True)
        h = b.node("tanh", b.node("matmul", h, w, name=f"z{k}"), name=f"h{k}")
        if k == 1:
            h = b.node(op_name, h, name="flaky")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


def test_a_recompute_mismatch_is_the_one_finding_for_the_gradients_it_changed(flaky_op):
    report = verify(_chain_with("test_flaky"), VerifyOptions(checkpoint="every:2"))
    assert report.verdict == "fail"
    errors = [f for f in report.findings if f.severity == "error"]
    assert [(f.node, f.cause) for f in errors] == [("flaky", "recompute_mismatch")], report.to_text()
    failing = [p for p in report.parameters if p.status == "FAIL"]
    assert any(p.name not in ("W0", "W1") for p in failing)  # downstream of it too, not just its ancestors
    assert all(p.failed_by == "recompute_mismatch" for p in failing)
    assert {p.name for p in failing} <= set(errors[0].parameters)


def _kinked(op: str, v: float):
    b = GraphBuilder(f"{op}_near_kink")
    x = b.input("x", np.array([0.5, v, -0.3]), requires_grad=True)
    b.output(b.node("sum", b.node("mul", b.node(op, x, name="k"), b.input("w", np.array([1.0, 2.0, 3.0]))), name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "fd-only"])
@pytest.mark.parametrize("op, v", [("abs", 1e-9), ("abs", -1e-9), ("abs", 1e-7), ("relu", 1e-6), ("relu", -1e-7),
                                   ("relu", 1e-9), ("relu", -1e-9)])
def test_a_kink_within_the_step_is_noted_whichever_rung_decided(op, v, symbolic):
    report = verify(_kinked(op, v), VerifyOptions(symbolic=SymbolicOptions(enabled=symbolic)))
    assert report.verdict == "pass"
    (note,) = report.findings
    assert (note.node, note.cause, note.parameters) == ("k", "nondifferentiable_point", ["x"])
    # info where the differences that settled it agreed, the excusing warning where they disagreed
    assert note.severity in ("info", "warning")
    assert f"near its kink x == 0, {abs(v):.3g} from it -- within a finite-difference step" in note.detail


def test_no_note_beyond_the_step():
    report = verify(_kinked("relu", 1e-3))
    assert report.verdict == "pass" and not report.findings
