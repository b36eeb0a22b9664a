"""One-element finite differences carried as one changed slice per copy (ops/slices.py): every
slice rule gives what the dense batched forward gives, on every op's registry cases and every
axis; forward_batched gives the same losses for a stack as slices and dense on whole graphs; full-Jacobian FD still
matches torch autograd."""
import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, forward, forward_batched, prepare_feeds
from gradcheck_svc.engine.executor import run_step_batched
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import all_ops
from gradcheck_svc.ops.slices import Sliced, one_hot
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.verify.audit import op_graph

SLICED_OPS = [op for op in all_ops() if op.slice_rule is not None]


def _dense(x):
    return x.dense(np) if isinstance(x, Sliced) else x


def test_the_rules_cover_matmul_and_the_elementwise_ops():
    names = {op.name for op in SLICED_OPS}
    assert {"matmul", "conv", "max_pool", "avg_pool", "sum", "mean", "concat", "tanh", "add", "where", "expr"} <= names
    assert not names & {"cross_entropy", "softmax", "transpose", "reshape"}  # these densify


@pytest.mark.parametrize("op", SLICED_OPS, ids=lambda op: op.name)
def test_every_slice_rule_equals_the_dense_batched_forward(op):
    rng = np.random.default_rng(0)
    accepted = 0
    for case in op.cases(rng):
        program = Program(op_graph(op, case), np.float64)
        base = forward(program, NUMPY, prepare_feeds(program, NUMPY), grad=False, keep_values=True).values
        step = program.by_name["y"]
        for k, name in enumerate(step.inputs):
            x = np.asarray(base[name])
            if x.dtype.kind not in "fb" or x.ndim == 0 or x.size == 0:  # (an empty value has no element to change)
                continue
            for axis in range(-x.ndim, 0):
                index = rng.integers(0, x.size, size=5)
                # a float changed a little; a bool mask (computed from changed floats upstream) flipped
                new = ~x.reshape(-1)[index] if x.dtype.kind == "b" else \
                    x.reshape(-1)[index] + rng.uniform(0.1, 0.5, size=5)
                stack = one_hot(np, x, axis, index, new)
                dense_stack = stack.dense(np)
                expect_stack = np.broadcast_to(x, (5,) + x.shape).copy()  # copy j: x with element index[j] = new[j]
                expect_stack.reshape(5, -1)[np.arange(5), index] = new
                np.testing.assert_array_equal(dense_stack, expect_stack)
                xs = [stack if j == k else base[n] for j, n in enumerate(step.inputs)]
                with np.errstate(all="ignore"):
                    got = op.slice_rule(np, op, xs, base["y"], step.attrs)
                    want = run_step_batched(np, step, [dense_stack if j == k else base[n]
                                                       for j, n in enumerate(step.inputs)],
                                            [j == k for j in range(len(step.inputs))])
                if got is None:
                    continue  # declined: the driver densifies
                accepted += 1
                np.testing.assert_allclose(_dense(got), np.broadcast_to(want, _dense(got).shape), rtol=1e-12,
                                           atol=1e-12 * (1 + np.abs(want).max()), equal_nan=True,
                                           err_msg=f"{op.name} input {k} axis {axis} case {case.attrs}")
    assert accepted > 0, f"{op.name}: the rule declined every case"


def _torch_cnn():
    import torch
    F = torch.nn.functional
    return {"conv": lambda x, w, b=None: F.conv2d(x, w, b, padding=1 if b is not None else 0),
            "relu": torch.relu, "max_pool": lambda x: F.max_pool2d(x, 2, 2), "avg_pool": lambda x: x,
            "concat": lambda *xs: torch.cat(xs, 1), "mean": lambda x: x.mean(dim=(2, 3))}


try:
    TORCH_CNN = _torch_cnn()
except ImportError:
    TORCH_CNN = {}


