"""One tie rule for every reference and mode (issue 44): at an exact tie or kink point any value in the hull
of the one-sided derivatives (SymPy's even split, the engine's first maximum, another code's convention) is a
convention -- a note or warning, never a FAIL -- in every --fd mode, symbolic on or off; near (not at) a kink
only the derivative there is right (one-sided differences at a step below the distance to the kink), so a
rule wrong beside the kink fails, float32 engines included."""
import dataclasses

import numpy as np
import pytest

from gradcheck_core.claims import claims_message, with_claims
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.oracles.finite_diff import FDOptions
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.verify import VerifyOptions, verify

MODES = ["auto", "full", "joint", "projection"]


def errors(report):
    return [(f.node, f.cause) for f in report.findings if f.severity == "error"]


def pool_ties(n: int = 6):
    """max_pool 2x2/2 over (1, 2, 2n, 2n) whose every window holds one value four times: 288 tied elements
    at n = 6, where SymPy splits each window's gradient 1/4 each and the engine gives it to the first."""
    rng = np.random.default_rng(0)
    x = np.repeat(np.repeat(rng.uniform(-1, 1, (1, 2, n, n)), 2, 2), 2, 3)
    w = rng.uniform(-1, 1, (1, 2, n, n))
    b = GraphBuilder("pool_ties")
    y = b.node("max_pool", b.input("x", x, True), name="y", kernel_shape=[2, 2], strides=[2, 2])
    b.output(b.node("sum", b.node("mul", y, b.input("w", w), name="wy"), name="L"))
    return b.build(), x, w


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", MODES)
def test_four_way_max_pool_ties_pass_against_the_symbolic_split(mode, dtype):
    msg, _, _ = pool_ties()
    report = verify(load_graph(msg), VerifyOptions(dtype=dtype, fd=FDOptions(mode=mode)))
    assert report.symbolic.status == "ok"
    assert report.verdict == "pass" and not errors(report), report.to_text()
    (row,) = report.parameters
    assert row.status in ("ok", "ok (kink)")
    assert any(f.node == "y" and f.cause == "nondifferentiable_point" for f in report.findings)


def _tied(op, *values):
    b = GraphBuilder(f"tie_{op}")
    names = [b.input(n, np.array(v), requires_grad=True) for n, v in zip("xy", values)]
    k = b.node(op, *names, name="k")
    b.output(b.node("sum", b.node("mul", k, b.input("c", np.array([1.0, 2.0, 3.0])), name="wc"), name="L"))
    return b.build()


def _pool_last():
    msg, x, w = pool_ties(2)
    g = np.zeros_like(x)
    g[:, :, 1::2, 1::2] = w  # each window's last maximum: another valid convention than the engine's first
    return msg, {"x": g}


CLAIMS = {
    "relu'(0)=1": lambda: (_tied("relu", [0.0, -0.25, 1.0]), {"x": [1.0, 0.0, 3.0]}),
    "maximum all to a": lambda: (_tied("maximum", [0.5, -0.25, 1.0], [0.5, 0.0, 2.0]),
                                 {"x": [1.0, 0.0, 0.0], "y": [0.0, 2.0, 3.0]}),
    "max_pool last maximum": _pool_last,
}


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "fd-only"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_a_claim_with_another_tie_convention_passes_in_every_mode(claim, mode, symbolic):
    msg, grads = CLAIMS[claim]()
    graph = load_graph(with_claims(msg, claims_message({k: np.asarray(v, dtype=float) for k, v in grads.items()})))
    report = verify(graph, VerifyOptions(fd=FDOptions(mode=mode), symbolic=SymbolicOptions(enabled=symbolic)))
    assert report.subject == "claimed"
    assert report.verdict == "pass" and not errors(report), report.to_text()
    assert all(p.status in ("ok", "ok (kink)") for p in report.parameters)
    # and a claim outside the one-sided differences at the same tie still fails there
    first = next(iter(grads))
    off = np.array(grads[first], dtype=float)
    off.reshape(-1)[np.argmax(np.abs(off).reshape(-1))] *= 5.0
    bad = load_graph(with_claims(msg, claims_message({**{k: np.asarray(v, dtype=float) for k, v in grads.items()},
                                                      first: off})))
    report = verify(bad, VerifyOptions(fd=FDOptions(mode=mode), symbolic=SymbolicOptions(enabled=symbolic)))
    assert report.verdict == "fail" and errors(report), report.to_text()


