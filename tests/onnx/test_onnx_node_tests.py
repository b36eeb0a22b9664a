"""ONNX's own node tests (the test cases the onnx package ships as generators in
onnx.backend.test.case.node: a one-node model, its inputs and the reference outputs) for the ops added
for today's exported models. Each case either imports and every output the model declares matches
ONNX's reference, or is refused with a one-line user error (int or string tensors, a mode the
converter does not take); every op has cases that import."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx_helpers import engine_values, onnx

from gradcheck_svc.errors import GradcheckError
from gradcheck_svc.onnx_import.importer import ImportOptions, import_model

OPS = ["LayerNormalization", "Erf", "Gelu", "HardSwish", "HardSigmoid", "CastLike", "Where", "Equal", "Less",
       "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "GatherElements",
       "Trilu", "Expand", "Range", "Einsum", "ScatterElements", "LSTM", "GRU", "RNN", "Resize", "Upsample",
       "TopK", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "CumSum", "ReduceL2",
       "ReduceLogSumExp", "ReduceProd", "Celu", "DepthToSpace", "SpaceToDepth", "Asin"]


@functools.cache
def _cases():
    """ONNX's cases for OPS, by op. collect_testcases() imports every generator module of the package, each
    computing its reference outputs on import (12 s, mostly the pooling ops'); the modules that name one of
    OPS hold all of OPS' cases (the same 269 as collect_testcases() finds), in 0.6 s."""
    import importlib
    import pkgutil
    import re
    import warnings
    from pathlib import Path

    from onnx.backend.test.case import node

    named = re.compile("[\"'](%s)[\"']" % "|".join(OPS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators divide by zero on purpose (inf test data)
        for _, name, is_package in pkgutil.iter_modules(node.__path__):
            path = Path(node.__file__).parent / f"{name}.py"
            if not is_package and named.search(path.read_text()):
                importlib.import_module(f"{node.__name__}.{name}")  # its cases register as it imports
    out = {}
    for c in node._NodeTestCases:
        ops = {n.op_type for n in c.model.graph.node}
        if len(ops) == 1 and (op := ops.pop()) in OPS:
            out.setdefault(op, []).append(c)
    return out


FLOAT_DATA = {"Trilu"}
CONST_INPUTS = {"Resize", "Upsample"}  # ONNX's cases feed roi and scales as inputs  # ONNX's cases feed int64 matrices: here the same values as float64 data


def _with_float_loss(model):
    """The model plus a float output to take the loss of, whatever its outputs' types: Cast(y, DOUBLE) * w,
    w a float input, so the model's own output is computed (not folded) when it is a mask or int data."""
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o in m.opset_import:  # the Cast below takes `to` as a type number from opset 6 on (Not's test is opset 1)
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, 6)
    g = m.graph
    y = g.output[0].name
    g.node.extend([helper.make_node("Cast", [y], ["_y64"], to=TensorProto.DOUBLE),
                   helper.make_node("Mul", ["_y64", "_w"], ["_loss_src"])])
    g.input.append(helper.make_tensor_value_info("_w", TensorProto.DOUBLE, []))
    g.output.append(helper.make_tensor_value_info("_loss_src", TensorProto.DOUBLE, None))
    return m


def _run(case):
    model = case.model
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    from onnx import numpy_helper

    ins, outs = ([numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else t for t in ts]
                 for ts in case.data_sets[0])
    op = model.graph.node[0].op_type
    if op in FLOAT_DATA and np.asarray(ins[0]).dtype.kind in "iu":
        from onnx import TensorProto

        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
        ins[0] = np.asarray(ins[0], dtype=np.float64)
    feeds = dict(zip(names, ins))
    if op in CONST_INPUTS:  # in exported models these are initializers (constants), not inputs
        model = onnx.ModelProto.FromString(model.SerializeToString())
        keep = [vi for vi in model.graph.input if vi.name == names[0]]
        model.graph.initializer.extend(numpy_helper.from_array(np.asarray(feeds.pop(n)), n) for n in names[1:])
        del model.graph.input[:]
        model.graph.input.extend(keep)
    feeds["_w"] = np.asarray(1.0)
    try:
        msg = import_model(_with_float_loss(model), ImportOptions(inputs=feeds, params="none", output="_loss_src"))
    except GradcheckError as exc:
        assert "\n" not in exc.message
        return "refused", exc.message
    values = engine_values(msg, allow_nonfinite=True)
    for vi, want in zip(model.graph.output, outs):
        got = values.get(vi.name)
        if got is None:
            continue  # an output folded at import time (a constant): ONNX's own evaluator made it
        want = np.asarray(want)
        if got.shape != want.shape or not np.allclose(got.astype(np.float64), want.astype(np.float64),
                                                      rtol=1e-4, atol=1e-6, equal_nan=True):
            return "mismatch", f"output {vi.name}: {got.ravel()[:4]} vs {want.ravel()[:4]}"
    return "ok", ""


@pytest.mark.parametrize("op", OPS)
def test_node_tests_of_new_ops(op):
    cases = _cases()[op]
    rows = {c.name: _run(c) for c in cases}
    bad = {n: d for n, (s, d) in rows.items() if s == "mismatch"}
    assert not bad, bad
    ok = [n for n, (s, _) in rows.items() if s == "ok"]
    print(op, f"{len(ok)}/{len(rows)}", {n: d for n, (s, d) in rows.items() if s != "ok"})
    assert ok, rows
