"""A float32 gradient screened through the engine's float64 one (verify/stand_in.py): a correct float32 MLP with
65,536-element weights passes (it FAILED as undecided: its rounding, ~1e-7 relative in every element, projects
past the screen's per-direction floor), and what is wrong is still found -- a rule bug through the float64
gradient, an element of the float32 one off its float64 value by more than its tolerance through the gate."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from plants import element_bug, mlp, unregister

from gradcheck_svc.graph.ir import Claims
from gradcheck_svc.verify import verify
from gradcheck_svc.verify.compare import Tolerance
from gradcheck_svc.verify.joint_check import element_bounds

WIDTH, DEPTH = 256, 4  # the smallest MLP of the sweep whose correct float32 graph failed
SMALL = {"width": 64, "depth": 2}  # where a flagged weight's own check is cheap


@pytest.fixture(scope="module")
def float32_run():
    graph = mlp(width=WIDTH, depth=DEPTH, dtype="float32")
    return graph, verify(graph)


def test_a_correct_float32_mlp_passes_screened_through_its_float64_gradient(float32_run):
    graph, report = float32_run
    assert report.dtype == "float32" and report.verdict == "pass"
    assert all(p.status == "ok" and p.fd.screen.name == "CLEARED" for p in report.parameters)
    assert sorted(report.fd_plan.stand_in) == sorted(graph.parameters)
    assert "the screen judged the engine's float64 gradient in place of W0, b0, W1, b1, W2, b2 and 2 more where" \
        " each element is within its tolerance of it" in report.to_text()


def test_float32_claims_of_a_correct_mlp_pass_too(float32_run):
    _, report32 = float32_run
    graph = mlp(width=WIDTH, depth=DEPTH)
    claims = {p.name: np.asarray(p.gradient, dtype=np.float64) for p in report32.parameters}
    report = verify(dataclasses.replace(graph, claims=Claims(gradients=claims, adjoints={}, dtype="float32")))
    assert (report.subject, report.verdict) == ("claimed", "pass")
    assert sorted(report.fd_plan.stand_in) == sorted(graph.parameters)


def _bound(report, name: str, i: int) -> float:
    g = next(p for p in report.parameters if p.name == name).gradient
    return float(element_bounds(g, Tolerance.for_dtype("float32"))[i])


def test_a_rule_bug_in_a_float32_graph_is_still_found_and_named():
    clean = verify(mlp(dtype="float32", **SMALL))
    i = 64 * 64 // 3
    op = element_bug(10 * _bound(clean, "W1", i), i)  # one element, 10x its own bound: the screen's stated power
    try:
        report = verify(mlp(dtype="float32", bugs={"W1": op}, **SMALL))
    finally:
        unregister(op)
    assert "W1" in report.fd_plan.stand_in  # the bug is in the float64 gradient too: the screen saw it there
    assert report.verdict == "fail"
    assert [p.name for p in report.parameters if p.status != "ok"] == ["W1"]
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [("W1_bug", "rule_error")]


def test_a_float32_element_off_its_float64_value_keeps_its_own_value_in_the_screen():
    # float32 claims wrong where the float64 engine is right (a float32-only overflow, say): not hidden
    graph = mlp(**SMALL)
    clean = verify(mlp(dtype="float32", **SMALL))
    claims = {p.name: np.asarray(p.gradient, dtype=np.float64).copy() for p in clean.parameters}
    claims["W0"].reshape(-1)[1234] += 10 * _bound(clean, "W0", 1234)
    report = verify(dataclasses.replace(graph, claims=Claims(gradients=claims, adjoints={}, dtype="float32")))
    assert {"W0", "W1"} <= set(report.fd_plan.stand_in)  # W0's other elements stood in
    assert report.verdict == "fail"
    row = next(p for p in report.parameters if p.name == "W0")
    assert [p.name for p in report.parameters if p.status != "ok"] == ["W0"]
    assert np.unravel_index(1234, row.shape) == tuple(row.fd.comparison.worst_index)
