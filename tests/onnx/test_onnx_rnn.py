"""LSTM, GRU and RNN nodes, unrolled by the importer, against ONNX's reference evaluator: every
output (Y, Y_h, Y_c) in every direction and layout, with initial states, biases, peepholes and GRU's
linear_before_reset, in float64. (Their gradients against torch: tests/onnx/test_model_zoo.py.)"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx_helpers import engine_values, onnx

from gradcheck_svc.errors import GradcheckError
from gradcheck_svc.onnx_import.importer import ImportOptions, import_model

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(kind, layout=0, direction="forward", init=True, peep=False, **attrs):
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nd = 2 if direction == "bidirectional" else 1
    s, b, i, h, g = 3, 2, 3, 4, GATES[kind]
    ins = {"X": rng.standard_normal((b, s, i) if layout else (s, b, i)),
           "W": 0.5 * rng.standard_normal((nd, g * h, i)), "R": 0.5 * rng.standard_normal((nd, g * h, h)),
           "B": 0.5 * rng.standard_normal((nd, 2 * g * h))}
    names = ["X", "W", "R", "B", ""]
    if init:
        state = (b, nd, h) if layout else (nd, b, h)
        names.append("h0")
        ins["h0"] = rng.standard_normal(state)
        if kind == "LSTM":
            names.append("c0")
            ins["c0"] = rng.standard_normal(state)
    if peep:
        names += [""] * (7 - len(names)) + ["P"]
        ins["P"] = rng.standard_normal((nd, 3 * h))
    outs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    node = helper.make_node(kind, names, outs, hidden_size=h, layout=layout, direction=direction, **attrs)
    graph = helper.make_graph([node], "rnn",
                              [helper.make_tensor_value_info(n, TensorProto.DOUBLE, v.shape) for n, v in ins.items()],
                              [helper.make_tensor_value_info(o, TensorProto.DOUBLE, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), ins, outs


CONFIGS = [dict(kind=k, layout=lay, direction=d) for k, lay, d in
           itertools.product(GATES, (0, 1), ("forward", "reverse", "bidirectional"))]
CONFIGS += [dict(kind="GRU", direction="bidirectional", linear_before_reset=1),
            dict(kind="GRU", layout=1, linear_before_reset=1, init=False),
            dict(kind="LSTM", direction="bidirectional", peep=True), dict(kind="LSTM", init=False)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_unrolled_rnn_matches_onnx_reference(config):
    from onnx.reference import ReferenceEvaluator

    model, ins, outs = _model(**config)
    want = ReferenceEvaluator(model).run(None, ins)
    for out, expected in zip(outs, want):  # each output as the loss's value: the others are pruned
        got = engine_values(import_model(model, ImportOptions(inputs=ins, params="none", output=out)))[out]
        assert got.shape == expected.shape, out
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=out)


@pytest.mark.parametrize("attr", [{"clip": 0.5}, {"input_forget": 1}])
def test_clip_and_input_forget_are_refused(attr):
    model, ins, _ = _model("LSTM", **attr)
    with pytest.raises(GradcheckError, match=f"LSTM with {next(iter(attr))}"):
        import_model(model, ImportOptions(inputs=ins, params="none"))
