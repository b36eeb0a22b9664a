"""The process peak of a whole verification against the engine's own training peak for the same graph
(issue 32 item 3: the goal is at most 2x). Measured with tracemalloc, which sees NumPy's data buffers
(NumPy reports them to it) and Python's objects, not the BLAS's own workspace: the same count on any
x86-64 machine and BLAS, unlike ru_maxrss. The training peak is the engine's accounting (engine/memory.py,
verify/memory_profile.py: the arrays a gradient run holds, op temporaries such as im2col not counted).

Reached: 2.25x with central differences, 2.37x with complex steps, on the mid-size CNN below (it was 7.6x: the kink notes evaluated four whole copies of a
ReLU's and a max-pool's output and the max-pool's rule at full size, joint chunks of 32 MiB held every
copy's values to the end). What keeps it above 2x: the finite differences keep the base forward's values
throughout (~1x: localization and the notes read them) while one joint copy runs, whose conv im2col
temporary alone is ~0.7x. Complex steps: a conv's or matmul's output is carried as its imaginary part alone
(executor.Pair, its real part the base's value), as are relu's and max-pool's frozen pieces of it; max-pool's
piece gathers the selected elements (no copy of every window) and its selection is one byte per window."""
import tracemalloc

import numpy as np
import pytest

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.fd_plan import FDOptions
from gradcheck_svc.verify import verify
from gradcheck_svc.verify.options import VerifyOptions
from plants import cnn as plants_cnn

REACHED = {False: 2.4,  # central differences: 2.25x measured (the goal: 2)
           True: 2.5}  # complex steps (the default): 2.37x measured, issue 43's goal 2.5x (it was 3.50x: complex
#                       copies of every value; now multilinear ops and linear frozen pieces pass imaginary parts)


def cnn(c1: int = 32, c2: int = 64, batch: int = 4, size: int = 48):
    """plants.cnn as this test measures it (the graph named cnn_memory)."""
    return plants_cnn(c1, c2, batch, size, name="cnn_memory")


@pytest.mark.parametrize("complex_step", [False, True], ids=["central", "complex"])
def test_a_verifications_peak_stays_near_twice_the_engines_training_peak(complex_step):
    options = VerifyOptions(fd=FDOptions(method="complex" if complex_step else "central"))
    verify(cnn(4, 4, 1, 8), options)  # first-use allocations (imports, caches) out of the way
    graph = cnn()
    tracemalloc.start()
    try:
        report = verify(graph, options)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    training = report.memory["training_peak_bytes"]
    assert report.verdict == "pass"
    # the paths whose memory this bounds ran: the joint screen and both kink notes
    assert set(report.fd_plan.modes.values()) == {"joint"}
    notes = {f.node for f in report.findings if f.cause == "nondifferentiable_point"}
    assert {"relu_2", "max_pool_3"} <= notes, notes
    assert training > 6 * 2**20  # arrays dominate: Python's own objects are a small part of the peak
    assert peak <= REACHED[complex_step] * training, (peak / 2**20, training / 2**20, peak / training)


def _kink_graph():
    """relu, max_pool, a max reduction and abs, on values with exact kinks (zeros, ties)."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("kinks")
    x = rng.standard_normal((2, 3, 6, 6))
    x[0, 0, 0, :3] = 0.0  # relu and abs at their kink; ReLU zeros tie in a max-pool window
    h = b.input("x", x, requires_grad=True)
    r = b.node("relu", h)
    p = b.node("max_pool", r, kernel_shape=[2, 2], strides=[2, 2])
    m = b.node("max", b.node("abs", h), axis=3, keepdims=False)
    b.output(b.node("add", b.node("sum", p), b.node("sum", m), name="L"))
    return load_graph(b.build())


def test_one_sided_differences_on_the_changed_slice_equal_the_dense_ones_bit_for_bit():
    from gradcheck_svc.oracles.fd_formulas import element_steps
    from gradcheck_svc.oracles.fd_local import _one_sided_sliced, local_one_sided
    from gradcheck_svc.oracles.finite_diff import FiniteDifferences

    fd = FiniteDifferences(_kink_graph())
    checked = set()
    for step in fd.program.steps:
        if not step.op.kinks:
            continue
        xs = [fd.base[n] for n in step.inputs]
        out = fd.program.shapes[step.name]
        x = np.asarray(xs[0], dtype=np.float64)
        for a in (np.eye(1, int(np.prod(out)), 5).reshape(out), np.ones(out)):  # one-hot, and every element
            for j in (0, 1, 2, x.size - 1):
                dense = np.zeros((1, x.size))
                dense[0, j] = 1.0
                h = element_steps(x.reshape(-1)[j:j + 1])
                want = local_one_sided(step, xs, 0, a, dense, h)
                got = local_one_sided(step, xs, 0, a, np.array([j]), h, fd.base[step.name])
                np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want), err_msg=f"{step.name} {j}")
                # ... and it was the slice that was evaluated (not the dense path, as a fallback)
                assert _one_sided_sliced(step, xs, 0, a, np.array([j]), h, fd.base[step.name]) is not None
        checked.add(step.op.name)
    assert checked == {"relu", "max_pool", "abs", "max"}


def test_a_pools_rule_for_its_note_on_one_slice_equals_the_whole_rule():
    from gradcheck_svc.oracles.finite_diff import FiniteDifferences
    from gradcheck_svc.verify.diagnosis.kinks import _input_element, _rule_at
    from gradcheck_svc.verify.diagnosis.rules import rule_contribution

    fd = FiniteDifferences(_kink_graph())
    (step,) = [s for s in fd.program.steps if s.op.name == "max_pool"]
    xs, y = [fd.base[n] for n in step.inputs], fd.base[step.name]
    out, shape = fd.program.shapes[step.name], fd.program.shapes[step.inputs[0]]
    for flat in range(0, int(np.prod(out)), 7):
        at = tuple(int(i) for i in np.unravel_index(flat, out))
        a = np.zeros(out)
        a[at] = 1.0
        whole = rule_contribution(step, xs, y, a, 0, shape).reshape(-1)
        j = _input_element(shape, out, at, whole)
        assert _rule_at(step, xs, y, a, 0, shape, out, at) == (j, whole[j])
