"""Decided or undecided, never a silent pass (issue 44): a value whose |engine - reference| exceeds the
tolerance plus the reference's own error bound is a confirmed mismatch however imprecise the reference;
a value no reference decides leaves its parameter undecided with the element named; the blame lands on
the parameter whose values disagree, never on correct ones. Planted single-element bugs (plants.py) sized
from each element's own bound; symbolic off (the MLPs are the case the issue met: over its budget)."""
import numpy as np
import pytest

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.finite_diff import FDOptions
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.compare import Tolerance

from plants import element_bound, element_bug, mlp, unregister


def fd_only(mode="auto"):
    return VerifyOptions(symbolic=SymbolicOptions(enabled=False), fd=FDOptions(mode=mode))


def errors(report):
    return [(f.node, f.cause) for f in report.findings if f.severity == "error"]


def planted_mlp(target: str, pick, times: float, mode: str, **kw):
    """The MLP with parameter `target`'s element pick(gradient) wrong by `times` its own bound (its
    tolerance plus the first pass's rounding): (clean report, planted report, flat index)."""
    clean = mlp(width=16, depth=3, **kw)
    report = verify(clean, fd_only(mode))
    g = next(p for p in report.parameters if p.name == target).gradient
    i = int(pick(np.abs(g)))
    bound = element_bound(g, Tolerance.for_dtype("float64"), report.loss, clean.inputs[target].value)[i]
    bug = element_bug(times * bound, i)
    try:
        return report, verify(mlp(width=16, depth=3, bugs={target: bug}, **kw), fd_only(mode)), i
    finally:
        unregister(bug)


@pytest.mark.parametrize("mode", ["full", "joint"])
@pytest.mark.parametrize("case", [
    # loss + 1e4: rounding ~1e-6 swamps W1's smallest gradient; the issue's 267k-parameter MLP passed so
    ("large-loss", "W1", np.argmin, dict(offset=1e4)),
    # gradients ~1e-9 under a loss of ~100: the estimate's bound is larger than the value itself
    ("vanishing", "W0", np.argmax, dict(scale=1e-9, offset=100.0)),
], ids=lambda c: c[0] if isinstance(c, tuple) else c)
def test_an_element_off_by_30x_its_bound_fails_at_its_own_parameter(case, mode):
    _, target, pick, kw = case
    clean, report, i = planted_mlp(target, pick, 30.0, mode, **kw)
    assert clean.verdict == "pass" and not errors(clean), clean.to_text()
    assert report.verdict == "fail", report.to_text()
    assert errors(report) == [(f"{target}_bug", "rule_error")], report.to_text()
    status = {p.name: p.status for p in report.parameters}
    assert status[target] == "FAIL" and all(s == "ok" for n, s in status.items() if n != target), status
    # nothing says the planted element was "not counted as a mismatch"
    assert not [f for f in report.findings if f.cause == "fd_undecidable"], report.to_text()


def sqrt_and_tanh(bug=None):
    """L = sum(w * sqrt(x)) + sum(v * tanh(z)): x[0] = 1e-300 no step of the ladder resolves; z is plain."""
    b = GraphBuilder("undecidable_beside_a_plain_one")
    x = b.input("x", np.array([1e-300, 4.0]), True)
    if bug is not None:
        x = b.node(bug, x, name="x_bug")
    y = b.node("mul", b.node("sqrt", x), b.input("w", np.array([0.5, 1.5])))
    t = b.node("mul", b.node("tanh", b.input("z", np.array([0.3, -0.8, 1.1]), True)),
               b.input("v", np.array([1.0, 2.0, -0.5])))
    b.output(b.node("add", b.node("sum", y), b.node("sum", t), name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("planted", [False, True], ids=["right", "wrong-by-1e140"])
def test_a_value_nothing_decides_is_undecided_named_never_a_pass(planted):
    """Right or wrong at x[0], finite differences cannot tell: the verdict is not a pass, x is undecided
    with element [0] named, and the correct z stays ok (the blame is not spread)."""
    bug = element_bug(1e140, 0) if planted else None
    try:
        report = verify(sqrt_and_tanh(bug), fd_only())
    finally:
        if bug:
            unregister(bug)
    assert report.verdict == "fail", report.to_text()
    assert errors(report) == [("x", "fd_unresolved")], report.to_text()
    (f,) = [f for f in report.findings if f.severity == "error"]
    assert f.worst.index == (0,) and f.parameters == ["x"]
    status = {p.name: p.status for p in report.parameters}
    assert status == {"x": "undecided", "z": "ok"}, status
    assert "undecided" in report.to_text()
