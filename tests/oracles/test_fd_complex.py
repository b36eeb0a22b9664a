"""Complex-step differences (issue 43, oracles/fd_complex.py): exact directional derivatives from one complex
forward of the engine's frozen-branch batched forward, on the base point's branch at every kink and tie; the
plan names each parameter's method, and an op without a complex form falls back to central differences.
The analytic values are the engine's gradients of registry ops (each audited against SymPy and torch
elsewhere); every comparison is scaled by the magnitude of the terms summed (sum |g_i v_i|), so rounding
cannot flip it."""
import dataclasses

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import forward, prepare_feeds
from gradcheck_svc.engine.executor import backward
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles import fd_complex
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.ops import slices
from gradcheck_svc.ops.base import Case
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.compare import Tolerance, magnitude
from gradcheck_svc.verify.run import fd_plan

from op_cases import DIFFERENTIABLE, op_graph
from plants import element_bug, mlp, tanh_over_small_d, unregister

NO_SYM = SymbolicOptions(enabled=False)
EXACT = 1e-13  # of sum |g_i v_i|: a few ulps of one forward's rounding


def _engine_gradients(fd):
    tape = forward(fd.program, NUMPY, prepare_feeds(fd.program, NUMPY), grad=True)
    return backward(tape)


def _directional(fd, p):
    """(complex-step derivative along v, the engine's g . v, sum |g_i v_i|) for parameter p."""
    g = np.asarray(_engine_gradients(fd)[p], dtype=np.float64).reshape(-1)
    res = fd.gradient(p, mode="projection", directions=1)
    assert res.method == fd_complex.COMPLEX
    v = res.directions[0]
    return float(res.reference[0]), float(g @ v), float(np.abs(g) @ np.abs(v))


def _cases():
    out = []
    for op in DIFFERENTIABLE:
        if op.complex_step:
            n = len(op.cases(np.random.default_rng(1)))
            out += [pytest.param(op.name, i, id=f"{op.name}-{i}") for i in range(n)]
    return out


@pytest.mark.parametrize("name,i", _cases())
def test_complex_steps_equal_the_analytic_derivative_of_every_registry_op(name, i):
    case = REGISTRY[name].cases(np.random.default_rng(1))[i]
    fd = FiniteDifferences(op_graph(name, case, np.random.default_rng(2)))
    grads = _engine_gradients(fd)
    for p in fd.program.params:
        d, exact, size = _directional(fd, p)
        assert abs(d - exact) <= EXACT * size + 1e-300, (p, d, exact)
        # element by element: one-element copies travel as slices (ops/slices.py) through the ops' slice rules
        g = np.asarray(grads[p], dtype=np.float64).reshape(-1)
        every = fd.elements(p, np.arange(g.size))
        assert every.method == fd_complex.COMPLEX, fd.plan.fallback
        assert np.max(np.abs(every.reference - g)) <= 10 * EXACT * magnitude(g) + 1e-300, p


KINKS = {  # exact kinks and ties, and points a rounding away from them: the base point's branch
    "relu": ({}, np.array([0.0, -0.0, 1e-300, -1e-300, 5e-17, -5e-17, 0.7, -0.7])),
    "abs": ({}, np.array([0.0, 1e-300, -1e-300, 5e-17, -5e-17, 0.7, -0.7, 2.0])),
    "clip": ({"min": -0.5, "max": 0.5},
             np.array([-0.5, 0.5, -0.5 - 1e-16, 0.5 + 1e-16, 0.49999999999999994, 0.2, 3.0, -3.0])),
    "top_k": ({"k": 3, "axis": 0}, np.array([1.0, 1.0, 1.0, 0.5, 0.5, 2.0, 2.0, -1.0])),
    "max_pool": ({"kernel_shape": (2, 2), "strides": (2, 2)},
                 np.array([[[[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0 + 2e-16],
                             [3.0, -1.0, 0.0, 0.0], [3.0, 3.0, 0.0, 0.0]]]])),
}


@pytest.mark.parametrize("op", sorted(KINKS))
def test_at_kinks_and_exact_ties_complex_steps_take_the_base_point_s_branch(op):
    attrs, x = KINKS[op]
    fd = FiniteDifferences(op_graph(op, Case([x], attrs), np.random.default_rng(3)))
    g = np.asarray(_engine_gradients(fd)["in0"], dtype=np.float64).reshape(-1)
    every = fd.elements("in0", np.arange(x.size))
    assert every.method == fd_complex.COMPLEX
    # element by element: the engine's convention at the tie is the branch the base point took
    assert np.max(np.abs(every.reference - g)) <= EXACT * magnitude(g), (every.reference, g)
    d, exact, size = _directional(fd, "in0")
    assert abs(d - exact) <= EXACT * size