@pytest.fixture(scope="module")
def relu_wrong_beside_zero():
    """relu whose rule is 50% off on inputs in (0, 1e-7]: right at 0 and everywhere else."""
    relu = REGISTRY["relu"]

    def vjp(xp, g, saved, **a):
        (gx,) = relu.vjp(xp, g, saved, **a)
        y = saved[0] if isinstance(saved, (tuple, list)) else saved
        return (gx * xp.where((y > 0) & (y <= 1e-7), 0.5, 1.0).astype(gx.dtype),)
    bad = dataclasses.replace(relu, name="test_relu_wrong_beside_zero", vjp=vjp)
    register(bad)
    yield bad.name
    del REGISTRY[bad.name]


def _near_zero(op):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-1, 1, 8), rng.uniform(1e-8, 1e-7, 4)])
    b = GraphBuilder("near_zero")
    k = b.node(op, b.input("x", x, True), name="k")
    b.output(b.node("sum", b.node("mul", k, b.input("c", rng.uniform(0.5, 1.5, x.size)), name="wc"), name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "fd-only"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_rule_wrong_beside_a_kink_fails_float32_included(relu_wrong_beside_zero, dtype, symbolic):
    options = VerifyOptions(dtype=dtype, symbolic=SymbolicOptions(enabled=symbolic))
    right = verify(_near_zero("relu"), options)
    assert right.verdict == "pass" and not errors(right), right.to_text()
    report = verify(_near_zero(relu_wrong_beside_zero), options)
    assert report.verdict == "fail", report.to_text()
    assert [n for n, _ in errors(report)] == ["k"], report.to_text()
    assert {p.name: p.status for p in report.parameters} == {"x": "FAIL"}


def test_a_wrong_claim_judged_by_the_joint_screen_beside_a_kink_fails_with_no_internal_error():
    # a stale claim flags every parameter; those the follow-up's budget leaves to the joint screen's directions
    # (their rows' differences are no elements or directions of their own) sit upstream of relu(h - h), a kink at
    # every element: the kink analysis had no moves to difference along and raised (INTERNAL, no report)
    rng = np.random.default_rng(0)
    b = GraphBuilder("joint_kink")
    h = b.input("x", rng.uniform(-1, 1, (2, 4)))
    for i in range(6):
        h = b.node("tanh", b.node("matmul", h, b.input(f"W{i}", rng.standard_normal((4, 4)) / 2, True)), name=f"h{i}")
    b.output(b.node("sum", b.node("add", h, b.node("relu", b.node("sub", h, h), name="kink")), name="L"))
    msg = b.build()
    opts = VerifyOptions(symbolic=SymbolicOptions(enabled=False))
    stale = {p.name: np.asarray(p.gradient).reshape(p.shape) * 1.5 for p in verify(load_graph(msg), opts).parameters}
    report = verify(load_graph(with_claims(msg, claims_message(stale))), opts)
    assert report.verdict == "fail"
    assert {p.status for p in report.parameters} == {"FAIL"}, report.to_text()
    assert {p.fd.mode for p in report.parameters} == {"joint", "full"}  # both kinds of row, each judged


def test_a_wrong_claim_judged_by_the_symbolic_gradient_names_its_element_not_a_direction():
    # two wrong claims flag both parameters; the follow-up's budget checks the cheaper one in full and leaves the
    # other to its joint directional values, while the symbolic gradient judges both element by element: the
    # finding's worst is that element, as the table's row says -- it read "['direction', 1, 2]"
    rng = np.random.default_rng(0)
    b = GraphBuilder("joint_symbolic")
    w, v = b.input("w", rng.uniform(-1, 1, (3, 6)), True), b.input("v", rng.uniform(-1, 1, (6, 2)), True)
    h = b.node("tanh", b.node("matmul", b.input("x", rng.uniform(-1, 1, (2, 3))), w))
    b.output(b.node("sum", b.node("tanh", b.node("matmul", h, v))))
    msg = b.build()
    opts = VerifyOptions(fd=FDOptions(mode="joint"))
    claims = {r.name: np.asarray(r.gradient).reshape(r.shape).copy() for r in verify(load_graph(msg), opts).parameters}
    claims["w"][1, 2] += 0.5
    claims["v"][0, 1] += 0.5
    report = verify(load_graph(with_claims(msg, claims_message(claims))), opts)
    rows = {r.name: r for r in report.parameters}
    assert rows["w"].fd.mode == "joint" and rows["w"].verdict_reference == "symbolic", report.to_text()
    found = {f.node: f for f in report.findings if f.severity == "error"}
    assert found["w"].worst.index == (1, 2) and "(worst [1, 2]:" in found["w"].detail, found["w"].detail