def _graphs():
    rng = np.random.default_rng(1)
    b = GraphBuilder("mlp_bias")  # matmul columns, a broadcast bias, relu, a contracted change, a loss
    h = b.input("x", rng.standard_normal((6, 4)))
    for i, (d, e) in enumerate([(4, 5), (5, 3)]):
        h = b.node("add", b.node("matmul", h, b.input(f"W{i}", rng.standard_normal((d, e)), True)),
                   b.input(f"b{i}", rng.standard_normal(e), True))
        h = b.node("tanh", h) if i == 0 else h
    b.output(b.node("cross_entropy", h, b.input("labels", rng.integers(0, 3, 6), dtype="int64"), name="L"))
    yield b.build()

    b = GraphBuilder("shared")  # one parameter read by matmul (both sides), mul and sum
    w = b.input("w", rng.standard_normal((3, 3)), True)
    a = b.input("a", rng.standard_normal((2, 3)), True)
    left = b.node("matmul", a, w)
    right = b.node("matmul", w, b.node("mul", w, w))
    b.output(b.node("add", b.node("sum", b.node("sin", left)), b.node("sum", right), name="L"))
    yield b.build()

    b = GraphBuilder("rank3")  # a 3-D parameter through a broadcast where and a reduction
    t = b.input("t", rng.standard_normal((2, 3, 4)), True)
    c = b.input("c", rng.standard_normal((3, 1)) > 0, dtype="bool")
    v = b.input("v", rng.standard_normal(4), True)
    b.output(b.node("sum", b.node("where", c, b.node("exp", t), b.node("mul", t, v)), name="L"))
    yield b.build()

    b = GraphBuilder("cnn")  # a filter's channel through relu and pooling, then a contracted channel
    # (the torch replay below reads these attributes from TORCH_CNN: keep the two in step)
    h = b.node("conv", b.input("img", rng.standard_normal((2, 3, 7, 7))), b.input("K1", rng.standard_normal((4, 3, 3, 3)), True),
               b.input("c1", rng.standard_normal(4), True), pads=[1, 1, 1, 1])
    h = b.node("max_pool", b.node("relu", h), kernel_shape=[2, 2], strides=[2, 2])
    h = b.node("conv", h, b.input("K2", rng.standard_normal((2, 4, 2, 2)), True), strides=[1, 1])
    h = b.node("concat", h, b.node("avg_pool", h, kernel_shape=[1, 1]), axis=1)
    b.output(b.node("sum", b.node("mean", b.node("tanh", h), axis=[2, 3]), name="L"))
    yield b.build()


@pytest.mark.parametrize("msg", list(_graphs()), ids=lambda m: m.name)
def test_a_sliced_stack_gives_the_dense_losses(msg):
    graph = load_graph(msg)
    fd = FiniteDifferences(graph, FDOptions(mode="full"))
    rng = np.random.default_rng(2)
    for p in graph.parameters:
        x = np.asarray(fd.base[p])
        index = rng.integers(0, x.size, size=7)
        # complex new values too: complex-step copies travel as slices through every slice rule
        new = x.reshape(-1)[index] + rng.standard_normal(7) + 1j * rng.standard_normal(7)
        x = x.astype(np.complex128)
        dense = np.broadcast_to(x, (7,) + x.shape).copy()
        dense.reshape(7, -1)[np.arange(7), index] = new
        want = forward_batched(fd.program, NUMPY, fd.base, {p: dense})
        for axis in range(-x.ndim, 0):
            got = forward_batched(fd.program, NUMPY, fd.base, {p: one_hot(np, x, axis, index, new)})
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13, err_msg=f"{p} axis {axis}")