def _tanh_without_complex_form():
    op = dataclasses.replace(REGISTRY["tanh"], name="tanh_no_complex_test", complex_step=False)
    register(op)
    return op.name


def test_an_op_without_a_complex_form_keeps_central_differences_and_is_named():
    name = _tanh_without_complex_form()
    try:
        rng = np.random.default_rng(4)
        b = GraphBuilder("fallback")
        x, y = b.input("x", rng.standard_normal(6), True), b.input("y", rng.standard_normal(6), True)
        b.output(b.node("sum", b.node("mul", b.node(name, x), b.node("tanh", y)), name="L"))
        report = verify(load_graph(b.build()), VerifyOptions(symbolic=NO_SYM))
    finally:
        unregister(name)
    plan = report.to_dict()["fd_plan"]
    assert plan["method"] == {"x": "central", "y": "complex"}
    assert plan["method_fallback"] == {"x": name}
    assert report.verdict == "pass"
    assert f"1 by complex step, 1 by central differences (x: {name})" in report.to_text()


def _tolerances(g, dtype="float64"):
    tol = Tolerance.for_dtype(dtype)
    g = np.asarray(g, dtype=np.float64).reshape(-1)
    return tol.absolute(magnitude(g)) + tol.rtol * np.abs(g)


@pytest.mark.parametrize("mode", ["joint", "full"])
def test_a_large_loss_s_small_gradient_element_wrong_by_10x_its_tolerance_fails(mode):
    """|L| ~ 1e4, gradients ~1e-3: central differences' rounding (4 eps |L| / h ~ 1e-6) is 1e3 x the
    element's tolerance and such a bug was fd_undecidable; a complex step has no such term."""
    options = VerifyOptions(fd=FDOptions(mode=mode), symbolic=NO_SYM)
    graph = {"width": 16, "depth": 2, "offset": 1e4, "scale": 1e-3}
    clean = verify(mlp(**graph), options)
    assert clean.verdict == "pass" and abs(clean.loss) > 5e3
    g = next(p for p in clean.parameters if p.name == "W1").gradient.reshape(-1)
    i = 37
    op = element_bug(10 * _tolerances(g)[i], i)
    try:
        report = verify(mlp(bugs={"W1": op}, **graph), options)
    finally:
        unregister(op)
    assert report.verdict == "fail"
    row = next(p for p in report.parameters if p.name == "W1")
    assert row.status == "FAIL" and i not in row.fd.undecidable
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [("W1_bug", "rule_error")]
    assert report.to_dict()["fd_plan"]["method"]["W1"] == "complex"


@pytest.mark.parametrize("directions", [4, 16])
def test_a_pair_of_opposite_errors_on_neighbouring_elements_fails(directions):
    """Entries i and i + 1 of W0's gradient swapped (an off-by-one): with sign directions the two columns
    agreed in every direction 1 time in 2^k and the pair passed; Gaussian levels never agree. Each of 32 pairs
    screened (run.fd_plan on the engine's gradients with the pair planted: W0 flagged and narrowed to elements
    that fail their own differences), one FD evaluator for all; the first pair verified end to end."""
    options = VerifyOptions(fd=FDOptions(mode="joint", directions=directions, projection_threshold=100),
                            symbolic=NO_SYM)
    graph = mlp(width=16, depth=2)
    fd = FiniteDifferences(graph, options.fd)
    grads = {p: np.asarray(g, dtype=np.float64) for p, g in _engine_gradients(fd).items()}
    g, tol = grads["W0"].reshape(-1), Tolerance.for_dtype("float64")
    pairs = []
    for i in range(0, 64, 2):  # 32 pairs: under signs at k = 4, about 2 of them would pass
        e = 10 * max(_tolerances(g)[i], _tolerances(g)[i + 1])
        delta = np.zeros(g.shape)
        delta[i], delta[i + 1] = e, -e
        pairs.append(delta.reshape(16, 16))
    screened = [fd_plan(fd, {**grads, "W0": grads["W0"] + delta}, graph, tol).screen for delta in pairs]
    # narrowed down to the pair's elements, which fail their own differences
    assert sum("W0" in s.narrowed and not s.narrowed["W0"].check.passed for s in screened) == 32
    op = element_bug(pairs[0])
    try:
        report = verify(mlp(width=16, depth=2, bugs={"W0": op}), options)
    finally:
        unregister(op)
    assert report.verdict == "fail" and [f.node for f in report.findings if f.severity == "error"] == ["W0_bug"]


