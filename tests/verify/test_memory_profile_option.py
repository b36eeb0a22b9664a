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


def test_the_what_ifs_gradient_comparison_is_a_comparison_of_bytes():
    """checkpoint_gradients_equal compares bits: engine_run._same_bits is bytes equality (a large array's
    elements read as unsigned integers in place), -0.0 against 0.0 and NaN payloads included."""
    from gradcheck_svc.verify.engine_run import SAME_BITS_BY_BYTES, _same_bits

    rng = np.random.default_rng(0)
    big = rng.standard_normal((4 * SAME_BITS_BY_BYTES // 8 // 64, 64))  # a float32 copy and a strided half: larger too
    nan = big.copy()
    nan[3, 5] = np.nan
    payload = nan.copy()
    payload.view(np.uint64)[3, 5] ^= 1  # another NaN: equal as values to no one, different bits
    ulp = big.copy()
    ulp.view(np.uint64)[9, 9] ^= 1  # one element one ulp away
    zero = big.copy()
    zero[7, 1] = 0.0
    signed = zero.copy()
    signed[7, 1] = -0.0  # equal as values, different bits
    cases = [(big, big.copy()), (big, ulp), (nan, nan.copy()), (nan, payload), (zero, signed),
             (big.T, big.T.copy()), (big[:, ::2], big[:, ::2].copy()), (big.astype(np.float32), big.astype(np.float32)),
             (big.astype(np.float32), big.astype(np.float32) * np.float32(1.0000001)), (big[:4], big[:4].copy())]
    for a, b in cases:
        assert _same_bits(a, b) == (a.tobytes() == b.tobytes())
    assert [_same_bits(a, b) for a, b in cases[:5]] == [True, False, True, False, False]
