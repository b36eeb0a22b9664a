"""Localization: the first node where the engine's gradient goes wrong, and its cause.

A planted op with a wrong derivative rule (registered for the test only, removed after) sits somewhere
in a larger graph; the diagnosis must name exactly that node as rule_error."""
import dataclasses

import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import all_ops, get_op
from gradcheck_svc.ops.base import Case
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.audit import index_range

from conftest import EXAMPLES


@pytest.fixture
def buggy_square():
    """square with a wrong rule, d/dx = 3x (a typo'd derivative), registered for one test."""
    op = dataclasses.replace(get_op("square"), name="buggy_square",
                             vjp=lambda xp, g, saved, **_: (g * 3.0 * saved[0],))
    register(op)
    yield op.name
    del REGISTRY[op.name]


def chain(n: int, bad_at: int | None, width: int = 3, batch: int = 2, bad_op: str = "buggy_square"):
    """n nodes: x @ W, then (sin, mul by a, tanh) repeated, the bad op at position bad_at."""
    rng = np.random.default_rng(7)
    b = GraphBuilder(f"chain{n}")
    h = b.node("matmul", b.input("x", rng.uniform(-1, 1, (batch, width))),
               b.input("W", rng.uniform(-1, 1, (width, width)), requires_grad=True), name="n0")
    a = b.input("a", rng.uniform(0.5, 1.5, (width,)), requires_grad=True)
    cycle = ["sin", "mul", "tanh"]
    for i in range(1, n - 1):
        if i == bad_at:
            h = b.node(bad_op, h, name=f"n{i}")
        elif cycle[i % 3] == "mul":
            h = b.node("mul", h, a, name=f"n{i}")
        else:
            h = b.node(cycle[i % 3], h, name=f"n{i}")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


def test_planted_rule_error_is_named_in_a_50_node_graph(buggy_square):
    report = verify(chain(50, bad_at=31))
    assert report.verdict == "fail"
    [f] = report.findings
    assert (f.node, f.op, f.cause, f.severity) == ("n31", "buggy_square", "rule_error", "error")
    assert sorted(f.parameters) == ["W", "a"]
    # the worst element: the rule gives 3x where the derivative is 2x, times the incoming adjoint
    assert f.worst.engine == pytest.approx(1.5 * f.worst.reference, rel=1e-6)


def test_planted_rule_error_in_large_values_uses_projections(buggy_square):
    report = verify(chain(12, bad_at=7, width=40, batch=16))
    [f] = report.findings
    assert (f.node, f.cause) == ("n7", "rule_error")
    assert f.worst.index[0] == "direction"


def test_no_localize_gives_the_verdict_only(buggy_square):
    report = verify(chain(20, bad_at=5), VerifyOptions(localize=False))
    # no node is localized; a FAIL still names where: the failing parameters
    assert report.verdict == "fail" and report.findings
    assert {f.cause for f in report.findings} == {"gradient_mismatch"}
    assert all(f.parameters == [f.node] and "localization is off" in f.detail for f in report.findings)
    assert {f.node for f in report.findings} == {p.name for p in report.parameters if p.status == "FAIL"}


def test_two_independent_faults_are_both_named(buggy_square):
    b = GraphBuilder("two")
    p = b.input("p", [0.5, -1.0], requires_grad=True)
    q = b.input("q", [2.0, 0.25], requires_grad=True)
    left = b.node("buggy_square", b.node("sin", p, name="sp"), name="bad_left")
    right = b.node("buggy_square", b.node("cos", q, name="cq"), name="bad_right")
    b.output(b.node("sum", b.node("add", b.node("exp", left, name="el"), right, name="s"), name="L"))
    report = verify(load_graph(b.build()))
    named = sorted((f.node, tuple(f.parameters), f.cause) for f in report.findings)
    assert named == [("bad_left", ("p",), "rule_error"), ("bad_right", ("q",), "rule_error")]


def test_a_correct_graph_downstream_of_nothing_wrong_is_not_blamed(buggy_square):
    """The faulty node is the one with a right incoming adjoint: not its (right) neighbours."""
    report = verify(chain(9, bad_at=1))
    [f] = report.findings
    assert f.node == "n1"


def test_kept_adjoints_match_torch_retain_grad():
    graph = load_graph(EXAMPLES / "seed.json")
    program = Program(graph, np.float64)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY))
    backward(tape, keep_adjoints=True)
    w = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    x = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    z = w * x
    a = z * z
    z.retain_grad()
    a.retain_grad()
    (a / 4).backward()
    assert float(tape.adjoints["z"]) == z.grad.item() and float(tape.adjoints["a"]) == a.grad.item()
    assert float(tape.adjoints["w"]) == w.grad.item()
    assert float(tape.contributions[("z", 0)]) == w.grad.item()  # mul's contribution to w


# grid_sample's kinks are a grid point on a pixel boundary, its corners an integer input computed from the grid:
# not a tie or an avoided point of the first input that at_kink makes; tests/onnx/test_onnx_grid_sample.py puts
# a grid point exactly on a boundary and asserts the same (PASS, the kink a note)
OWN_KINK_TEST = {"grid_sample", "grid_sample_corners"}
KINKED = [op for op in all_ops() if op.kinks and op.name not in OWN_KINK_TEST]


