"""Engine behaviour: accumulation over consumers, inference mode, deep
graphs without recursion, release of saved tensors, batched FD agreement."""

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.parameter_result import Screen

from conftest import EXAMPLES


def run(graph, dtype=np.float64, grad=True):
    program = Program(graph, dtype)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY), grad=grad)
    return tape, (backward(tape) if grad else None)


def test_multi_consumer_gradients_are_summed():
    # L = sum(u*u + sin(u) + u/2), u = w*x: dL/du = 2u + cos(u) + 1/2
    graph = load_graph(EXAMPLES / "shared_value.json")
    w, x = graph.inputs["w"].value, graph.inputs["x"].value
    u = w * x
    _, grads = run(graph)
    du = 2 * u + np.cos(u) + 0.5
    np.testing.assert_allclose(grads["w"], du * x, rtol=1e-14)
    np.testing.assert_allclose(grads["x"], du * w, rtol=1e-14)


def test_inference_mode_saves_nothing_and_matches_loss():
    graph = load_graph(EXAMPLES / "mlp_cross_entropy.json")
    train, _ = run(graph)
    infer, _ = run(graph, grad=False)
    assert infer.store is None
    assert train.store.saved.peak > 0
    assert float(infer.loss) == float(train.loss)
    # inference keeps only live values, so its peak is below the training peak
    assert infer.live.peak < train.live.peak


def test_saved_tensors_are_released_during_backward():
    graph = load_graph(EXAMPLES / "mlp_cross_entropy.json")
    tape, _ = run(graph)
    assert len(tape.store) == 0
    assert tape.store.saved.current == 0


def test_peak_saved_bytes_counted_once_per_buffer():
    # y = u*u with u = -w: mul saves (u, u), the same buffer twice -> counted once;
    # neg saves nothing, and the parameter w itself is not an activation
    b = GraphBuilder()
    w = b.input("w", np.ones(1000), requires_grad=True)
    u = b.node("neg", w, name="u")
    b.output(b.node("sum", b.node("mul", u, u, name="y")))
    tape, grads = run(load_graph(b.build()))
    assert tape.store.saved.peak == 8000
    np.testing.assert_array_equal(grads["w"], 2 * np.ones(1000))


def chain(n):
    """L = (neg applied n times to w)^2 with n even: dL/dw = 2w."""
    b = GraphBuilder("chain")
    h = b.input("w", 1.5, requires_grad=True)
    for i in range(n):
        h = b.node("neg", h, name=f"n{i}")
    b.output(b.node("square", h, name="L"))
    return b.build()


@pytest.mark.slow  # ~4 s: a 100k-node graph decoded, a 20k-node one verified
def test_deep_chains_load_and_run_without_recursion():
    """A 100,000-node chain loads (sorted topologically and validated, as README's graph format promises), and a
    20,000-node one is verified: 20 times Python's recursion limit (1,000; nothing here raises it), so any recursive
    walk in the engine, finite differences or the memory profile's recomputation fails here as it would at any
    depth past the limit (verifying the 100k chain cost 13 s and proved no more)."""
    import sys

    assert sys.getrecursionlimit() <= 1000
    assert len(load_graph(chain(100_000)).nodes) == 100_001
    graph = load_graph(chain(20_000))
    assert len(graph.nodes) == 20_001
    report = verify(graph)
    assert report.verdict == "pass"
    assert report.parameters[0].gradient.tolist() == 3.0
    assert report.loss == 2.25


def test_graph_nodes_in_any_order_are_sorted():
    msg = chain(50)
    reversed_nodes = list(msg.nodes)[::-1]
    del msg.nodes[:]
    msg.nodes.extend(reversed_nodes)
    _, grads = run(load_graph(msg))
    assert grads["w"] == 3.0


def test_unused_parameter_gets_zero_gradient():
    b = GraphBuilder()
    w = b.input("w", 2.0, requires_grad=True)
    b.input("unused", np.ones(3), requires_grad=True)
    b.output(b.node("square", w))
    report = verify(load_graph(b.build()))
    assert report.verdict == "pass"
    assert report.parameters[1].gradient.tolist() == [0.0, 0.0, 0.0]


