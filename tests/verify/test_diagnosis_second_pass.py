"""Diagnosis, second pass (issue 16): every culprit on a failing path is named with exactly the
parameters it affects; a real float32 rule bug is never excused as rounding; an input exactly on a
kink gets an info note even when every reference agrees.

Wrong rules are planted as registered copies of real ops with a scaled vjp (removed after the test);
corrupted caches with the engine's --fault hook, integrity checking off."""
import dataclasses

import numpy as np
import pytest

from gradcheck_svc.engine import parse_fault
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.verify import VerifyOptions, verify
from op_cases import SMOOTH_BINARY, SMOOTH_UNARY  # the registry's smooth ops


def errors(report):
    return sorted((f.node, f.cause, tuple(sorted(f.parameters))) for f in report.findings if f.severity == "error")


@pytest.fixture
def scaled():
    """scaled(op, factor) -> the name of a copy of `op` whose vjp is multiplied by factor."""
    made = []

    def make(op_name, factor):
        op = REGISTRY[op_name]
        name = f"{op_name}_x{factor}"
        if name not in REGISTRY:
            register(dataclasses.replace(op, name=name, vjp=lambda xp, g, saved, **a: tuple(
                None if v is None else factor * v for v in op.vjp(xp, g, saved, **a))))
            made.append(name)
        return name
    yield make
    for name in made:
        del REGISTRY[name]


def chain(n: int, bad: dict, dtype=np.float64, width: int = 3):
    """x @ W, then (sin, mul by a, tanh) repeated to n nodes; bad maps positions to op names."""
    rng = np.random.default_rng(7)
    b = GraphBuilder(f"chain{n}")
    h = b.node("matmul", b.input("x", rng.uniform(-1, 1, (2, width)).astype(dtype)),
               b.input("W", rng.uniform(-1, 1, (width, width)).astype(dtype), requires_grad=True), name="n0")
    a = b.input("a", rng.uniform(0.5, 1.5, (width,)).astype(dtype), requires_grad=True)
    cycle = ["sin", "mul", "tanh"]
    for i in range(1, n - 1):
        op = bad.get(i, cycle[i % 3])
        h = b.node(op, h, a, name=f"n{i}") if op.startswith("mul") else b.node(op, h, name=f"n{i}")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


# 1. every culprit -------------------------------------------------------------------------------

def test_two_wrong_rules_in_one_chain_are_both_named(scaled):
    bad = scaled("tanh", 1.5)
    report = verify(chain(30, {8: bad, 20: bad}))
    assert report.verdict == "fail"
    assert errors(report) == [("n20", "rule_error", ("W", "a")), ("n8", "rule_error", ("W", "a"))]


def test_three_wrong_rules_in_one_chain_are_all_named(scaled):
    report = verify(chain(40, {5: scaled("sin", 0.5), 17: scaled("tanh", 1.5), 31: scaled("sin", 0.5)}))
    assert errors(report) == [("n17", "rule_error", ("W", "a")), ("n31", "rule_error", ("W", "a")),
                              ("n5", "rule_error", ("W", "a"))]


def test_a_culprit_before_any_parameter_use_affects_only_the_parameters_behind_it(scaled):
    """n1 (sin) comes before the first use of `a` (n2): only W's gradient flows through it."""
    report = verify(chain(12, {1: scaled("sin", 2.0), 9: scaled("tanh", 1.5)}))
    assert errors(report) == [("n1", "rule_error", ("W",)), ("n9", "rule_error", ("W", "a"))]


def test_two_corrupted_caches_on_one_path_with_integrity_off_are_both_named():
    """tanh saves its output, which the next sin saves too: corrupting n8's and n20's saved outputs
    wrongs exactly their readers, each named with the parameters behind it."""
    faults = (parse_fault("n8:scale:1.3"), parse_fault("n20:scale:0.7"))
    report = verify(chain(24, {}), VerifyOptions(faults=faults, integrity="off"))
    assert [f.readers for f in report.faults] == [["n8", "n9"], ["n20", "n21"]]
    assert errors(report) == [(n, "cache_corruption", ("W", "a")) for n in ("n20", "n21", "n8", "n9")]


def test_a_corrupted_input_of_a_mul_affects_only_the_other_factor():
    """n7 = n6 * a saves both factors; a corrupted n6 wrongs only n7's gradient for `a`."""
    report = verify(chain(24, {}), VerifyOptions(faults=(parse_fault("n6:scale:1.3"),), integrity="off"))
    assert errors(report) == [("n7", "cache_corruption", ("a",))]