def at_kink(op, rng):
    """The op's first test case moved onto its kink: a domain's avoided point, a tie, a clip bound."""
    case = op.cases(rng)[0]
    xs = [np.array(x, dtype=np.float64) for x in case.inputs]
    if op.name == "pow":  # its kink: a base of 0 (with an exponent >= 0, where PyTorch's convention applies)
        xs = [np.array(x) for x in np.broadcast_arrays(*xs)]
        xs[0].reshape(-1)[0], xs[1].reshape(-1)[0] = 0.0, 2.0
    elif op.name == "norm":  # its kink: a reduced slice all zeros (here every one)
        xs[0] = np.zeros_like(xs[0])
    elif op.domain_of(0).avoid:  # a point kink of the first input (relu, abs, clip, prelu's x == 0)
        point = op.domain_of(0).avoid[0]
        xs[0].reshape(-1)[0] = point
    elif op.arity == 1:  # a reduction: every element tied for the extremum
        xs[0] = np.ones_like(xs[0])
    else:  # a binary op: a tie between a and b
        xs[1] = np.broadcast_to(xs[0], np.broadcast_shapes(xs[0].shape, xs[1].shape)).copy()
        xs[0] = xs[1].copy()
    return xs, case.attrs


@pytest.mark.parametrize("op", KINKED, ids=lambda o: o.name)
def test_inputs_at_a_declared_kink_are_warnings_not_failures(op, rng):
    xs, attrs = at_kink(op, rng)
    b = GraphBuilder(op.name)
    names = [b.input(f"in{i}", x, requires_grad=True) for i, x in enumerate(xs)]
    y = b.node(op.name, *names, name="y", **attrs)
    if index_range(op, Case(xs, attrs)) is not None:  # indices (top_k's at a tie): read through take, a step
        n = max(np.shape(xs[0]))  # any position along any axis, as finite differences move them
        e = b.node("take", b.input("p", 1.0 + 0.5 * np.arange(n)), y, name="e", axis=0)
    elif op.vjp is None:  # a mask (a comparison at a tie): read through where, a step in the loss
        e = b.node("where", y, b.input("p", 2.0), b.input("q", 1.0), name="e")
    else:
        e = b.node("exp", y, name="e")
    b.output(b.node("sum", b.node("mul", e, b.input("c", 1.5), name="m"), name="L"))
    graph = load_graph(b.build())
    node = graph.node("y")
    assert any(np.min(k.distance(xs, node.attrs)) == 0 for k in op.kinks)  # really at the kink
    for dtype in ("float64", "float32"):
        report = verify(graph, VerifyOptions(dtype=dtype))
        assert report.verdict == "pass", report.to_text()
        assert all(f.severity != "error" for f in report.findings)
        if not all(p.passed for p in report.parameters):  # the mismatch is explained, at the right node
            assert [(f.node, f.cause, f.severity) for f in report.findings] == \
                [("y", "nondifferentiable_point", "warning")], report.to_text()


def test_a_kink_under_a_wrong_rule_is_still_an_error(buggy_square):
    """Near a kink the engine's value must still lie between the one-sided differences."""
    b = GraphBuilder("kinked_bug")
    u = b.input("u", [0.0, 1.0, -2.0], requires_grad=True)
    r = b.node("relu", u, name="act")
    b.output(b.node("sum", b.node("buggy_square", r, name="sq"), name="L"))
    report = verify(load_graph(b.build()))
    assert report.verdict == "fail"
    assert ("sq", "rule_error", "error") in {(f.node, f.cause, f.severity) for f in report.findings}


def test_a_subgradient_outside_the_one_sided_differences_is_an_error():
    relu = get_op("relu")
    # relu whose convention at 0 is 2: not between the one-sided derivatives 0 and 1
    bad = dataclasses.replace(relu, name="relu_bad_kink", save=lambda xs, y, **_: (xs[0],),
                              vjp=lambda xp, g, s, **_: (g * xp.where(s[0] > 0, 1.0, xp.where(s[0] == 0, 2.0, 0.0)),))
    register(bad)
    try:
        b = GraphBuilder("bad_kink")
        u = b.input("u", [0.0, 1.0, -2.0], requires_grad=True)
        b.output(b.node("sum", b.node("relu_bad_kink", u, name="act"), name="L"))
        report = verify(load_graph(b.build()))
    finally:
        del REGISTRY[bad.name]
    [f] = report.findings
    assert (f.node, f.cause, f.severity) == ("act", "nondifferentiable_point", "error")
    assert f.worst.index == (0,) and f.worst.engine == 2.0
    assert report.verdict == "fail"