def test_the_joint_directions_are_the_graph_s_own():
    a, same, other = mlp(width=8, depth=2), mlp(width=8, depth=2), mlp(width=8, depth=2, seed=1)
    dirs = [FiniteDifferences(g).joint_directions(["W0", "b0"]) for g in (a, same, other)]
    assert np.array_equal(dirs[0].signs["W0"], dirs[1].signs["W0"])
    assert np.array_equal(dirs[0].signs["b0"], dirs[1].signs["b0"])
    assert not np.array_equal(dirs[0].signs["W0"], dirs[2].signs["W0"])
    # continuous levels, never 0: no two of W0's 64 columns agree in every one of 16 directions
    cols = dirs[0].signs["W0"].T
    assert np.all(cols != 0) and len({c.tobytes() for c in cols}) == len(cols)
    # the options' seed still moves them
    seeded = FiniteDifferences(a, FDOptions(seed=5)).joint_directions(["W0"])
    assert not np.array_equal(seeded.signs["W0"], dirs[0].signs["W0"])


def test_values_central_differences_could_not_decide_are_decided_on_the_first_pass():
    """tanh(x / d), |d| ~ 1e-3: every central difference missed and needed the ladder (past the cap: undecided)."""
    report = verify(tanh_over_small_d(300), VerifyOptions(symbolic=NO_SYM))
    row = report.parameters[0]
    assert report.verdict == "pass" and row.status == "ok"
    assert len(row.fd.refined) == 0 and len(row.fd.undecidable) == 0


def test_a_probed_value_carries_the_spread_of_its_forwards_as_its_error():
    """A value the first pass does not settle is probed: three forwards, and its error is what they spread."""
    fd = FiniteDifferences(mlp(width=8, depth=2, offset=1e4))
    first = fd.elements("W0", np.arange(8))
    probed = fd.refine("W0", first, np.arange(8))
    assert probed.method == ["complex"] * 8
    assert np.all(np.abs(probed.values - first.reference) <= probed.error)
    assert np.all(probed.error <= 1e-12 * np.max(np.abs(first.reference)))


@pytest.mark.parametrize("target", ["W0", "b1"])
def test_the_screen_s_power_statement_holds_for_a_planted_element_at_that_size(target):
    """JointScreen.power: per element the least error that fails some direction for sure (floor_j + 2 x the
    complex-step bound_j over weight x |s_ji|). An element off by 1.5x the larger of that and its tolerance
    (what its own check holds it to) fails and is localized."""
    from gradcheck_svc.verify.joint_check import joint_screen

    options = FDOptions(mode="joint", projection_threshold=100)
    delta = np.zeros((16, 16) if target.startswith("W") else 16)
    op = element_bug(delta)  # the graph (its content, so its directions) is fixed before delta is set
    try:
        graph = mlp(width=16, depth=2, bugs={target: op})
        fd = FiniteDifferences(graph, options)
        grads = {k: np.asarray(v) for k, v in _engine_gradients(fd).items()}
        screen = joint_screen(fd, grads, list(graph.parameters), Tolerance.for_dtype("float64"))
        assert screen.flagged == [] and not screen.narrowed and screen.unresolved == {}
        power, own = screen.power[target].astype(np.float64), _tolerances(grads[target])
        # with complex steps nothing of the rounding term is left: the screen sees every element's error
        # before its own check could (power below its tolerance), so the tolerance alone sets what is found
        assert np.all(power <= own)
        i = 5
        delta.reshape(-1)[i] = 1.5 * max(power[i], own[i])
        report = verify(graph, VerifyOptions(fd=options, symbolic=NO_SYM))
    finally:
        unregister(op)
    assert report.verdict == "fail"
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [(f"{target}_bug", "rule_error")]
    row = next(p for p in report.parameters if p.name == target)
    assert row.status == "FAIL" and np.ravel_multi_index(row.fd.comparison.worst_index, row.shape) == i


def test_pow_at_its_kink_or_a_negative_base_keeps_central_differences():
    """pow's complex form holds where a > 0 (its row's predicate): at a == 0 the kink analysis decides, and for
    a < 0 the real forward has no d/db for the complex log to supply."""
    for a, method in (([0.5, 2.0], "complex"), ([0.0, 2.0], "central"), ([-2.0, 2.0], "central")):
        b = GraphBuilder("pow")
        y = b.node("pow", b.input("a", np.array(a), True), b.input("b", np.array([2.0, 3.0]), True))
        b.output(b.node("sum", y, name="L"))
        fd = FiniteDifferences(load_graph(b.build()))
        assert fd.plan.methods == {"a": method, "b": method}
        assert fd.plan.fallback == ({} if method == "complex" else {"a": ["pow"], "b": ["pow"]})


