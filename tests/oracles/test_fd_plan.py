"""The finite-difference plan (oracles/fd_plan.py, issue 32 item 3): one plan without cliffs, stated in the report.

Counts, never timings: the plan's cost is the values its first pass evaluates (the cost model's count, a
full check's copies measured on one sliced copy) and its perturbed forwards. Over a size sweep -- the seed,
then MLPs and CNNs growing in width, depth and channels -- that cost never drops as the graph grows (the
old absolute budget checked an MLP of depth 8 in full at ~8,000 forwards of the graph and one of depth 16
jointly at 32), stays within (1 + JOINT_FULL_SHARE) 2k forwards of the whole graph (linear in the graph's
work, parameters x forward cost), and no mode costs per parameter 20x what the joint screen does."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import forward_batched
from gradcheck_svc.graph import load_graph
from gradcheck_svc.oracles.fd_plan import JOINT_FULL_SHARE
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.verify import VerifyOptions, verify
from grpc_helpers import EXAMPLES
from plants import cnn as plants_cnn
from plants import mlp


def cnn(channels: int, size: int = 8, batch: int = 2):
    """plants.cnn with `channels` filters in each conv."""
    return plants_cnn(channels, channels, batch, size, seed=channels, name=f"cnn{channels}")


def seed():
    return load_graph(EXAMPLES / "seed.json")


# each sweep grows both the parameters and the forward's values, so the graph's work grows at every step
SWEEPS = {
    "mlp width": [seed] + [lambda w=w: mlp(width=w, depth=2) for w in (4, 8, 16, 32, 64, 128)],
    "mlp depth": [seed] + [lambda d=d: mlp(width=64, depth=d) for d in (2, 4, 8, 16)],
    "cnn channels": [seed] + [lambda c=c: cnn(c) for c in (2, 4, 8, 16)],
}


def _plans(sweep):
    out = []
    for make in SWEEPS[sweep]:
        fd = FiniteDifferences(make())
        params = sum(fd.costs.size(p) for p in fd.program.params)
        out.append((fd, params * fd.plan.forward_values))
    return out


@pytest.mark.parametrize("sweep", SWEEPS)
def test_the_plans_cost_grows_monotonically_and_at_most_linearly_with_the_graphs_work(sweep):
    plans = _plans(sweep)
    work = [w for _, w in plans]
    assert all(a < b for a, b in zip(work, work[1:])), work  # the sweep really grows
    values = [fd.plan.values for fd, _ in plans]
    assert all(a <= b for a, b in zip(values, values[1:])), values
    forwards = [fd.plan.whole_graph_evaluations for fd, _ in plans]
    k = FDOptions().count  # the plan's cap: the screen may choose fewer (joint_check.joint_k), never more
    assert all(f <= 2 * k * (1 + JOINT_FULL_SHARE) for f in forwards), forwards
    # the sweep spans both plans: the seed in full, the largest graph screened jointly
    assert plans[0][0].plan.counts() == {"full": 2} and "joint" in plans[-1][0].plan.counts()


@pytest.mark.parametrize("sweep", SWEEPS)
def test_no_mode_costs_per_parameter_twenty_times_the_joint_screens(sweep):
    for fd, _ in _plans(sweep):
        modes = fd.plan.modes
        k = fd.plan.directions
        per_tensor_joint = fd.costs.joint_cost(k) / max(1, sum(m == "joint" for m in modes.values()) or len(modes))
        full = [fd.costs.full_cost(p) for p, m in modes.items() if m == "full"]
        assert all(c <= 20 * per_tensor_joint for c in full), (fd.graph.name, max(full), per_tensor_joint)


def test_the_report_states_the_plan_and_its_cost():
    report = verify(seed())
    plan = report.to_dict()["fd_plan"]
    # w and x, one element each: one complex-step copy each (two real values' worth), of the 5 values downstream
    # of them (z, a, L: 3 for w's copies and x's alike, sliced to what each copy changes)
    assert plan["mode"] == "auto" and plan["parameters"] == {"full": 2} and plan["forwards"] == 2
    assert plan["method"] == {"w": "complex", "x": "complex"} and plan["method_fallback"] == {}
    assert plan["values"] == sum(FiniteDifferences(seed()).costs.full_cost(p) for p in ("w", "x"))
    assert plan["whole_graph_evaluations"] == pytest.approx(plan["values"] / plan["forward_values"], rel=1e-3)
    assert sum(r["fd_evaluations"] for r in report.to_dict()["parameters"]) == plan["forwards"]
    assert "  finite-difference plan: auto: 2 full; first pass 2 perturbed forwards" in report.to_text()
    assert "2 by complex step" in report.to_text()
    json.loads(report.to_json())  # plain JSON


def test_a_jointly_screened_graphs_plan_counts_the_screens_forwards():
    report = verify(mlp(width=64, depth=8), VerifyOptions(fd=FDOptions(directions=8)))
    plan = report.to_dict()["fd_plan"]
    # 8 complex-step copies, two real values' worth each
    assert plan["parameters"] == {"joint": 16} and plan["directions"] == 8 and plan["forwards"] == 8
    assert 15.9 < plan["whole_graph_evaluations"] <= 16.0  # 16 copies' values of the graph downstream of W0
    rows = report.to_dict()["parameters"]
    assert {r["fd_checked_by"] for r in rows} == {"joint"} and report.verdict == "pass"
    # what the screen spent: the planned first pass, plus any refinement (never less)
    assert all(r["fd_evaluations"] >= plan["forwards"] for r in rows)
    assert plan["directions_why"] == "as the option directions asks"  # exactly 8, the power not consulted
    assert ("finite-difference plan: auto: 16 joint (8 directions: as the option directions asks); first pass 8 "
            "perturbed forwards") in report.to_text()


def test_a_copys_live_bytes_bound_what_the_batched_forward_holds():
    """Costs.live_row_bytes sizes the joint chunks and a full check's first chunk: for any set of
    parameters perturbed together it is at least the bytes per copy forward_batched measures it holding
    at once (its peak_bytes, the copies included), on a CNN whose values branch and join."""
    fd = FiniteDifferences(cnn(4))
    params = list(fd.program.params)
    groups = [[p] for p in params] + [params, params[::2], params[1::2], params[len(params) // 2:]]
    for group in groups:
        stats = {}
        forward_batched(fd.program, NUMPY, fd.base, {p: np.repeat(np.asarray(fd.base[p])[None], 2, axis=0)
                                                     for p in group}, stats, frozen=fd.frozen)
        assert fd.costs.live_row_bytes(group) >= stats["peak_bytes"] > 0, group


def test_a_recorded_base_forward_is_made_only_when_one_of_its_values_is_read():
    """A split's merge takes the shards' base forward (finite_diff.BaseRecord, through JSON as a shard file holds
    it): the same loss and plan, the graph's inputs at hand, no forward made until a value of it is read -- then
    made, and its loss handed to the record's check (the merge refuses one that differs)."""
    from gradcheck_svc.oracles.finite_diff import BaseRecord

    graph = cnn(2, size=6, batch=1)
    fd = FiniteDifferences(graph)
    made = []
    rec = json.loads(json.dumps({"plan": fd.record.plan, "lacking": fd.record.lacking}))
    taken = FiniteDifferences(graph, recorded=BaseRecord(fd.loss, rec["plan"], rec["lacking"], check=made.append))
    assert taken.loss == fd.loss and taken.plan == fd.plan and taken.plan.to_dict() == fd.plan.to_dict()
    assert all(np.array_equal(taken.base[p], fd.base[p]) for p in graph.parameters)
    assert taken.costs.joint_cost(4) == fd.costs.joint_cost(4) and made == []
    step = taken.program.steps[0].name
    assert np.array_equal(taken.base[step], fd.base[step]) and made == [fd.loss]
    assert dict(taken.frozen).keys() == fd.frozen.keys() and made == [fd.loss]  # one forward