def _localized(graph, params):
    """localize() on the engine's own run of graph, keeping every adjoint (as the diagnosis calls it)."""
    from gradcheck_svc.oracles.finite_diff import FiniteDifferences
    from gradcheck_svc.verify.compare import Tolerance
    from gradcheck_svc.verify.diagnosis.localize import localize
    from gradcheck_svc.verify.engine_run import run_engine
    options = VerifyOptions()
    run = run_engine(graph, options, "float64", keep_adjoints=True, profile=False)
    fd = FiniteDifferences(graph, options.fd)
    return localize(run.program, fd, run.adjoints, run.contributions, Tolerance.for_dtype("float64"), params)


def deep_chain(n: int, bad_at: int | None, bad_op: str = "buggy_square"):
    """n nodes whose gradient neither vanishes nor explodes with depth (chain()'s sin/tanh would shrink an
    error planted near the inputs of a 1,000-node chain below any tolerance): x @ W, then h * a and
    h + b alternately (a within 1e-3 of 1), the bad op at position bad_at, then a sum."""
    rng = np.random.default_rng(7)
    b = GraphBuilder(f"deep{n}")
    h = b.node("matmul", b.input("x", rng.uniform(-1, 1, (2, 3))),
               b.input("W", rng.uniform(-1, 1, (3, 3)), requires_grad=True), name="n0")
    a = b.input("a", rng.uniform(0.999, 1.001, (3,)), requires_grad=True)
    c = b.input("c", rng.uniform(-0.01, 0.01, (3,)), requires_grad=True)
    for i in range(1, n - 1):
        h = b.node(bad_op, h, name=f"n{i}") if i == bad_at else b.node("mul" if i % 2 else "add", h,
                                                                          a if i % 2 else c, name=f"n{i}")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


@pytest.mark.parametrize("n", [100, 1000])
@pytest.mark.parametrize("where", ["near the loss", "in the middle", "near the inputs"])
def test_bisection_names_the_node_in_logarithmically_many_adjoint_checks(buggy_square, n, where):
    """Naming the node costs O(log n) adjoint checks (each a directional derivative of the part of the
    graph below a value), not one per node: the bound is 2 log2(n) + 8, far below n at both depths."""
    bad = {"near the loss": n - 3, "in the middle": n // 2, "near the inputs": 2}[where]
    loc = _localized(deep_chain(n, bad_at=bad), ["W", "a", "c"])
    assert loc is not None and loc.culprit is not None
    assert loc.culprit.step.name == f"n{bad}" and loc.value == f"n{bad - 1}"
    assert loc.checked <= 2 * np.log2(n) + 8, loc.checked
    # and in forward evaluations: each check perturbs one value of 6 elements (a complex step each, a few
    # refinements where one disagrees), never a walk's n of them
    assert 0 < loc.copies <= 4 * 6 * (2 * np.log2(n) + 8), loc.copies


def test_a_clean_chain_localizes_nothing_after_checking_the_parameters_only():
    loc = _localized(deep_chain(1000, bad_at=None), ["W", "a", "c"])
    assert loc is None


def _swept(graph, params, options=None):
    """local_sweep.sweep on a verification's own results (as the diagnosis calls it)."""
    from gradcheck_svc.oracles.finite_diff import FiniteDifferences
    from gradcheck_svc.verify.compare import Tolerance
    from gradcheck_svc.verify.diagnosis.context import Context
    from gradcheck_svc.verify.diagnosis.local_sweep import sweep
    from gradcheck_svc.verify.engine_run import run_engine
    options = options or VerifyOptions()
    results = verify(graph, options).parameters
    ctx = Context(graph, options, "float64", run_engine(graph, options, "float64"), results,
                  FiniteDifferences(graph, options.fd), Tolerance.for_dtype("float64"))
    return sweep(ctx, params)


@pytest.mark.parametrize("n", [60, 240])
def test_the_local_sweep_checks_like_pairs_together_and_only_the_culprit_one_by_one(buggy_square, n):
    """The sweep's per-node checks run batched per op (sweep_screen.py): at any depth the pairs checked one
    by one are the wrong rule's alone -- the node named with the same cause -- and every other pair is
    cleared by the batched checks, not by being skipped."""
    bad = n // 2
    verdicts = _swept(deep_chain(n, bad_at=bad), ["W", "a", "c"])
    assert len(verdicts) == 2 * (n - 2) + 1  # every (node, differentiable input) on the path, each once
    alone = [v for v in verdicts if not v.screened]
    assert [(v.step.name, v.cause) for v in alone] == [(f"n{bad}", "rule_error")]
    assert all(v.cause is None for v in verdicts if v.screened)


def test_a_cache_overwrite_in_a_batched_group_is_checked_one_by_one_and_named():
    """One pair of the chain's largest group (mul by a, input a) reads an overwritten value: the batched
    checks judge each pair on its own row, so that pair alone falls to the one-by-one check, which names it
    cache_corruption -- as verify() does."""
    from gradcheck_svc.engine.faults import Fault
    graph = deep_chain(120, None)
    options = VerifyOptions(faults=(Fault("n60", "overwrite", 2.0),))
    report = verify(graph, options)
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [("n61", "cache_corruption")]
    alone = [v for v in _swept(graph, ["W", "a", "c"], options) if not v.screened]
    assert [(v.step.name, v.k, v.cause) for v in alone] == [("n61", 1, "cache_corruption")]
