"""One memory accounting (issue 26): every figure defined once, every output reading the same numbers.

The text report, the JSON report, the HTML page and the --memory-plot SVG agree for every bundled
example; each run's live peak is the maximum of its timeline and splits exactly into data,
parameters, activations, gradients and transients; training (the live peak plus the optimizer's
state) is never below inference; under a checkpoint policy the un-checkpointed run's timeline is
replayed through its whole backward, step for step what the real run holds.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from conftest import EXAMPLES
from gradcheck_core.outputs.html_report import RunItem, build_html
from graphs_memory import chain, mlp, residual

from gradcheck_svc import cli
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.memory_profile import write_memory_plot

EXAMPLE_PATHS = sorted(EXAMPLES.glob("*.json"))
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def _text_figure(text: str, pattern: str) -> float:
    """A byte figure of the text report, e.g. 'training 1.06 kB' -> 1060.0."""
    m = re.search(pattern + r" ([0-9.]+) (B|kB|MB|GB)\b", text)
    assert m, (pattern, text)
    return float(m.group(1)) * UNITS[m.group(2)]


def _agrees(shown: float, exact: int) -> bool:
    """The text rounds to 3 significant digits."""
    return shown == pytest.approx(exact, rel=5e-3, abs=0.5)


def _check_accounting(m: dict, timelines: dict, inplace: bool = False) -> None:
    parts = m["data_bytes"] + m["parameters_bytes"] + m["peak_activations_bytes"] + m["peak_gradients_bytes"]
    assert m["peak_transient_bytes"] >= 0 and m["inference_transient_bytes"] >= 0
    assert m["live_peak_bytes"] == parts + m["peak_transient_bytes"]
    assert m["training_peak_bytes"] == m["live_peak_bytes"] + m["optimizer_bytes"]
    assert m["inference_peak_bytes"] == m["data_bytes"] + m["parameters_bytes"] + m["inference_transient_bytes"]
    assert m["inference_peak_bytes"] <= m["live_peak_bytes"] <= m["training_peak_bytes"]
    assert m["peak_activations_bytes"] <= m["activations_peak_bytes"]
    assert m["peak_gradients_bytes"] <= m["gradients_bytes"]
    by_node = sum(d["bytes"] for d in m["activations_by_node"])
    # what is held when backward begins: the activation peak, unless an in-place write swapped a
    # saved buffer for one counted already (inplace_relu)
    assert by_node == m["activations_peak_bytes"] if not inplace else by_node <= m["activations_peak_bytes"]
    # live peak = the maximum over the timeline, for every run
    assert max(timelines["none"]["peak_bytes"]) == m["live_peak_bytes"]
    assert timelines["none"]["steps"][timelines["none"]["peak_bytes"].index(m["live_peak_bytes"])] == m["peak_step"]
    assert max(timelines["inference"]["peak_bytes"]) == m["inference_peak_bytes"]
    if "checkpoint_profile" in m:
        assert max(timelines[m["checkpoint_profile"]]["peak_bytes"]) == m["checkpoint_live_peak_bytes"]
    for t in timelines.values():  # the most held during a step is at least what is held after it
        assert all(h >= v for h, v in zip(t["peak_bytes"], t["live_bytes"], strict=True))


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda p: p.name)
def test_text_json_html_and_svg_agree(path, tmp_path):
    graph = load_graph(path)
    options = VerifyOptions(memory_timeline=True, optimizer="adam", optimizer_dtype="float32")
    # the default --fd (the memory figures do not depend on the oracles; the cheapest check of chain_256)
    report = verify(graph, options)
    d = report.to_dict()
    m = d["memory"]
    timelines = {t["run"]: t for t in d["memory_timelines"]}
    _check_accounting(m, timelines, inplace=any(n.inplace for n in graph.nodes))
    elements = sum(np.asarray(graph.inputs[p].value).size for p in graph.parameters)
    assert m["optimizer_bytes"] == 2 * 4 * elements and m["optimizer"] == "adam"

    text = report.to_text()
    for pattern, key in (("training", "training_peak_bytes"), ("inference", "inference_peak_bytes"),
                         ("live peak", "live_peak_bytes"), ("activations peak", "activations_peak_bytes")):
        assert _agrees(_text_figure(text, pattern), m[key]), (pattern, m[key], text)
    line = next(x for x in text.splitlines() if "memory: training" in x)
    for name, key in (("data", "data_bytes"), ("params", "parameters_bytes"), ("grads", "peak_gradients_bytes"),
                      ("optimizer", "optimizer_bytes"), ("activations", "peak_activations_bytes"),
                      ("transients", "peak_transient_bytes")):
        shown = float(re.search(rf"\b{name} ([0-9.]+)", line).group(1))
        unit = UNITS[re.search(r"training [0-9.]+ (B|kB|MB|GB)", line).group(1)]
        assert _agrees(shown * unit, m[key]), (name, line)

    page = build_html([RunItem(path.name, None, d)])
    for key in ("training_peak_bytes", "live_peak_bytes", "inference_peak_bytes", "optimizer_bytes"):
        assert re.search(rf"<text x='0' y='13'>{key}</text>.*?>{m[key]} B</text>", page), key
    legend = dict(re.findall(r"<span style='border-color:#[0-9a-f]+'>([^<:]+): peak (\d+) B</span>", page))
    assert int(legend["none"]) == m["live_peak_bytes"] and int(legend["inference"]) == m["inference_peak_bytes"]
    assert page.count("class='bar'") >= len(m["activations_by_node"][:20])

    svg = tmp_path / "mem.svg"
    write_memory_plot(svg, report.to_dict())
    root = ET.parse(svg).getroot()
    labels = [e.text or "" for e in root.iter() if e.tag.endswith("text")]
    assert f"no checkpointing: peak {m['live_peak_bytes']} B" in labels
    assert f"inference (no grad): peak {m['inference_peak_bytes']} B" in labels
    if "checkpoint_profile" in m:
        assert f"{m['checkpoint_profile']} checkpointing: peak {m['checkpoint_live_peak_bytes']} B" in labels
    assert any(f"training peak {m['training_peak_bytes']} B" in t for t in labels)
    bars = [e for e in root.iter() if e.tag.endswith("g") and e.get("class") == "bar"]
    assert len(bars) == min(20, len(m["activations_by_node"]))


def test_the_seed_graph_figures_and_cli(tmp_path, capsys):
    """w, x (parameters) and four: z = w*x, a = z^2, L = a/4, all float64 scalars (8 B each)."""
    svg, page = tmp_path / "seed.svg", tmp_path / "seed.html"
    path = str(EXAMPLES / "seed.json")
    assert cli.main(["verify", path, "--format", "json", "--optimizer", "momentum", "--memory-plot", str(svg),
                     "--html", str(page)]) == 0
    import json

    m = json.loads(capsys.readouterr().out)["memory"]
    assert (m["data_bytes"], m["parameters_bytes"], m["gradients_bytes"]) == (8, 16, 16)
    assert m["optimizer_bytes"] == 16 and m["optimizer_dtype"] == "float64"  # one float64 buffer per parameter
    assert m["activations_peak_bytes"] == 16  # z (saved by a) and a (saved by L)
    assert m["activations_by_node"] == [{"node": "a", "op": "square", "bytes": 8},
                                        {"node": "L", "op": "div", "bytes": 8}]
    assert (m["live_peak_bytes"], m["inference_peak_bytes"], m["training_peak_bytes"]) == (64, 40, 80)
    labels = [e.text for e in ET.parse(svg).getroot().iter() if e.tag.endswith("text")]
    assert "no checkpointing: peak 64 B" in labels and "inference (no grad): peak 40 B" in labels
    html = page.read_text()
    assert "none: peak 64 B" in html and "inference: peak 40 B" in html
    assert cli.main(["verify", path]) == 0
    text = capsys.readouterr().out
    assert "memory: training 64 B = data 8 + params 16 + grads" in text and "inference 40 B" in text
    assert "live peak 64 B" in text and "activations by node (top 2, B): a (square) 8, L (div) 8" in text


@pytest.mark.parametrize("graph", [chain(12, width=4, batch=3), mlp(), residual()], ids=["chain", "mlp", "residual"])
def test_the_replayed_backward_is_the_real_run(graph):
    """Under a policy the un-checkpointed run is not made: its timeline (the metering forward, then
    the backward replayed from the checkpointed run) is step for step the real run's."""
    real = verify(graph, VerifyOptions(memory_timeline=True, localize=False))
    replayed = verify(graph, VerifyOptions(memory_timeline=True, checkpoint="sqrt", localize=False))
    a, b = (list(r.timelines["none"]) for r in (real, replayed))
    assert [m.label for m in a] == [m.label for m in b]
    assert any(m.label.startswith("backward ") for m in b)  # the whole forward+backward
    assert [tuple(m)[1:] for m in a] == [tuple(m)[1:] for m in b]
    for key in ("live_peak_bytes", "peak_step", "peak_activations_bytes", "peak_gradients_bytes",
                "peak_transient_bytes", "activations_peak_bytes", "activations_by_node", "training_peak_bytes"):
        assert real.memory[key] == replayed.memory[key], key
    # the policy's own run is the real one in both, and lower
    assert real.memory["checkpoint_live_peak_bytes"] == replayed.memory["checkpoint_live_peak_bytes"]
    assert replayed.memory["checkpoint_activations_peak_bytes"] < replayed.memory["activations_peak_bytes"]