def test_full_and_projection_fd_agree_with_exact_gradient():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    w = b.input("w", rng.standard_normal((6, 5)), requires_grad=True)
    x = b.input("x", rng.standard_normal((5,)))
    b.output(b.node("sum", b.node("tanh", b.node("matmul", w, x))))
    graph = load_graph(b.build())
    exact = np.outer(1 - np.tanh(graph.inputs["w"].value @ graph.inputs["x"].value) ** 2, graph.inputs["x"].value)
    full = FiniteDifferences(graph, FDOptions(mode="full")).gradient("w")
    np.testing.assert_allclose(full.reference, exact, atol=1e-9)
    assert (full.method, full.evaluations) == ("complex", 30)  # a complex step: one forward per element
    proj = FiniteDifferences(graph, FDOptions(mode="projection", directions=4)).gradient("w")
    np.testing.assert_allclose(proj.reference, proj.directions @ exact.reshape(-1), atol=1e-9)
    assert (proj.method, proj.evaluations) == ("complex", 4)  # one complex forward per direction


def test_fd_chunks_give_the_same_answer():
    """Up to the rounding noise the oracle states: BLAS may sum a product of a different width
    (a chunk of one row is a GEMV) in another order, ~eps |L| / h in a central difference."""
    graph = load_graph(EXAMPLES / "mlp_cross_entropy.json")
    big = FiniteDifferences(graph, FDOptions(mode="full")).gradient("W1")
    tiny = FiniteDifferences(graph, FDOptions(mode="full", chunk_bytes=1)).gradient("W1")
    assert np.all(np.abs(big.reference - tiny.reference) <= big.noise)
    assert np.all(big.noise < 1e-8)  # and that noise is small: the answers agree to 1e-8


def test_auto_mode_screens_large_parameters_jointly():
    """Above the size threshold, auto's check is the joint screen (its per-element guarantee), not a few
    random projections of the parameter."""
    b = GraphBuilder()
    w = b.input("w", np.linspace(-1, 1, 300), requires_grad=True)
    b.output(b.node("sum", b.node("sin", w)))
    report = verify(load_graph(b.build()), VerifyOptions(fd=FDOptions(projection_threshold=100)))
    fd = report.parameters[0].fd
    assert fd.mode == fd.checked_by == "joint" and fd.screen is Screen.CLEARED
    assert report.verdict == "pass"


def test_a_wrong_gradient_beyond_tolerance_fails():
    """The comparison is not vacuous: perturb the engine gradient by 1e-4 relative."""
    from gradcheck_svc.verify.compare import Tolerance, compare

    ref = np.array([1.0, -2.0, 3.0])
    assert compare(ref * (1 + 1e-9), ref, Tolerance.for_dtype("float64")).passed
    bad = compare(ref * np.array([1, 1 + 1e-4, 1]), ref, Tolerance.for_dtype("float64"))
    assert not bad.passed and bad.worst_index == (1,)
    assert not compare(np.array([np.nan, -2.0, 3.0]), ref, Tolerance.for_dtype("float32")).passed


def test_cuda_device_without_gpu_is_a_clear_error():
    from gradcheck_svc.backend import cuda_available
    from gradcheck_svc.errors import BackendUnavailable

    if cuda_available():
        pytest.skip("a GPU is present; the error path cannot be exercised")
    with pytest.raises(BackendUnavailable) as exc:
        verify(load_graph(EXAMPLES / "seed.json"), VerifyOptions(device="cuda"))
    assert "device 'cuda' is not available" in exc.value.message


@pytest.mark.parametrize("options, message", [
    (VerifyOptions(fd=FDOptions(mode="sideways")), "fd_mode: unknown fd_mode 'sideways'"),
    (VerifyOptions(fd=FDOptions(directions=0)), "directions: 0: needs at least 1 direction"),
    (VerifyOptions(atol=float("inf")), "atol: inf is not a finite number >= 0"),
    (VerifyOptions(symbolic=SymbolicOptions(max_elements=-1)), "symbolic_budget: symbolic budget must be 0 or more"),
])
def test_meaningless_verify_options_are_option_errors(options, message):
    from gradcheck_svc.errors import OptionError

    with pytest.raises(OptionError) as info:
        verify(load_graph(EXAMPLES / "seed.json"), options)
    assert info.value.message.startswith(message)
