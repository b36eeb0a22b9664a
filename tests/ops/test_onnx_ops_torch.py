"""The ops added for today's exported models whose torch spelling differs from ours (hard_sigmoid's
alpha and beta, layer_norm's axis, the masks' bool outputs), against torch, op by op, on every test
case the op declares, in float64: the forward value, and the gradient of the same weighted loss the
registry tests use (a mask read as where(mask, r, -r): torch's gradient through it is exactly zero,
and so must ours be). Ops whose torch function takes the same inputs and attributes (erf,
hard_swish) are in the random graphs of test_torch_reference.py instead."""
from __future__ import annotations

import numpy as np
import pytest

from gradcheck_svc.ops import get_op
from gradcheck_svc.verify.audit import mask_shape, op_graph
from gradcheck_svc.verify.run import VerifyOptions, run_engine

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _layer_norm(x, scale, bias=None, *, axis, epsilon, x_rank, p_ranks):
    shape = tuple(x.shape[axis:])
    return F.layer_norm(x, shape, scale.expand(shape), None if bias is None else bias.expand(shape), epsilon)


def _scatter_elements(data, upd, *, axis, reduction, indices, flat, data_rank, upd_shape, targets, inverse):
    idx = torch.tensor(indices, dtype=torch.int64)
    idx = torch.where(idx < 0, idx + data.shape[axis], idx)
    return data.scatter_add(axis, idx, upd) if reduction == "add" else data.scatter(axis, idx, upd)


TORCH = {
    "scatter_elements": _scatter_elements,
    "hard_sigmoid": lambda x, alpha=0.2, beta=0.5: torch.clamp(alpha * x + beta, 0.0, 1.0),
    "layer_norm": _layer_norm,
    "einsum": lambda *xs, equation: torch.einsum(equation, *xs),
    "top_k": lambda x, k, axis, largest: torch.topk(x, k, dim=axis, largest=largest).values,
    "equal": torch.eq, "less": torch.lt, "greater": torch.gt, "less_equal": torch.le, "greater_equal": torch.ge,
    "logical_not": torch.logical_not, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "isnan": torch.isnan, "isinf": torch.isinf,
}


@pytest.mark.parametrize("name", sorted(TORCH))
def test_op_matches_torch(name, rng):
    op = get_op(name)
    for case in op.cases(rng):
        graph = op_graph(op, case)
        attrs = graph.node("y").attrs
        xs = [torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) if np.asarray(x).dtype.kind == "f"
              else torch.tensor(np.asarray(x)) for x in case.inputs]
        y = TORCH[name](*xs, **attrs)
        mask = mask_shape(op, case) is not None
        weights = rng.uniform(0.5, 1.5, size=tuple(y.shape))
        w = torch.from_numpy(weights)
        loss = torch.where(y, w, -w).sum() if mask else (y * w).sum()
        floats = [x for x in xs if x.requires_grad]
        # a mask: torch's loss does not even depend differentiably on the inputs (no grad_fn)
        grads = torch.autograd.grad(loss, floats, allow_unused=True) if loss.requires_grad else [None] * len(floats)
        engine = run_engine(op_graph(op, case, weights), VerifyOptions(dtype="float64"), "float64")
        assert engine.loss == pytest.approx(float(loss.detach()), rel=1e-12, abs=1e-12), f"{name} {case.attrs}"
        k = 0
        for i, x in enumerate(xs):
            if not x.requires_grad:
                continue
            want = np.zeros(tuple(x.shape)) if grads[k] is None else grads[k].numpy()
            k += 1
            got = engine.gradients.get(f"in{i}", np.zeros(tuple(x.shape)))  # a mask's inputs: no parameter
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=f"{name} {case.attrs} input {i}")