def test_activation_bytes_by_node_and_the_top_n():
    """x (100 float64, a parameter) -> a = tanh(x) -> ... -> sum: each tanh saves its output (800 B)."""
    b = GraphBuilder("tanhs")
    h = b.input("x", np.linspace(-1, 1, 100), requires_grad=True)
    for k in range(7):
        h = b.node("tanh", h, name=f"t{k}")
    b.output(b.node("sum", b.node("mul", h, b.input("two", np.full(100, 2.0))), name="L"))
    report = verify(load_graph(b.build()))
    m = report.memory
    nodes = m["activations_by_node"]
    assert [d["node"] for d in nodes] == [f"t{k}" for k in range(7)]  # mul saves only its inputs: t6 and two
    assert all(d["bytes"] == 800 and d["op"] == "tanh" for d in nodes)
    assert m["activations_peak_bytes"] == 7 * 800 and m["data_bytes"] == 800 and m["parameters_bytes"] == 800
    (line,) = [x for x in report.to_text().splitlines() if "activations by node" in x]
    assert "(top 5 of 7, kB)" in line and line.count("(tanh) 0.8") == 5


@pytest.mark.parametrize("optimizer, per_element", [("none", 0), ("sgd", 0), ("momentum", 4), ("adam", 8),
                                                    ("adamw", 8)])