def test_an_op_that_drops_the_imaginary_part_is_caught_and_falls_back():
    """A forward that writes complex values into a real buffer (NumPy's ComplexWarning) would drop the
    derivative silently: the guard makes it an error, the parameter falls back and the plan says why."""
    def forward(xp, x):
        out = np.empty(np.shape(x))
        out[...] = x  # complex -> real: the imaginary part is dropped
        return out
    op = dataclasses.replace(REGISTRY["neg"], name="copy_to_real_test", forward=forward,
                             vjp=lambda xp, g, s: (g,), sympy=None, formula_name=None, numpy=None, torch=None,
                             onnx=None)
    register(op)
    try:
        rng = np.random.default_rng(5)
        b = GraphBuilder("drops")
        y = b.node("tanh", b.node(op.name, b.input("x", rng.standard_normal(4), True)))
        b.output(b.node("sum", y, name="L"))
        report = verify(load_graph(b.build()), VerifyOptions(symbolic=NO_SYM))
    finally:
        unregister(op.name)
    plan = report.to_dict()["fd_plan"]
    assert report.verdict == "pass" and plan["method"] == {"x": "central"}
    assert plan["method_fallback"]["x"].startswith("complex forward failed: ")


def _multilinear_cases():
    return [pytest.param(op.name, i, id=f"{op.name}-{i}") for op in DIFFERENTIABLE if op.multilinear
            for i in range(len(op.cases(np.random.default_rng(1))))]


@pytest.mark.parametrize("name,i", _multilinear_cases())
def test_a_multilinear_op_s_complex_step_on_real_pairs_is_its_complex_forward(name, i):
    """matmul, conv, einsum: every input perturbed at once (as the joint screen does), the (real, imaginary)
    pair evaluation (executor.multilinear_step) has the base's output as its real part and the imaginary
    part of NumPy's own complex forward, to rounding of sum |terms|."""
    from gradcheck_svc.engine.executor import multilinear_step, run_step_batched
    case = REGISTRY[name].cases(np.random.default_rng(1))[i]
    fd = FiniteDifferences(op_graph(name, case, np.random.default_rng(2)))
    step = next(s for s in fd.program.steps if s.name == "y")
    rng, h = np.random.default_rng(3), 2.0 ** -30
    xs = [fd.base[n] + 1j * h * rng.standard_normal((2,) + np.shape(fd.base[n])) for n in step.inputs]
    pairs = multilinear_step(np, step, xs, [True] * len(xs), fd.base).dense(np)
    assert pairs.dtype == np.complex128
    plain = run_step_batched(np, step, xs, [True] * len(xs))
    size = run_step_batched(np, step, [np.abs(x.real) + 1j * np.abs(x.imag) for x in xs], [True] * len(xs))
    assert np.array_equal(pairs.real, np.broadcast_to(fd.base["y"], pairs.shape))
    assert np.max(np.abs(pairs.imag - plain.imag) / (size.imag + 1e-300)) <= 1e-14


@pytest.mark.parametrize("name", [op.name for op in DIFFERENTIABLE if op.frozen_linear])
def test_a_linear_frozen_piece_on_the_imaginary_part_alone_is_its_complex_piece(name):
    """relu, leaky_relu, abs, max_pool (OpDef.frozen_linear): a complex step that reaches them as a Pair (a
    multilinear op's output) passes as the piece applied to the imaginary part, equal to the complex piece
    bit for bit (a mask, a sign, a gather: no rounding)."""
    from gradcheck_svc.engine.executor import Pair, _batched_step
    for i, case in enumerate(REGISTRY[name].cases(np.random.default_rng(1))):
        fd = FiniteDifferences(op_graph(name, case, np.random.default_rng(2)))
        step = next(s for s in fd.program.steps if s.name == "y")
        (x,) = step.inputs
        imag = np.random.default_rng(3).standard_normal((2,) + np.shape(fd.base[x]))
        selection = fd.frozen[step.name]
        got = _batched_step(np, step, {x: Pair(fd.base[x], imag)}, fd.base, [True], selection)
        want = _batched_step(np, step, {x: Pair(fd.base[x], imag).dense(np)}, fd.base, [True], selection)
        assert isinstance(got, Pair) and not isinstance(want, Pair), i
        np.testing.assert_array_equal(got.dense(np), want, err_msg=f"case {i}")


