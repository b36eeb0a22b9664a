"""checkpoint budget:BYTES on graphs with skip connections (engine/budget.py's DAG heuristic): a
residual network and a U-Net-like encoder-decoder, built with the real GraphBuilder and verified
through the real engine. The plan's predicted activation peak equals the measured one (within 5%),
it fits the budget, its gradients are those without checkpointing (the recompute fingerprint
check), and at sqrt's measured peak it recomputes no more than sqrt."""
from __future__ import annotations

import re

import numpy as np
import pytest
from graphs_memory import residual

from gradcheck_svc import cli
from gradcheck_svc.errors import OptionError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import VerifyOptions
from gradcheck_svc.verify.engine_run import run_engine


def unet(levels: int = 3, width: int = 4, batch: int = 3, seed: int = 3, as_message: bool = False):
    """Encoder e_k = tanh(e_{k-1} @ W_k) (two layers per level), a bottleneck, and a decoder whose
    level k reads concat(d_{k+1}, e_k): every encoder output is read again at the far end."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("unet")
    h = b.input("x", rng.uniform(-1, 1, size=(batch, width)), requires_grad=True)

    def layer(h, name, fan_in):
        w = b.input(f"W_{name}", rng.standard_normal((fan_in, width)) / np.sqrt(fan_in), requires_grad=True)
        return b.node("tanh", b.node("matmul", h, w, name=f"mm_{name}"), name=name)

    skips = []
    for k in range(levels):
        h = layer(layer(h, f"enc{k}a", width), f"enc{k}", width)
        skips.append(h)
    h = layer(h, "bottleneck", width)
    for k in reversed(range(levels)):
        h = layer(b.node("concat", h, skips[k], name=f"cat{k}", axis=-1), f"dec{k}a", 2 * width)
        h = layer(h, f"dec{k}", width)
    b.output(b.node("sum", b.node("square", h, name="sq"), name="loss"))
    return b.build() if as_message else load_graph(b.build())


def _run(graph, policy):
    return run_engine(graph, VerifyOptions(checkpoint=policy), "float64")


GRAPHS = {"residual": lambda: residual(blocks=8), "unet": unet}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_a_dag_budget_plan_predicts_its_peak_and_recomputes_no_more_than_sqrt(name):
    graph = GRAPHS[name]()
    plain, sqrt = _run(graph, "none"), _run(graph, "sqrt")
    everything = plain.memory["activations_peak_bytes"]
    at_sqrt = sqrt.memory["checkpoint_activations_peak_bytes"]
    assert at_sqrt < everything  # sqrt does save memory here: the budgets below ask for a real plan
    for budget in (everything, at_sqrt, (at_sqrt + everything) // 2):
        run = _run(graph, f"budget:{budget}")
        m = run.memory
        measured, predicted = m["checkpoint_activations_peak_bytes"], m["checkpoint_predicted_activations_peak_bytes"]
        assert measured <= budget and predicted <= budget
        assert measured == pytest.approx(predicted, rel=0.05), (budget, predicted, measured)
        assert m["checkpoint_gradients_equal"] is True
        assert not run.findings
        for p in plain.gradients:  # bit for bit those without checkpointing
            assert np.array_equal(plain.gradients[p], run.gradients[p])
        recomputed = m["checkpoint_op_evaluations"] - plain.memory["op_evaluations"]
        assert m["checkpoint_recomputed_steps"] == recomputed
        assert m["checkpoint_budget_method"]
        if budget == at_sqrt:  # at equal memory, no more recomputation than sqrt's
            assert m["checkpoint_op_evaluations"] <= sqrt.memory["checkpoint_op_evaluations"]
        if budget == everything:  # everything fits: nothing recomputed
            assert recomputed == 0


def test_the_dag_heuristic_beats_uniform_segments_somewhere():
    """The DP is not only a fallback to every:K: on the U-Net, between sqrt's peak and no
    checkpointing, some budget is met with less recomputation than any uniform plan that fits."""
    graph = unet(levels=4)
    plain, sqrt = _run(graph, "none").memory, _run(graph, "sqrt").memory
    methods = set()
    lo, hi = sqrt["checkpoint_activations_peak_bytes"], plain["activations_peak_bytes"]
    for budget in np.linspace(lo, hi, 6)[1:-1].astype(int):
        m = _run(graph, f"budget:{budget}").memory
        assert m["checkpoint_activations_peak_bytes"] <= budget
        methods.add(m["checkpoint_budget_method"].split(" ")[0])
    assert "DAG" in methods, methods


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_an_infeasible_dag_budget_names_the_smallest_feasible_one(name, tmp_path, capsys):
    from google.protobuf import json_format

    message = residual(blocks=8, as_message=True) if name == "residual" else unet(as_message=True)
    path = tmp_path / f"{name}.json"
    path.write_text(json_format.MessageToJson(message))
    assert cli.main(["verify", str(path), "--checkpoint", "budget:10", "--fd", "projection"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("gradcheck-svc: error: checkpoint: budget:10: no plan keeps the activations under 10")
    smallest = int(re.search(r"the smallest feasible budget is (\d+) bytes", err).group(1))
    graph = load_graph(path)
    m = _run(graph, f"budget:{smallest}").memory  # ... it is feasible
    assert m["checkpoint_activations_peak_bytes"] <= smallest
    with pytest.raises(OptionError, match=f"smallest feasible budget is {smallest} bytes"):
        _run(graph, f"budget:{smallest - 1}")
