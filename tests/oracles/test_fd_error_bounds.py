"""Finite differences that know their own error (issue 17): with the symbolic oracle off, a
correct gradient is never reported wrong because the step was not small next to x, and a
wrong one is still caught and named. The exact values come from closed forms here, not from
the engine."""

import numpy as np
import pytest

from gradcheck_svc.engine import parse_fault
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.ops.registry import REGISTRY
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.compare import Tolerance, bounds
from gradcheck_svc.verify.fd_check import fd_check

from op_cases import DIFFERENTIABLE, SMOOTH_BINARY, SMOOTH_UNARY, op_graph, registered_scaled_rule

# real central differences, whose error this module is about (complex steps have none of these terms and are
# the default: tests/oracles/test_fd_complex.py)
CENTRAL = FDOptions(method="central")
FD_ONLY = VerifyOptions(fd=CENTRAL, symbolic=SymbolicOptions(enabled=False))
A, C = -2.5627, 1.4993


def div_graph(b_value: float, op: str = "div"):
    """L = sum(C * a / b): the issue's minimal case."""
    g = GraphBuilder("small_denominator")
    q = g.node(op, g.input("a", np.array([A, 0.7]), True), g.input("b", np.array([b_value, 0.5]), True), name="q")
    g.output(g.node("sum", g.node("mul", g.input("c", np.array(C)), q, name="cq"), name="L"))
    return load_graph(g.build())


def unary_graph(op: str, x: np.ndarray, **attrs):
    g = GraphBuilder(op)
    y = g.node(op, g.input("x", x, True), name="y", **attrs)
    w = np.linspace(0.5, 1.5, x.size).reshape(x.shape)
    g.output(g.node("sum", g.node("mul", y, g.input("w", w), name="wy"), name="L"))
    return load_graph(g.build())


def errors(report):
    return [(f.node, f.cause) for f in report.findings if f.severity == "error"]


@pytest.mark.parametrize("b", [1.87e-3, 1e-3, 1e-4, 1e-5, 1e-6, -1e-6])
def test_small_denominators_pass_and_the_bound_holds_the_exact_value(b):
    report = verify(div_graph(b), FD_ONLY)
    assert report.verdict == "pass" and not errors(report), report.to_text()
    grad_b = next(p for p in report.parameters if p.name == "b").fd
    exact = -C * A / b ** 2
    assert grad_b.refined.tolist() == [0]  # only the element next to the pole needed more steps
    # the refined difference is within its own error bound of the closed form, and the bound is tight
    # enough to decide (refinement stops once the comparison is decided: about the tolerance's size)
    assert abs(grad_b.reference[0] - exact) <= grad_b.error[0] <= 1e-5 * abs(exact)
    d = next(p for p in report.parameters if p.name == "b").to_dict()
    assert d["fd_error"][0] == grad_b.error[0] and d["fd_refined"] == 1 and d["fd_undecidable"] == []


def test_the_first_pass_alone_is_off_by_more_than_the_tolerance():
    """What the refinement is for: at h = cbrt(eps) the central difference is off by ~1e-5."""
    graph = div_graph(1.87e-3)
    first = FiniteDifferences(graph, FDOptions(mode="full", method="central")).gradient("b")
    exact = -C * A / 1.87e-3 ** 2
    assert abs(first.reference[0] - exact) > 1e-6 * abs(exact) + first.noise[0]


@pytest.mark.parametrize("op,x", [
    ("log", [1e-3, 1e-5, 1e-8, 2.0]),
    ("sqrt", [1e-4, 1e-6, 1e-8, 3.0]),
    ("exp", [300.0, 650.0, 700.0, -2.0]),
])
def test_near_a_domain_edge_or_overflow_no_error(op, x):
    report = verify(unary_graph(op, np.array(x)), FD_ONLY)
    assert report.verdict == "pass" and not errors(report), report.to_text()
    p = report.parameters[0].fd
    exact = {"log": lambda v: 1 / v, "sqrt": lambda v: 0.5 / np.sqrt(v), "exp": np.exp}[op](np.array(x))
    exact = exact * np.linspace(0.5, 1.5, len(x))
    # each difference is within its error bound of the closed form, up to the comparison's tolerance
    allowed = p.error + bounds(exact, Tolerance.for_dtype("float64"))
    assert np.all(np.abs(p.reference - exact) <= allowed), (p.reference, exact)


@pytest.mark.parametrize("exponent", [20.0, 60.0, 120.0])
def test_pow_with_large_exponents_no_error(exponent):
    g = GraphBuilder("pow")
    y = g.node("pow", g.input("x", np.array([1.3, 0.9, 2.0]), True), g.input("e", np.array(exponent)), name="y")
    g.output(g.node("sum", y, name="L"))
    report = verify(load_graph(g.build()), FD_ONLY)
    assert report.verdict == "pass" and not errors(report), report.to_text()