@pytest.mark.parametrize("name", [op.name for op in DIFFERENTIABLE if op.linear])
def test_a_linear_op_passes_a_pair_as_its_complex_forward(name):
    """add, sub, concat, the shape ops, sum, mean (OpDef.linear): a complex step that reaches them as a Pair
    leaves as a Pair -- the forward of the imaginary parts, 0 for an input not perturbed -- equal to NumPy's own
    complex forward on the dense copies (real part the base's output, imaginary part to rounding), with every
    input perturbed and with only the first."""
    from gradcheck_svc.engine.executor import Pair, _batched_step
    for i, case in enumerate(REGISTRY[name].cases(np.random.default_rng(1))):
        fd = FiniteDifferences(op_graph(name, case, np.random.default_rng(2)))
        step = next(s for s in fd.program.steps if s.name == "y")
        rng = np.random.default_rng(3)
        for batched in ([True] * len(step.inputs), [True] + [False] * (len(step.inputs) - 1)):
            pairs = {n: Pair(fd.base[n], rng.standard_normal((2,) + np.shape(fd.base[n])))
                     for n, b in zip(step.inputs, batched) if b}
            got = _batched_step(np, step, pairs, fd.base, batched, None, True)
            want = _batched_step(np, step, {n: p.dense(np) for n, p in pairs.items()}, fd.base, batched, None, True)
            assert isinstance(got, Pair) and not isinstance(want, Pair), (i, batched)
            dense = got.dense(np)
            assert np.array_equal(dense.real, np.broadcast_to(fd.base["y"], dense.shape)), (i, batched)
            np.testing.assert_allclose(dense.imag, want.imag, rtol=1e-15, atol=1e-15 * np.abs(want.imag).max(),
                                       err_msg=f"case {i}, {batched}")


ELEMENTWISE = [op.name for op in DIFFERENTIABLE if op.slice_rule is slices.elementwise and op.complex_step
               and op.select is None and not op.held]


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_an_elementwise_op_passes_pairs_linearized_as_its_complex_forward(name):
    """tanh, exp, div, pow, where... (engine/executor.elementwise_step): a complex step that reaches an elementwise
    op as Pairs leaves as a Pair -- each perturbed input's imaginary part times the op's slope at the base
    (fd_complex.Slopes: its own forward at x + i eps) -- equal to NumPy's complex forward on the dense copies to
    rounding of the sum of the inputs' terms, with every input perturbed and with only the first."""
    from gradcheck_svc.engine.executor import Pair, _batched_step
    for i, case in enumerate(REGISTRY[name].cases(np.random.default_rng(1))):
        fd = FiniteDifferences(op_graph(name, case, np.random.default_rng(2)))
        step = next(s for s in fd.program.steps if s.name == "y")
        if "y" in fd_complex.lacks_complex(fd.program, fd.frozen, fd.base):
            continue  # (pow at a negative base: central differences, never a complex step)
        rng = np.random.default_rng(3)
        floats = [np.asarray(fd.base[n]).dtype.kind == "f" for n in step.inputs]
        first = [f and i == floats.index(True) for i, f in enumerate(floats)]
        for batched in (floats, first):
            # steps as the screen's: ~2^-64 of the value, so that every term in h^2 is far below rounding
            shape = {n: np.shape(fd.base[n]) for n in step.inputs}
            pairs = {n: Pair(fd.base[n], fd_complex.steps(fd.base[n]) * rng.standard_normal((2,) + shape[n]))
                     for n, b in zip(step.inputs, batched) if b}
            got = _batched_step(np, step, pairs, fd.base, batched, None, True, fd.slopes)
            assert isinstance(got, Pair), (i, batched)
            dense = {n: p.dense(np) for n, p in pairs.items()}
            want = _batched_step(np, step, dense, fd.base, batched, None, True).imag
            # each input's term alone, and its imaginary part itself (an op's rounding near a zero of its
            # derivative: gelu at -0.75 is 1e-13 of its slope there, in either form)
            size = sum(np.abs(_batched_step(np, step, {n: dense[n]}, fd.base, [m == n for m in step.inputs], None,
                                            True).imag) + _aligned(pairs[n].imag, np.ndim(fd.base["y"])) for n in pairs)
            assert np.array_equal(got.real, fd.base["y"]), (i, batched)
            assert np.all(np.abs(got.imag - want) <= 1e-13 * size), (i, batched)


def _aligned(im, rank):
    """|a batched imaginary part|, its rank aligned with the output's after the batch axis (as the ops broadcast)."""
    return np.abs(im.reshape(im.shape[:1] + (1,) * (rank + 1 - im.ndim) + im.shape[1:]))
