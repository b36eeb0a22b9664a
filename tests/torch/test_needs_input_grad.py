"""The engine tells a vjp which inputs need a gradient (PyTorch's ctx.needs_input_grad): matmul
skips the GEMM of a data operand; a vjp written without the keyword still works unchanged."""
import dataclasses

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.ops.registry import register


def two_layer(matmul="matmul"):
    rng = np.random.default_rng(0)
    b = GraphBuilder("two_layer")
    x = b.input("x", rng.standard_normal((4, 3)))  # data: no gradient wanted
    w1 = b.input("W1", rng.standard_normal((3, 5)), requires_grad=True)
    w2 = b.input("W2", rng.standard_normal((5, 2)), requires_grad=True)
    h = b.node("tanh", b.node(matmul, x, w1, name="mm1"))
    b.output(b.node("sum", b.node(matmul, h, w2, name="mm2"), name="L"))
    return load_graph(b.build())


def expected(graph):
    x, w1, w2 = (graph.inputs[n].value for n in ("x", "W1", "W2"))
    h = np.tanh(x @ w1)
    g_h = np.ones((4, 2)) @ w2.T
    return {"W1": x.T @ (g_h * (1 - h ** 2)), "W2": h.T @ np.ones((4, 2))}


def grads_and_calls(graph):
    """Gradients, and for each matmul step the mask its vjp got and what it returned."""
    program = Program(graph, np.float64)
    calls = {}
    for step in program.steps:
        if step.op.name.startswith("matmul"):
            vjp = step.op.vjp

            def spy(*args, _name=step.name, _vjp=vjp, **kw):
                out = _vjp(*args, **kw)
                calls[_name] = (kw.get("needs_input_grad"), out)
                return out
            object.__setattr__(step, "op", dataclasses.replace(step.op, vjp=spy))
    grads = backward(forward(program, NUMPY, prepare_feeds(program, NUMPY)))
    return grads, calls


def test_matmul_is_told_its_data_operand_needs_no_gradient_and_skips_it():
    graph = two_layer()
    program = Program(graph, np.float64)
    assert program.by_name["mm1"].vjp_attrs["needs_input_grad"] == (False, True)
    assert program.by_name["mm2"].vjp_attrs["needs_input_grad"] == (True, True)
    grads, calls = grads_and_calls(graph)
    ga, gb = calls["mm1"][1]
    assert ga is None and gb is not None  # the x-gradient GEMM was never computed
    for name, want in expected(graph).items():
        np.testing.assert_allclose(grads[name], want, rtol=1e-12)


@pytest.fixture
def matmul_without_mask():
    """matmul with a vjp in the style that predates the mask: (xp, g, saved, **attrs), both gradients."""
    mm = REGISTRY["matmul"]
    old_style = dataclasses.replace(mm, name="matmul_old_style",
                                    vjp=lambda xp, g, saved, **attrs: mm.vjp(xp, g, saved, **attrs))
    register(old_style)
    yield old_style.name
    del REGISTRY[old_style.name]


def test_a_vjp_that_does_not_take_the_mask_gets_none_and_its_extra_gradient_is_ignored(matmul_without_mask):
    graph = two_layer(matmul_without_mask)
    program = Program(graph, np.float64)
    assert not REGISTRY[matmul_without_mask].takes_needs_input_grad
    assert "needs_input_grad" not in program.by_name["mm1"].vjp_attrs
    grads, calls = grads_and_calls(graph)
    mask, (ga, gb) = calls["mm1"]
    assert mask is None and ga is not None  # computed the old way, then dropped by the engine
    for name, want in expected(graph).items():
        np.testing.assert_allclose(grads[name], want, rtol=1e-12)


def test_matmul_saves_only_what_a_needed_gradient_reads():
    """x is data, so mm1's backward needs x (for W1's gradient) but never W1: like torch.matmul's
    backward, the engine does not keep W1 for it (an empty array of its own holds its place)."""
    graph = two_layer()
    program = Program(graph, np.float64)
    assert program.by_name["mm1"].save_attrs["needs_input_grad"] == (False, True)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY), integrity="check")
    x_saved, w1_saved = tape.store._tensors["mm1"]
    assert x_saved.shape == (4, 3) and w1_saved.size == 0 and w1_saved.base is None
    h_saved, w2_saved = tape.store._tensors["mm2"]  # both operands need gradients: both kept
    assert h_saved.shape == (4, 5) and w2_saved.shape == (5, 2)
    grads = backward(tape)
    assert not tape.store.events  # nothing read was changed
    for name, want in expected(graph).items():
        np.testing.assert_allclose(grads[name], want, rtol=1e-12)