def wide_random_graph(seed: int, rows: int = 1500, width: int = 8, tanh: str = "tanh"):
    """Over the symbolic budget (>10,000 elements): layers of tanh(op(h @ W_i, h)) on a [rows, width]
    batch, registry-drawn smooth ops, a weighted sum; the middle layer's tanh may be another op."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"wide{seed}")
    h = b.input("x", rng.uniform(-1, 1, (rows, width)))
    for i in range(3):
        W = b.input(f"W{i}", rng.uniform(-1, 1, (width, width)) / np.sqrt(width), requires_grad=True)
        m = b.node("matmul", h, W, name=f"mm{i}")
        m = b.node(str(rng.choice(SMOOTH_BINARY)), m, h, name=f"bin{i}")
        m = b.node(str(rng.choice(SMOOTH_UNARY)), m, name=f"un{i}")
        h = b.node(tanh if i == 1 else "tanh", m, name=f"h{i}")
    b.output(b.node("sum", b.node("mul", h, b.input("r", rng.uniform(0.5, 1.5, (rows, width))), name="weighted"),
                    name="L"))
    return load_graph(b.build())


@pytest.fixture
def tanh_one_percent_off():
    with registered_scaled_rule(REGISTRY["tanh"], 1.01, "_1pct") as bad:
        yield bad.name


@pytest.mark.parametrize("seed", range(3))
def test_random_clean_graphs_over_the_symbolic_budget_have_no_error(seed):
    graph = wide_random_graph(seed)
    assert sum(int(np.prod(s.shape)) for s in graph.specs.values()) > 10_000
    report = verify(graph, VerifyOptions())  # default options: the symbolic oracle is out of budget
    assert report.symbolic.status == "skipped"
    assert report.verdict == "pass" and not errors(report), report.to_text()


def test_a_wrong_rule_in_the_same_graphs_is_still_named(tanh_one_percent_off):
    report = verify(wide_random_graph(0, tanh=tanh_one_percent_off), VerifyOptions())
    assert report.symbolic.status == "skipped" and report.verdict == "fail"
    assert errors(report) == [("h1", "rule_error")], report.to_text()


def test_a_corrupted_cache_in_the_same_graphs_is_still_named():
    """integrity off: no fingerprint, so localization must infer it from finite differences."""
    report = verify(wide_random_graph(0), VerifyOptions(faults=(parse_fault("h1:scale:1.01"),), integrity="off"))
    assert report.verdict == "fail"
    # every node whose backward read the corrupted tensor is a culprit, each named once
    named = errors(report)
    assert sorted(named) == sorted((r, "cache_corruption") for r in report.faults[0].readers), report.to_text()


def test_a_corrupted_cache_next_to_a_pole_is_still_named():
    report = verify(div_graph(1e-5), VerifyOptions(symbolic=SymbolicOptions(enabled=False),
                                                   faults=(parse_fault("b:scale:1.01"),)))
    assert report.verdict == "fail"
    assert ("q", "cache_corruption") in errors(report), report.to_text()


def test_undecidable_is_undecided_naming_the_element_never_a_rule_error_nor_a_pass():
    """sqrt at 1e-300: no step is small next to x, the one-sided differences never converge (331 +- 137
    against the exact 2.5e+149: a bound made of the ladder's gaps, not rounding's, confirms nothing). With
    FD alone nothing decides that element: the parameter is undecided, the element named (issue 44: never
    a silent pass); with the symbolic oracle on, the exact gradient decides it and FD's doubt is a warning."""
    report = verify(unary_graph("sqrt", np.array([1e-300, 4.0])), FD_ONLY)
    assert report.verdict == "fail" and errors(report) == [("x", "fd_unresolved")], report.to_text()
    (f,) = [f for f in report.findings if f.severity == "error"]
    assert f.worst.index == (0,) and "first [0]" in f.detail and "undecided" in f.detail
    assert report.parameters[0].status == "undecided"
    assert report.parameters[0].to_dict()["fd_undecidable"] == [0]
    report = verify(unary_graph("sqrt", np.array([1e-300, 4.0])), VerifyOptions())
    assert report.verdict == "pass" and not errors(report), report.to_text()
    (f,) = [f for f in report.findings if f.cause == "fd_undecidable"]
    assert (f.node, f.severity, f.worst.index) == ("x", "warning", (0,))


@pytest.fixture
def one_percent_rule(request):
    with registered_scaled_rule(request.param, 1.01, "_1pct") as bad:
        yield bad


@pytest.mark.parametrize("one_percent_rule", DIFFERENTIABLE, ids=lambda o: o.name, indirect=True)
def test_a_one_percent_rule_error_is_named_at_its_node_by_fd_alone(one_percent_rule, rng):
    """Detection does not drop for the error bounds: every op, its vjp 1% off, symbolic off."""
    case = REGISTRY[one_percent_rule.name[:-5]].cases(rng)[0]
    report = verify(op_graph(one_percent_rule.name, case, rng), FD_ONLY)
    assert report.verdict == "fail"
    assert errors(report) == [("y", "rule_error")], report.to_text()


