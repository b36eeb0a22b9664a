"""The memory profile's extra runs are made only when asked (issue 37 item 4): memory_profile on (the
default: the report's `memory` keeps every figure) or off (only the gradient run; `memory` empty), and
a memory output (a timeline, the plot, the page) turns it on."""
from __future__ import annotations

import json

import numpy as np
from conftest import EXAMPLES

from gradcheck_svc.cli import main as svc_main
from gradcheck_svc.graph import load_graph
from gradcheck_svc.verify import VerifyOptions
from gradcheck_svc.verify.engine_run import run_engine

CHAIN = EXAMPLES / "chain_256.json"


def test_off_makes_only_the_gradient_run_with_the_same_gradients():
    graph = load_graph(CHAIN)
    on = run_engine(graph, VerifyOptions(), "float64")
    off = run_engine(graph, VerifyOptions(memory_profile=False), "float64")
    assert on.memory["checkpoint_profile"] == "sqrt" and on.memory["inference_peak_bytes"] > 0
    assert off.memory == {} and off.timelines == {}
    assert on.gradients.keys() == off.gradients.keys()
    for name, g in on.gradients.items():
        assert g.tobytes() == off.gradients[name].tobytes(), name  # the same reported run, bit for bit


def test_a_timeline_turns_the_profile_on():
    run = run_engine(load_graph(CHAIN), VerifyOptions(memory_profile=False, memory_timeline=True), "float64")
    assert run.memory["inference_peak_bytes"] > 0 and run.timelines


def test_the_flag_reaches_the_report(capsys):
    seed = str(EXAMPLES / "seed.json")
    assert svc_main(["verify", seed, "--memory-profile", "off", "--format", "json"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert svc_main(["verify", seed, "--format", "json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert off["memory"] == {} and on["memory"]["training_peak_bytes"] > 0  # the default keeps the figures
    assert [p["gradient"] for p in off["parameters"]] == [p["gradient"] for p in on["parameters"]]
    assert np.isfinite(on["memory"]["inference_peak_bytes"])
