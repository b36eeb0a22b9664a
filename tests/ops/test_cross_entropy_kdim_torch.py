"""K-dimensional cross entropy (logits [N, C, d1, ...], labels [N, d1, ...]), as PyTorch defines it:
the loss and its gradient against torch autograd, through a full verification (engine, FD, SymPy)."""
import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it
F = LazyModule("torch.nn.functional")

from gradcheck_svc.errors import GraphError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import verify


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 4, 2, 3), (1, 2, 1, 1, 2)], ids=str)
def test_k_dimensional_cross_entropy_matches_torch(shape, reduction):
    rng = np.random.default_rng(len(shape))
    logits = rng.standard_normal(shape)
    labels = rng.integers(0, shape[1], size=shape[:1] + shape[2:])
    b = GraphBuilder("ce_kdim")
    b.output(b.node("cross_entropy", b.input("z", logits, requires_grad=True),
                    b.input("y", labels, dtype="int64"), reduction=reduction, name="L"))
    report = verify(load_graph(b.build()))
    t = torch.tensor(logits, requires_grad=True)
    loss = F.cross_entropy(t, torch.tensor(labels), reduction=reduction)
    loss.backward()
    assert report.verdict == "pass" and not [f for f in report.findings if f.severity == "error"]
    assert report.loss == pytest.approx(float(loss.detach()), rel=1e-12, abs=1e-14)
    (row,) = report.parameters
    assert np.allclose(row.gradient, t.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_mismatched_k_dimensional_labels_are_refused():
    b = GraphBuilder("ce_bad")
    b.output(b.node("cross_entropy", b.input("z", np.zeros((2, 3, 4)), requires_grad=True),
                    b.input("y", np.zeros((2, 3), dtype=np.int64), dtype="int64"), name="L"))
    with pytest.raises(GraphError) as e:
        load_graph(b.build())
    assert e.value.node == "L" and "[N, C, d1, ...]" in str(e.value)
