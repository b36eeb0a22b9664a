"""PyTorch's legacy concatenation rule: a 1-D empty tensor (shape [0]) is skipped whatever the other
inputs' rank; checked against torch.cat and its autograd."""
import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_svc.errors import GraphError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import verify


@pytest.mark.parametrize("empty_grad", [False, True], ids=["data", "parameter"])
@pytest.mark.parametrize("pos", [0, 1, 2])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_a_legacy_empty_input_is_skipped_as_torch_cat_does(dim, pos, empty_grad):
    a = np.arange(6.0).reshape(2, 3) / 7
    c = np.arange(3.0).reshape(1, 3) / 5 if dim == 0 else np.arange(2.0).reshape(2, 1) / 5
    b = GraphBuilder("cat_legacy")
    ins = [b.input("a", a, requires_grad=True), b.input("c", c, requires_grad=True)]
    ins.insert(pos, b.input("e", np.zeros(0), requires_grad=empty_grad))
    b.output(b.node("sum", b.node("sin", b.node("concat", *ins, axis=dim, name="r")), name="L"))
    report = verify(load_graph(b.build()))

    ta, tc = torch.tensor(a, requires_grad=True), torch.tensor(c, requires_grad=True)
    te = torch.zeros(0, dtype=torch.float64, requires_grad=empty_grad)
    ts = [ta, tc]
    ts.insert(pos, te)
    out = torch.sin(torch.cat(ts, dim=dim)).sum()
    out.backward()
    assert report.verdict == "pass" and not report.findings
    assert report.loss == pytest.approx(float(out.detach()), abs=1e-14)
    grads = {p.name: p.gradient for p in report.parameters}
    assert np.allclose(grads["a"], ta.grad.numpy(), atol=1e-14) and np.allclose(grads["c"], tc.grad.numpy(), atol=1e-14)
    if empty_grad:
        assert grads["e"].shape == tuple(te.grad.shape) == (0,)


def test_a_non_legacy_mismatch_is_still_refused():
    b = GraphBuilder("cat_bad")
    ins = [b.input("a", np.zeros((2, 3)), requires_grad=True), b.input("e", np.zeros((0, 2)))]
    b.output(b.node("sum", b.node("concat", *ins, axis=0, name="r"), name="L"))
    with pytest.raises(GraphError) as e:
        load_graph(b.build())
    assert e.value.node == "r"