def test_projected_differences_are_refined_too():
    """Random directions all touch the element next to the pole: those that fail are refined along
    the same directions (FDResult.directions), and the verdict is right."""
    rng = np.random.default_rng(0)
    b_values = rng.uniform(0.5, 2, 200)
    b_values[7] = 1e-3
    g = GraphBuilder("projected_pole")
    a_values = rng.standard_normal(200)
    q = g.node("div", g.input("a", a_values, True), g.input("b", b_values, True), name="q")
    g.output(g.node("sum", q, name="L"))
    report = verify(load_graph(g.build()), VerifyOptions(fd=FDOptions(mode="projection", method="central"),
                                                         symbolic=SymbolicOptions(enabled=False)))
    assert report.verdict == "pass" and not errors(report), report.to_text()
    grad_b = next(p for p in report.parameters if p.name == "b").fd
    assert grad_b.mode == "projection" and len(grad_b.refined) >= 1
    exact = grad_b.directions @ (-a_values / b_values ** 2)
    assert np.all(np.abs(grad_b.reference - exact)[grad_b.refined] <= grad_b.error[grad_b.refined])


def test_localization_does_not_blame_a_node_for_the_oracles_truncation(tanh_one_percent_off):
    """y = tanh_1pct(x) ~ 1e-4, L = sum(c / y): the adjoint of y is checked by differences whose
    first pass is off by ~(h/y)^2 = 4e-3. Without the bound, div would be blamed; with it, the
    wrong rule is named where it is."""
    g = GraphBuilder("pole_downstream")
    y = g.node(tanh_one_percent_off, g.input("x", np.array([1e-4, 2e-4, -3e-4]), True), name="y")
    q = g.node("div", g.input("c", np.array([1.0, 2.0, 0.5])), y, name="q")
    g.output(g.node("sum", q, name="L"))
    report = verify(load_graph(g.build()), FD_ONLY)
    assert report.verdict == "fail"
    assert errors(report) == [("y", "rule_error")], report.to_text()


def test_a_one_percent_wrong_div_rule_next_to_the_pole_is_still_caught():
    with registered_scaled_rule(REGISTRY["div"], 1.01, "_1pct") as bad:
        report = verify(div_graph(1e-5, op=bad.name), FD_ONLY)
    assert report.verdict == "fail"
    assert errors(report) == [("q", "rule_error")], report.to_text()


def kink_graph(t: float):
    """L = sum(w * relu(x + b)), one input of relu t below 0: a ReLU kink a few steps away or nearer than
    every step of the ladder, as in a folded BatchNorm bias under many activations near 0."""
    g = GraphBuilder("kink_near_the_ladder")
    x = np.array([0.3, -0.2, 0.7, -0.1 - t, 0.45])
    z = g.node("add", g.input("x", x), g.input("b", np.array([0.1]), True), name="z")
    y = g.node("relu", z, name="y")
    g.output(g.node("sum", g.node("mul", y, g.input("w", np.array([1.0, 0.5, 2.0, 1e-3, 1.5])), name="wy"),
                    name="L"))
    return load_graph(g.build())


@pytest.mark.parametrize("t", [3e-6, 1e-9, 1e-11])
def test_a_kink_under_the_steps_never_confirms_a_correct_gradient_wrong(t):
    """Central differences straddling a kink are off by s/2 (1 - t/h) (s: the change of slope): their
    gaps do not shrink 4x per halving, they level off, so the distance to neighbours is no bound there.
    t = 3e-6: the ladder settled at level 2, on central differences alone (the one-sided ones had no
    bound yet), 0.0003 off with a bound of 0.0002 -- a correct gradient confirmed wrong (the
    ResNet-18 of bench/bench_fd_shards.py failed so on a folded BatchNorm bias, its other values left
    with first-pass bounds of 2e-10). t below every step: central differences converge, with a tiny
    gap, to the mean of the slopes (4.5005 +- 1e-9, where the exact gradient is 4.5); the one-sided
    ones, each to its side's slope, disagree with them beyond both bounds, and the bound must reach
    them. The exact value: relu'(z) = 1 where z > 0, 0 at z = -t. Ordinary differences, as of an op
    without frozen branches; with them (the default) relu keeps its piece and the first pass is exact."""
    exact = 1.0 + 2.0 + 1.5
    assert abs(FiniteDifferences(kink_graph(t)).gradient("b").reference[0] - exact) <= 1e-9
    fd = FiniteDifferences(kink_graph(t), FDOptions(frozen_branches=False))
    first = fd.gradient("b")
    assert abs(first.reference[0] - exact) > 1e-4  # the first pass straddles the kink
    tol = Tolerance(rtol=1e-6, atol=1e-9)
    chk = fd_check(np.array([exact]), first.reference, first.noise, tol,
                   lambda which, settled: fd.refine("b", first, which, settled))
    assert chk.refined.tolist() == [0]
    assert abs(chk.reference[0] - exact) <= chk.error[0] <= 1e-3 * exact
    assert chk.passed
    # the whole ladder (no early stop) holds it too
    full = fd.refine("b", first, np.array([0]))
    assert abs(full.values[0] - exact) <= full.error[0]
    # and the verifier's verdict: the parameter agrees, nothing is an error
    report = verify(kink_graph(t), FD_ONLY)
    assert report.verdict == "pass" and not errors(report), report.to_text()
    (grad_b,) = report.parameters
    assert abs(grad_b.fd.reference[0] - exact) <= grad_b.fd.error[0]