def test_optimizer_state_in_the_training_figure(optimizer, per_element):
    graph = mlp(dropout=False)
    m = verify(graph, VerifyOptions(optimizer=optimizer, optimizer_dtype="float32", localize=False)).memory
    elements = sum(np.asarray(graph.inputs[p].value).size for p in graph.parameters)
    assert m["optimizer_bytes"] == per_element * elements
    assert m["training_peak_bytes"] == m["live_peak_bytes"] + per_element * elements


def test_bad_optimizer_options_are_one_line_errors(capsys):
    path = str(EXAMPLES / "seed.json")
    for flags in (["--optimizer", "lion"], ["--optimizer-dtype", "int8"]):
        with pytest.raises(SystemExit) as info:
            cli.main(["verify", path, *flags])
        assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--optimizer" in err[0] and "'lion'" in err[0] and "'int8'" in err[1]
    from gradcheck_svc.errors import OptionError

    with pytest.raises(OptionError, match="unknown optimizer 'lion'"):
        verify(load_graph(path), VerifyOptions(optimizer="lion"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from grpc_helpers import module_server

    yield from module_server(tmp_path_factory, "--workers", "1")


def test_the_optimizer_and_the_figures_through_grpc(server):
    import grpc
    from gradcheck.v1 import service_pb2, service_pb2_grpc
    from gradcheck_client import Client
    from grpc_helpers import seed_graph

    with Client(server.target, timeout=60) as c:
        report = c.verify(seed_graph(), optimizer="adam", optimizer_dtype="float32", memory_timeline=True)
    m = report.memory
    assert m["optimizer"] == "adam" and int(m["optimizer_bytes"]) == 2 * 4 * 2
    assert int(m["training_peak_bytes"]) == int(m["live_peak_bytes"]) + 16
    assert [d["node"] for d in m["activations_by_node"]] == ["a", "L"]
    none = next(t for t in report.data["memory_timelines"] if t["run"] == "none")
    assert max(int(b) for b in none["peak_bytes"]) == int(m["live_peak_bytes"])
    channel = grpc.insecure_channel(server.target)
    try:
        stub = service_pb2_grpc.GradCheckServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Verify(service_pb2.VerifyRequest(graph=seed_graph(), options=service_pb2.VerifyOptions(
                optimizer="lion")), timeout=30)
    finally:
        channel.close()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("optimizer:") and "\n" not in info.value.details()


# --- checkpoint budget:BYTES (engine/budget.py) ------------------------------------------------------


def _run(graph, policy):
    from gradcheck_svc.verify.engine_run import run_engine

    return run_engine(graph, VerifyOptions(checkpoint=policy), "float64")


def test_an_infeasible_budget_names_the_smallest_feasible_one(tmp_path, capsys):
    graph_path = tmp_path / "chain.json"
    from google.protobuf import json_format
    from graphs_memory import _chain

    graph_path.write_text(json_format.MessageToJson(_chain(16, 4, 3).build()))
    assert cli.main(["verify", str(graph_path), "--checkpoint", "budget:10", "--fd", "projection"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    smallest = int(re.search(r"the smallest feasible budget is (\d+) bytes", err).group(1))
    assert err.startswith("gradcheck-svc: error: checkpoint: budget:10: no plan keeps the activations under 10")
    m = _run(load_graph(graph_path), f"budget:{smallest}").memory  # ... and it is feasible
    assert m["checkpoint_activations_peak_bytes"] <= smallest
    from gradcheck_svc.errors import OptionError

    with pytest.raises(OptionError, match="smallest feasible budget"):
        _run(load_graph(graph_path), f"budget:{smallest - 1}")


def test_budget_refuses_what_it_cannot_plan(capsys):
    from gradcheck_svc.errors import OptionError

    with pytest.raises(OptionError, match="budget:BYTES needs a positive integer"):
        _run(residual(), "budget:lots")


def test_plan_memory_predicts_what_verify_measures(tmp_path, capsys):
    import json

    from google.protobuf import json_format
    from graphs_memory import _chain

    path = tmp_path / "chain.json"
    path.write_text(json_format.MessageToJson(_chain(24, 4, 3).build()))
    graph = load_graph(path)
    plain = _run(graph, "none").memory
    budget = (plain["activations_peak_bytes"] * 2) // 5
    run = verify(graph, VerifyOptions(checkpoint=f"budget:{budget}", optimizer="adam", localize=False)).memory
    assert cli.main(["plan-memory", str(path), "--budget", str(budget), "--optimizer", "adam", "--format",
                     "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for key in ("data_bytes", "parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes",
                "activations_by_node", "checkpoint_predicted_activations_peak_bytes", "checkpoint_kept"):
        assert plan[key] == run[key], key
    assert plan["checkpoint_predicted_activations_peak_bytes"] == run["checkpoint_activations_peak_bytes"]
    assert plan["formula_training_bytes"] == sum(plan[k] for k in (
        "data_bytes", "parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes"))
    assert cli.main(["plan-memory", str(path), "--budget", str(budget)]) == 0
    text = capsys.readouterr().out
    assert "memory plan" in text and "(predicted)" in text and "activations by node" in text
    assert cli.main(["plan-memory", str(path), "--budget", "1"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "smallest feasible budget is" in err
