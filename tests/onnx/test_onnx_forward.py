"""ONNX's shipped reference outputs against the engine's forward of imported models.

Light models (onnx/backend/test/data/light): the input is ONNX's own dummy
input, made by the backend test runner's generate_dummy_data; the output must
match light_*_output_0.pb within the runner's tolerance. Node tests
(pytorch-operator, pytorch-converted, simple): every test whose model imports
must match its shipped output; the ones that do not import must fail with a
one-line user error, and a test whose op types all have converters must import.
The coverage table is printed (pytest -s, or in the -ra summary on failure).
"""
from __future__ import annotations

import numpy as np
import pytest

from onnx_helpers import DATA, engine_values, onnx

from gradcheck_svc.errors import GradcheckError
from gradcheck_svc.onnx_import import import_onnx
from gradcheck_svc.onnx_import.converters import CONVERTERS
from gradcheck_svc.onnx_import.importer import ImportOptions

from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

LIGHT = sorted((DATA / "light").glob("*.onnx"))
NODE_DIRS = [d for kind in ("pytorch-operator", "pytorch-converted", "simple")
             for d in sorted((DATA / kind).iterdir()) if (d / "model.onnx").exists()]
FOLDED_ONLY = {"Constant", "Shape", "Size"}  # need no converter: known at import time


def test_the_shipped_data_is_there():
    assert len(LIGHT) == 9 and len(NODE_DIRS) > 100


def _onnxruntime_value(model, feeds: dict, name: str) -> np.ndarray:
    """`name`'s value in `model` by onnxruntime on this machine (one thread): the same BLAS-free-of-us
    reference, computed where the engine runs."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run([name], feeds)[0]


def _softmax64(z: np.ndarray, axis: int | None, opset: int) -> np.ndarray:
    """ONNX Softmax in float64: before opset 13 over the 2-D coercion at `axis` (default 1), from 13 on
    over the one `axis` (default -1)."""
    if opset < 13:
        a = 1 if axis is None else axis % z.ndim
        flat = z.reshape(int(np.prod(z.shape[:a])), -1)
        return _softmax64(flat, -1, 13).reshape(z.shape)
    a = -1 if axis is None else axis
    e = np.exp(z.astype(np.float64) - z.max(axis=a, keepdims=True))
    return e / e.sum(axis=a, keepdims=True)


@pytest.mark.parametrize("path", LIGHT, ids=lambda p: p.stem)
def test_light_model_forward_matches_shipped_output(path):
    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    feeds = {vi.name: Runner.generate_dummy_data(vi, seed=0, name=path.stem, random=False)
             for vi in model.graph.input if vi.name not in inits}
    out = model.graph.output[0].name
    msg = import_onnx(path, ImportOptions(inputs=feeds, params="none"))
    values = engine_values(msg, np.float32)  # the model's dtype (VGG-19's weights alone are 0.5 GB in it)
    y = values[out]
    expected = numpy_helper.to_array(onnx.load_tensor(str(path).replace(".onnx", "_output_0.pb")))
    assert y.shape == expected.shape
    last = model.graph.node[-1]
    if last.op_type != "Softmax":
        np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-7)
        return
    # A softmax of logits near 1e10 (SqueezeNet's) is conditioned far beyond float32: one ulp of a
    # logit (~1e3) flips which class takes the probability, and the engine's float32 sums and the
    # shipped output's differ in their last bit by BLAS kernel. So the network is checked where it is
    # well conditioned -- its logits, against onnxruntime's on this machine, to a tolerance relative
    # to their scale -- and the softmax against the engine's own logits, in float64.
    z = values[last.input[0]]
    z_ref = _onnxruntime_value(model, feeds, last.input[0])
    np.testing.assert_allclose(z, z_ref, rtol=1e-3, atol=1e-5 * float(np.max(np.abs(z_ref))))
    axis = next((a.i for a in last.attribute if a.name == "axis"), None)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    np.testing.assert_allclose(y, _softmax64(z, axis, opset), rtol=1e-4, atol=1e-6)


def _node_test(d):
    """(status, detail): 'ok', 'mismatch' or 'unsupported' for one node-test directory."""
    model = onnx.load(d / "model.onnx")
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    data = sorted(d.glob("test_data_set_*"))[0]
    feeds = {n: numpy_helper.to_array(onnx.load_tensor(str(data / f"input_{i}.pb"))) for i, n in enumerate(names)}
    expected = numpy_helper.to_array(onnx.load_tensor(str(data / "output_0.pb")))
    try:
        msg = import_onnx(d / "model.onnx", ImportOptions(inputs=feeds, params="none"))
    except GradcheckError as exc:
        return "unsupported", exc.message
    y = engine_values(msg)[model.graph.output[0].name]
    if y.shape != expected.shape or not np.allclose(y, expected, rtol=1e-3, atol=1e-6, equal_nan=True):
        return "mismatch", f"max abs error {np.max(np.abs(y - expected)) if y.shape == expected.shape else 'shape'}"
    return "ok", ""


def test_node_tests_match_or_say_why_not():
    rows = {d: _node_test(d) for d in NODE_DIRS}
    covered = [d for d, (s, _) in rows.items() if s == "ok"]
    print(f"\nONNX node tests covered: {len(covered)} of {len(rows)}")
    for d, (status, detail) in rows.items():
        if status != "ok":
            print(f"  not covered: {d.parent.name}/{d.name}: {detail}")
    mismatches = [f"{d.name}: {detail}" for d, (s, detail) in rows.items() if s == "mismatch"]
    assert not mismatches, mismatches
    # a test whose ops all have converters (and whose tensors are float) must be covered
    should = []
    for d, (status, detail) in rows.items():
        model = onnx.load(d / "model.onnx")
        ops = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
        domains = {n.domain for n in model.graph.node}
        floats = all(vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for vi in model.graph.input)
        if ops <= set(CONVERTERS) | FOLDED_ONLY and domains <= {"", "ai.onnx"} and floats and status != "ok":
            should.append(f"{d.name}: {detail}")
    assert not should, should
    assert len(covered) >= 122  # 122 of 140 at the time of writing; a regression in a converter shows here
