"""A corrupted cache deep in a chain flags every parameter upstream of it: the element-by-element follow-up
of the flagged parameters stays within its budget (joint_check.spare), and the rest are FAIL by their own
directional values, never a pass (issue 44 item 4). Counted from the report's rows, not timed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from gen_chain import chain  # noqa: E402

from gradcheck_svc.engine.faults import Fault  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.oracles.symbolic import SymbolicOptions  # noqa: E402
from gradcheck_svc.oracles.finite_diff import FiniteDifferences  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.joint_check import FOLLOW_UP_SHARE  # noqa: E402

LAYERS, FAULT = 12, "h10"  # the fault two layers from the loss: W0..W11 and b0..b10 read it on the way back


@pytest.fixture(scope="module")
def faulty():
    graph = load_graph(chain(LAYERS, width=8).build())
    # finite differences alone decide the rows (the symbolic gradient would decide every one exactly)
    report = verify(graph, VerifyOptions(faults=(Fault(FAULT, "scale", 2.0),), symbolic=SymbolicOptions(enabled=False)))
    return graph, report, {p["name"]: p for p in report.to_dict()["parameters"]}


def test_every_upstream_parameter_fails_and_the_fault_is_named(faulty):
    _, report, rows = faulty
    upstream = [f"W{i}" for i in range(LAYERS)] + [f"b{i}" for i in range(LAYERS - 1)]
    assert report.verdict == "fail"
    assert (FAULT, "cache_corruption") in [(f.node, f.cause) for f in report.findings if f.severity == "error"]
    assert {p: rows[p]["status"] for p in upstream} == {p: "FAIL" for p in upstream}
    assert rows[f"b{LAYERS - 1}"]["status"] == "ok"  # downstream of the fault


def test_follow_up_stays_within_its_budget(faulty):
    graph, _, rows = faulty
    by_screen = [r for r in rows.values() if r["fd_checked_by"] == "joint, by the screen"]
    followed = [r["name"] for r in rows.values() if r["fd_checked_by"] == "joint, then full"]
    assert by_screen and followed  # the budget spared some, the cheapest were checked element by element
    # a row decided by the screen alone: its own directional values, off by more than any gradient within
    # tolerance could be (its error allowance), no evaluations of its own
    for r in by_screen:
        assert not r["passed"] and r["fd_evaluations"] == 0 and r["max_abs_error"] > r["fd_error_at_worst"] > 0
    fd = FiniteDifferences(graph)
    budget = FOLLOW_UP_SHARE * fd.costs.joint_cost(fd.options.count)
    # the first is always followed up; beyond it, all of them within the budget
    assert len(followed) == 1 or sum(fd.full_cost(p) for p in followed) <= budget


@pytest.fixture(scope="module")
def mid_fault():
    """A 1% corruption of a cached activation in the middle of a 16-layer chain, as `--fault h8:scale:1.01`."""
    graph = load_graph(chain(16, width=8).build())
    return verify(graph, VerifyOptions(faults=(Fault("h8", "scale", 1.01),), symbolic=SymbolicOptions(enabled=False)))


def test_rows_next_to_a_deep_fault_are_decided_on_their_own_values(mid_fault):
    """The bisection splits first along the recorded corruption: the parameters downstream of it (their
    gradients do not read it) are checked together and end ok, never undecided for sharing a group with the
    affected ones; those upstream are never a pass."""
    rows = {p.name: p.status for p in mid_fault.parameters}
    errors = [f for f in mid_fault.findings if f.severity == "error"]
    assert mid_fault.verdict == "fail" and ("h8", "cache_corruption") in [(f.node, f.cause) for f in errors]
    # the saved h8 is read by tanh's backward (b8 and all before it) and by z9's (W9); nothing after reads it
    reached = {p for f in errors for p in f.parameters}
    assert reached == {f"W{i}" for i in range(10)} | {f"b{i}" for i in range(9)}
    assert {p: s for p, s in rows.items() if p not in reached} == {p: "ok" for p in rows if p not in reached}
    assert all(rows[p] in ("FAIL", "affected") for p in reached)
