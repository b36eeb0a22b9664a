"""A 0-d tensor reduced over dim 0 or -1: PyTorch accepts it (the value itself, keepdim or not) where
NumPy refuses the axis; the registry's reductions follow PyTorch, checked against torch autograd."""
import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_svc.errors import GraphError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import verify

TORCH = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}  # torch's names (read in the test)


def _graph(op, axis, keepdims, x=1.7):
    b = GraphBuilder("zero_d")
    y = b.node(op, b.input("x", np.array(x), requires_grad=True), axis=axis, keepdims=keepdims, name="r")
    b.output(b.node("mul", y, b.input("w", np.array(3.0)), name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [0, -1, [0], [-1]], ids=str)
@pytest.mark.parametrize("op", sorted(TORCH))
def test_reducing_a_0d_tensor_over_dim_0_or_minus_1_matches_torch(op, axis, keepdims):
    report = verify(_graph(op, axis, keepdims))
    t = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    out = getattr(torch, TORCH[op])(t, dim=axis if isinstance(axis, int) else axis[0], keepdim=keepdims) * 3.0
    out.backward()
    assert out.shape == torch.Size([])
    assert report.verdict == "pass" and not report.findings
    assert report.loss == pytest.approx(float(out.detach()), abs=1e-15)
    (row,) = report.parameters
    assert row.shape == () and float(row.gradient) == pytest.approx(float(t.grad), abs=1e-15)


@pytest.mark.parametrize("axis", [1, -2, [0, -1]], ids=str)
def test_other_axes_of_a_0d_tensor_are_still_refused(axis):
    with pytest.raises(GraphError) as e:
        _graph("sum", axis, False)
    assert e.value.node == "r"


AXIS_OPS = {"softmax": lambda t, d, k: torch.softmax(t, d), "log_softmax": lambda t, d, k: torch.log_softmax(t, d),
            "logsumexp": lambda t, d, k: torch.logsumexp(t, d, keepdim=k)}


AXIS_CASES = [(op, axis, False) for op in sorted(AXIS_OPS) for axis in (0, -1)] + \
    [("logsumexp", axis, True) for axis in (0, -1)]  # (softmax and log_softmax have no keepdims)


@pytest.mark.parametrize("op, axis, keepdims", AXIS_CASES)
def test_softmax_family_on_a_0d_tensor_matches_torch(op, axis, keepdims):
    b = GraphBuilder("zero_d_softmax")
    attrs = {"axis": axis, **({"keepdims": keepdims} if op == "logsumexp" else {})}
    y = b.node(op, b.input("x", np.array(0.8), requires_grad=True), name="r", **attrs)
    b.output(b.node("mul", y, b.input("w", np.array(3.0)), name="L"))
    report = verify(load_graph(b.build()))
    t = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    out = AXIS_OPS[op](t, axis, keepdims) * 3.0
    out.backward()
    assert out.shape == torch.Size([])
    assert report.verdict == "pass" and not report.findings
    assert report.loss == pytest.approx(float(out.detach()), abs=1e-15)
    assert float(report.parameters[0].gradient) == pytest.approx(float(t.grad), abs=1e-15)


def test_softmax_of_a_0d_tensor_over_another_axis_is_refused():
    b = GraphBuilder("zero_d_bad")
    b.output(b.node("softmax", b.input("x", np.array(0.8), requires_grad=True), axis=1, name="r"))
    with pytest.raises(GraphError) as e:
        load_graph(b.build())
    assert e.value.node == "r" and "0-d" in str(e.value)


INDEXING = [("take", np.array([0]), lambda t, i: torch.index_select(t, 0, i)),
            ("take", np.array(-1), lambda t, i: torch.index_select(t, -1, i)),
            ("take_along_axis", np.array(0), lambda t, i: torch.gather(t, 0, i))]


@pytest.mark.parametrize("op, index, theirs", INDEXING, ids=lambda v: v if isinstance(v, str) else None)
def test_indexing_a_0d_tensor_matches_torch(op, index, theirs):
    axis = -1 if index.ndim == 0 and index == -1 else 0
    b = GraphBuilder("zero_d_index")
    y = b.node(op, b.input("x", np.array(0.8), requires_grad=True), b.input("i", index, dtype="int64"),
               axis=axis, name="r")
    b.output(b.node("mul", y, b.input("w", np.array(3.0)), name="L"))
    report = verify(load_graph(b.build()))
    t = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    out = theirs(t, torch.tensor(0 if index.ndim == 0 and op == "take" else index)) * 3.0
    out.backward()
    assert out.shape == torch.Size([])
    assert report.verdict == "pass" and not report.findings
    assert report.loss == pytest.approx(float(out.detach()), abs=1e-15)
    assert float(report.parameters[0].gradient) == pytest.approx(float(t.grad), abs=1e-15)


@pytest.mark.parametrize("op, index, axis", [("take", np.array([0, 0]), 0), ("take", np.array([0]), 1),
                                             ("take_along_axis", np.array([0]), 0)])
def test_indexing_a_0d_tensor_otherwise_is_refused(op, index, axis):
    b = GraphBuilder("zero_d_index_bad")
    y = b.node(op, b.input("x", np.array(0.8), requires_grad=True), b.input("i", index, dtype="int64"),
               axis=axis, name="r")
    b.output(b.node("sum", y, name="L"))
    with pytest.raises(GraphError) as e:
        load_graph(b.build())
    assert e.value.node == "r"


def test_an_index_other_than_0_or_minus_1_of_a_0d_tensor_is_a_user_error():
    b = GraphBuilder("zero_d_index_value")
    y = b.node("take", b.input("x", np.array(0.8), requires_grad=True), b.input("i", np.array([3]), dtype="int64"),
               axis=0, name="r")
    b.output(b.node("sum", y, name="L"))
    with pytest.raises(GraphError) as e:
        verify(load_graph(b.build()))
    assert e.value.node == "r" and "index 3 is out of range for a 0-d input" in str(e.value)
