"""checkpoint budget:BYTES on graphs with skip connections (engine/budget.py's DAG heuristic): a
residual network and a U-Net-like encoder-decoder, built with the real GraphBuilder and verified
through the real engine. The plan's predicted activation peak equals the measured one (within 5%),
it fits the budget, its gradients are those without checkpointing (the recompute fingerprint
check), and at sqrt's measured peak it recomputes no more than sqrt."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from graphs_memory import chain, mlp, residual

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


# chains and MLPs (the exact DP) and graphs with skip connections (the heuristic): one contract
GRAPHS = {"chain": lambda: chain(64, width=4, batch=3), "mlp_dropout": mlp, "mlp": lambda: mlp(dropout=False),
          "residual": lambda: residual(blocks=8), "unet": unet}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_a_budget_plan_predicts_its_peak_and_recomputes_no_more_than_sqrt(name):
    graph = GRAPHS[name]()
    plain, sqrt = _run(graph, "none"), _run(graph, "sqrt")
    everything = plain.memory["activations_peak_bytes"]
    at_sqrt = sqrt.memory["checkpoint_activations_peak_bytes"]
    # sqrt saves memory on all but the small MLP (its peak is one layer's): there the budgets below ask for a
    # real plan
    assert at_sqrt < everything or name == "mlp"
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
        assert len(m["checkpoint_kept"]) == m["checkpoint_kept_values"]
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


# --- plan-memory from shapes alone (engine/shape_meter.py) -----------------------------------------

def _plans(graph, **kw):
    """The plan from the metering forward and from shapes, or the error each gives."""
    from gradcheck_svc.verify.memory_plan import plan_memory

    out = []
    for shapes_only in (False, True):
        try:
            out.append(plan_memory(graph, optimizer="adam", shapes_only=shapes_only, **kw))
        except OptionError as exc:
            out.append(str(exc))
    return out


def _example_graphs():
    from conftest import EXAMPLES

    return sorted(p for p in EXAMPLES.glob("*.json") if p.stem != "inplace_relu")  # (in-place: refused by both)


@pytest.mark.parametrize("path", _example_graphs(), ids=lambda p: p.stem)
def test_a_plan_from_shapes_equals_the_metered_one(path):
    graph = load_graph(path)
    metered, from_shapes = _plans(graph)
    assert metered["planned_from"] == "metering forward" and from_shapes["planned_from"] == "shapes"
    assert {**metered, "planned_from": "shapes"} == from_shapes
    everything = metered["activations_peak_bytes"]
    for budget in (everything, everything * 2 // 3, everything // 3):
        a, b = _plans(graph, budget=budget)
        if isinstance(a, dict):
            a["planned_from"] = "shapes"
        assert a == b, budget


def test_plans_from_shapes_on_the_dag_graphs_and_on_its_own_over_max_run_bytes():
    from gradcheck_svc.verify.memory_plan import plan_memory

    for make in GRAPHS.values():
        graph = make()
        metered, from_shapes = _plans(graph, budget=2000)
        if isinstance(metered, dict):
            metered["planned_from"] = "shapes"
        assert metered == from_shapes
    graph = unet()
    assert plan_memory(graph)["planned_from"] == "metering forward"
    assert plan_memory(graph, max_run_bytes=1)["planned_from"] == "shapes"


def test_plan_memory_cli_from_shapes(tmp_path, capsys):
    import json

    from google.protobuf import json_format

    path = tmp_path / "unet.json"
    path.write_text(json_format.MessageToJson(unet(as_message=True)))
    assert cli.main(["plan-memory", str(path), "--format", "json", "--budget", "3000"]) == 0
    metered = json.loads(capsys.readouterr().out)
    assert cli.main(["plan-memory", str(path), "--format", "json", "--budget", "3000", "--shapes-only"]) == 0
    from_shapes = json.loads(capsys.readouterr().out)
    assert (metered["planned_from"], from_shapes["planned_from"]) == ("metering forward", "shapes")
    assert {**metered, "planned_from": "shapes"} == from_shapes
    assert cli.main(["plan-memory", str(path), "--max-run-bytes", "0", "--budget", "3000"]) == 0
    text = capsys.readouterr().out
    assert "from shapes, nothing run" in text and "steps recomputed (" in text
    assert cli.main(["plan-memory", str(path), "--max-run-bytes", "-1"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "--max-run-bytes" in err


LIGHT_RESNET50 = None
try:
    import onnx as _onnx

    LIGHT_RESNET50 = (Path(_onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx")
except ImportError:  # the onnx extra: required by the ONNX tests of this suite as well
    pass


def _resnet50():
    """ONNX's light ResNet-50 (weights made by ConstantOfShape: parameters with --params constants),
    imported with the element limit raised as `--max-elements` does (25.6M weights)."""
    from gradcheck.v1 import service_pb2

    from gradcheck_svc.limits import Limits
    from gradcheck_svc.onnx_import import import_onnx, options_from_proto
    from gradcheck_svc.onnx_import.folding import FoldBudget

    message = import_onnx(str(LIGHT_RESNET50), options_from_proto(service_pb2.OnnxImport(params="constants")),
                          budget=FoldBudget(max_elements=200_000_000))
    return load_graph(message, limits=Limits(max_elements=200_000_000))


@pytest.mark.skipif(LIGHT_RESNET50 is None, reason="needs the onnx extra")
def test_resnet50_is_planned_from_shapes_without_allocating_its_activations():
    import tracemalloc

    from gradcheck_svc.verify.memory_plan import plan_memory

    graph = _resnet50()
    tracemalloc.start()
    try:
        plan = plan_memory(graph, dtype="float32", optimizer="adam", budget=40_000_000, shapes_only=True)
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plan["planned_from"] == "shapes"
    assert plan["activations_peak_bytes"] > 80_000_000  # ~84 MB at batch 1, float32
    assert traced_peak < plan["activations_peak_bytes"] // 20, traced_peak  # nothing of that size was allocated
    assert plan["parameters_bytes"] == plan["gradients_bytes"] == 102_433_440  # 25.6M float32 weights
    assert plan["optimizer_bytes"] == 2 * plan["parameters_bytes"]
    assert plan["checkpoint_predicted_activations_peak_bytes"] <= 40_000_000
    assert plan["checkpoint_recomputed_steps"] > 0
    metered = plan_memory(graph, dtype="float32", optimizer="adam", budget=40_000_000)  # ... and it is exact
    assert metered["planned_from"] == "metering forward"
    assert {**metered, "planned_from": "shapes"} == plan