def branches(left_op, right_op, shared_op):
    """p -> shared -> (left branch with q) and (right branch with r) -> loss: a shared subexpression
    feeding two branches, each with its own parameter."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("branches")
    p = b.input("p", rng.uniform(-1, 1, (4,)), requires_grad=True)
    q = b.input("q", rng.uniform(0.5, 1.5, (4,)), requires_grad=True)
    r = b.input("r", rng.uniform(0.5, 1.5, (4,)), requires_grad=True)
    s = b.node(shared_op, p, name="shared")
    left = b.node(left_op, b.node("mul", s, q, name="lq"), name="left")
    right = b.node(right_op, b.node("mul", s, r, name="rr"), name="right")
    b.output(b.node("sum", b.node("add", left, right, name="both"), name="L"))
    return load_graph(b.build())


def test_bugs_on_both_branches_are_named_each_with_its_own_parameters(scaled):
    report = verify(branches(scaled("tanh", 1.5), scaled("sin", 0.5), "sin"))
    assert errors(report) == [("left", "rule_error", ("p", "q")), ("right", "rule_error", ("p", "r"))]


def test_a_bug_on_a_shared_subexpression_and_one_downstream_are_both_named(scaled):
    report = verify(branches(scaled("tanh", 1.5), "sin", scaled("sin", 1.2)))
    assert errors(report) == [("left", "rule_error", ("p", "q")), ("shared", "rule_error", ("p",))]


def test_the_worst_element_of_each_culprit_shows_its_own_error(scaled):
    """Each culprit's worst element compares its own rule with its own local reference: the ratio
    is the planted factor, whatever the other bug did to its incoming adjoint."""
    report = verify(chain(30, {8: scaled("tanh", 1.5), 20: scaled("tanh", 3.0)}))
    ratio = {f.node: f.worst.engine / f.worst.reference for f in report.findings if f.severity == "error"}
    assert ratio == {"n8": pytest.approx(1.5, rel=1e-6), "n20": pytest.approx(3.0, rel=1e-6)}


# 2. float32: a rule bug is never rounding -----------------------------------------------------

def cancelling_float32(op):
    """L = sum(op(p * c) - 0.98 * tanh(p * c)): the gradients of the two terms nearly cancel, so a
    small rule error in `op` is a large error in p's gradient, beyond the float32 tolerance."""
    rng = np.random.default_rng(11)
    b = GraphBuilder("cancel32")
    p = b.input("p", rng.uniform(-1, 1, (6,)).astype(np.float32), requires_grad=True)
    u = b.node("mul", p, b.input("c", rng.uniform(0.5, 1.5, (6,)).astype(np.float32)), name="u")
    lead = b.node(op, u, name="lead")
    other = b.node("mul", b.node("tanh", u, name="t2"), b.input("k", np.float32(0.98)), name="scaled")
    b.output(b.node("sum", b.node("sub", lead, other, name="d"), name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("factor", [1.01, 1.001])
def test_a_small_rule_error_in_a_float32_graph_fails(scaled, factor):
    report = verify(cancelling_float32(scaled("tanh", factor)))
    assert report.dtype == "float32"
    [p] = report.parameters
    assert not p.passed  # over its tolerance: the diagnosis must not excuse it as rounding
    assert report.verdict == "fail", report.to_text()
    assert errors(report) == [("lead", "rule_error", ("p",))]
    assert not [f for f in report.findings if f.cause == "precision"]


def test_the_same_float32_graph_with_a_right_rule_passes():
    report = verify(cancelling_float32("tanh"))
    assert report.verdict == "pass" and errors(report) == []




def random_float32_graph(seed: int):
    """3-6 random smooth nodes over two float32 parameters."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"r32_{seed}")
    values = [b.input("p", rng.uniform(-1, 1, (3,)).astype(np.float32), requires_grad=True),
              b.input("q", rng.uniform(-1, 1, (3,)).astype(np.float32), requires_grad=True)]
    for i in range(int(rng.integers(3, 7))):
        if rng.random() < 0.5:
            values.append(b.node(str(rng.choice(SMOOTH_UNARY)), values[int(rng.integers(len(values)))], name=f"v{i}"))
        else:
            x, y = (values[int(j)] for j in rng.integers(len(values), size=2))
            values.append(b.node(str(rng.choice(SMOOTH_BINARY)), x, y, name=f"v{i}"))
    b.output(b.node("sum", b.node("add", values[-1], values[-2], name="top"), name="L"))
    return load_graph(b.build())


def test_200_random_clean_float32_graphs_have_no_error_finding():
    """Tolerances 100,000x tighter than float32's default, so rounding alone fails parameters and the
    diagnosis runs on every graph: every node must be cleared as within its rounding band."""
    opts = VerifyOptions(atol=1e-9, rtol=1e-8, symbolic=SymbolicOptions(enabled=False))
    diagnosed = 0
    for seed in range(200):
        report = verify(random_float32_graph(seed), opts)
        assert errors(report) == [], report.to_text()
        assert report.verdict == "pass", report.to_text()
        diagnosed += any(not p.passed for p in report.parameters)
    assert diagnosed >= 20  # the diagnosis really ran on a good share of them


# 3. exact kinks ---------------------------------------------------------------------------------

def kinked(op, attrs=None, x=(0.5, -0.25, 1.0), y=None):
    b = GraphBuilder(f"tie_{op}")
    names = [b.input("x", np.array(x), requires_grad=True)]
    if y is not None:
        names.append(b.input("y", np.array(y), requires_grad=True))
    out = b.node(op, *names, name="k", **(attrs or {}))
    b.output(b.node("sum", b.node("mul", out, b.input("c", np.array([1.0, 2.0, 3.0])), name="wc"), name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("graph, sides", [
    (kinked("maximum", x=(0.5, -0.25, 1.0), y=(0.5, 0.0, 2.0)), "engine 0.5, one-sided 0 (left) and 1 (right)"),
    (kinked("minimum", x=(0.5, -0.25, 1.0), y=(0.5, 0.0, 2.0)), "engine 0.5, one-sided 1 (left) and 0 (right)"),
    (kinked("abs", x=(0.0, -0.25, 1.0)), "engine 0, one-sided -1 (left) and 1 (right)"),
], ids=["maximum", "minimum", "abs"])
def test_an_input_exactly_on_a_kink_gets_an_info_note_and_passes(graph, sides):
    report = verify(graph)
    assert report.verdict == "pass", report.to_text()
    [note] = report.findings
    assert (note.node, note.cause, note.severity) == ("k", "nondifferentiable_point", "info")
    assert "exactly at its kink" in note.detail and sides in note.detail
    assert sorted(note.parameters) == sorted(p.name for p in report.parameters)


def test_a_tied_max_reduction_gets_a_note_for_one_tied_element():
    b = GraphBuilder("max_tie")
    x = b.input("x", np.array([[1.0, 2.0, 2.0], [0.5, 0.1, 0.3]]), requires_grad=True)
    m = b.node("max", x, name="k", axis=[1])
    b.output(b.node("sum", b.node("mul", m, b.input("c", np.array([1.0, 2.0])), name="wc"), name="L"))
    report = verify(load_graph(b.build()))
    assert report.verdict == "pass"
    [note] = report.findings
    assert (note.node, note.severity, note.parameters) == ("k", "info", ["x"])
    assert "d/dx[0, 1]: engine 0.5, one-sided 0 (left) and 1 (right)" in note.detail


def test_a_kink_note_excuses_no_mismatch(scaled):
    """A wrong rule elsewhere on a graph with a tie still fails: the note is information only."""
    b = GraphBuilder("tie_and_bug")
    x = b.input("x", np.array([0.5, 1.0]), requires_grad=True)
    m = b.node("maximum", x, b.input("y", np.array([0.5, 0.0])), name="k")
    b.output(b.node("sum", b.node(scaled("sin", 1.5), m, name="bad"), name="L"))
    report = verify(load_graph(b.build()))
    assert report.verdict == "fail"
    assert errors(report) == [("bad", "rule_error", ("x",))]


def test_a_clip_bound_where_the_references_disagree_is_a_warning_worded_exactly_at():
    """At a clip bound the engine's convention (1) is not what central differences and SymPy give (1/2):
    more than a note -- the kink warning,
    which says the input is exactly at the kink, and the verdict still passes."""
    report = verify(kinked("clip", {"min": -0.25, "max": 0.75}, x=(0.5, -0.25, 1.0)))
    assert report.verdict == "pass"
    [f] = report.findings
    assert (f.node, f.cause, f.severity) == ("k", "nondifferentiable_point", "warning")
    assert "exactly at its kink" in f.detail


def test_near_a_kink_is_worded_apart_from_at_it_and_relative_errors_stay_finite():
    """relu 1e-9 from 0: the first pass's central differences straddle the kink (a finding, 'near'); the
    relative errors stay finite fractions, not err / tiny."""
    b = GraphBuilder("near")
    u = b.input("u", np.array([1e-9, 1.0]), requires_grad=True)
    b.output(b.node("sum", b.node("relu", u, name="act"), name="L"))
    report = verify(load_graph(b.build()))
    [f] = report.findings
    assert (f.node, f.cause) == ("act", "nondifferentiable_point") and f.severity in ("warning", "info")
    assert "near its kink" in f.detail and "exactly" not in f.detail
    [p] = report.parameters
    assert np.isfinite(p.fd.comparison.max_rel_error) and p.fd.comparison.max_rel_error <= 2.0
    # the ladder's steps reach below 1e-9, so the refined difference resolves the kink's side: 1, as SymPy
    # (it once stopped at a coarse rung on central differences alone, straddling the kink: 0.5)
    assert abs(p.fd.reference[0] - 1.0) <= p.fd.error[0] and p.symbolic.fd_vs_symbolic.max_rel_error <= 1e-6