@pytest.mark.parametrize("complex_step", [True, False], ids=["complex", "central"])
@pytest.mark.parametrize("msg", list(_graphs()), ids=lambda m: m.name)
def test_full_fd_matches_torch_autograd(msg, complex_step):
    torch = pytest.importorskip("torch")
    graph = load_graph(msg)
    fd = FiniteDifferences(graph, FDOptions(mode="full", method="complex" if complex_step else "central"))
    values = {n: torch.tensor(np.asarray(gi.value), requires_grad=n in graph.parameters)
              for n, gi in graph.inputs.items()}
    ops = {"matmul": torch.matmul, "add": torch.add, "mul": torch.mul, "tanh": torch.tanh, "sin": torch.sin,
           "exp": torch.exp, "sum": torch.sum, "where": torch.where,
           "cross_entropy": torch.nn.functional.cross_entropy, **TORCH_CNN}
    for node in graph.nodes:
        values[node.name] = ops[node.op.name](*(values[n] for n in node.inputs))
    grads = torch.autograd.grad(values[graph.output], [values[p] for p in graph.parameters])
    for p, g in zip(graph.parameters, grads):
        result = fd.gradient(p)
        # a complex step is one forward per element, central differences two
        assert result.mode == "full" and result.evaluations == (1 if complex_step else 2) * g.numel()
        assert result.method == ("complex" if complex_step else "central")
        np.testing.assert_allclose(result.reference, g.numpy(), rtol=1e-7, atol=1e-9, err_msg=p)


def test_a_scalar_parameter_falls_back_to_a_dense_stack():
    b = GraphBuilder("scalar")
    s = b.input("s", np.array(0.7), True)
    b.output(b.node("sum", b.node("mul", b.node("sin", s), b.input("x", np.arange(3.0))), name="L"))
    fd = FiniteDifferences(load_graph(b.build()), FDOptions(mode="full"))
    assert fd.slice_axis("s") is None
    np.testing.assert_allclose(fd.gradient("s").reference, np.cos(0.7) * 3.0, rtol=1e-9)


def test_matmul_operands_change_along_the_axis_that_stays_one_slice():
    graph = load_graph(next(_graphs()))
    fd = FiniteDifferences(graph, FDOptions(mode="full"))
    assert fd.slice_axis("W0") == -1  # b of x @ W0: a column of W0 is a column of the product
    assert fd.slice_axis("b0") == -1


def _elementwise_sum(n):
    rng = np.random.default_rng(5)
    b = GraphBuilder("elementwise_sum")
    w, v = b.input("w", rng.standard_normal(n), True), b.input("v", rng.standard_normal(n), True)
    b.output(b.node("sum", b.node("exp", b.node("mul", b.node("tanh", w), b.node("sin", v))), name="L"))
    return load_graph(b.build())


def test_an_elementwise_graph_ending_in_a_sum_costs_one_slice_per_copy():
    """Summing over the changed axis adds the change to the unperturbed sum: every copy holds a few
    scalars, so chunks grow past the dense bound's estimate and auto mode, measuring that, checks
    every element of 90,000-element parameters in full instead of projecting them."""
    graph = _elementwise_sum(90_000)
    fd = FiniteDifferences(graph)
    stats = {}
    x = np.asarray(fd.base["w"])
    forward_batched(fd.program, NUMPY, fd.base, {"w": one_hot(np, x, -1, np.arange(4), x[:4] + 1.0)}, stats)
    assert stats["row_bytes"] <= 8 * 10  # a handful of float64 scalars per copy, not 4 x 90,000
    assert fd.row_bytes("w") >= 8 * 4 * 90_000  # the dense bound
    assert fd.mode_for("w") == fd.mode_for("v") == "full"
    w, v = (graph.inputs[n].value for n in ("w", "v"))
    result = fd.gradient("w")
    expected = (1 - np.tanh(w) ** 2) * np.sin(v) * np.exp(np.tanh(w) * np.sin(v))
    assert np.all(np.abs(result.reference - expected) <= result.noise + 1e-12)


def test_auto_screens_jointly_what_even_slices_cannot_afford():
    graph = _elementwise_sum(2_000)
    fd = FiniteDifferences(graph, FDOptions(full_cost_budget=100.0))  # a budget no full check fits
    assert fd.mode_for("w") == fd.mode_for("v") == "joint"
    # a parameter the screen flags is checked on its own, projected: its full check is over the budget too
    assert fd.own_mode("w") == fd.own_mode("v") == "projection"
