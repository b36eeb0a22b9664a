"""The tracer on plain NumPy code (issue 13 item 3): functions written for NumPy arrays, with no
knowledge of the tracer, traced and verified; shapes right for every op; the comparison rule;
the branch warning; ops the registry lacks refused at trace time, by name."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from gradcheck_client import Client, Tracer, ops
from gradcheck_core.tracer import TracerError, TracerWarning, UnknownOpError
from grpc_helpers import ServerProcess

from gradcheck_svc.graph import validate
from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.verify import verify

# --- models written for NumPy arrays (nothing here knows about tracing) -------------------

def mlp(x, W1, b1, W2, b2, y):
    h = np.tanh(x @ W1 + b1)
    out = np.maximum(h @ W2 + b2, 0.0)
    return np.mean(np.square(out - y))


def softmax(z, axis=-1):
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def attention(x, Wq, Wk, Wv):
    q, k, v = x @ Wq, x @ Wk, x @ Wv
    scores = q @ k.T / np.sqrt(q.shape[-1])
    out = softmax(scores) @ v
    return np.sum(np.concatenate([out, x], axis=1) ** 2) / len(x)


def layer_norm(x, gamma, beta, eps=1e-5):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean(np.square(x - mu), axis=-1, keepdims=True)
    y = gamma * (x - mu) / np.sqrt(var + eps) + beta
    return np.sum(np.where(y > 0, y, 0.1 * y)[:, 1:].reshape(-1) * np.arange(1.0, 1 + y[:, 1:].size))


def _trace(fn, params: dict, inputs: dict, name: str):
    t = Tracer(name)
    args = {k: t.param(k, v) for k, v in params.items()} | {k: t.input(k, v) for k, v in inputs.items()}
    loss = fn(**args)
    return t.graph(loss), loss


def _models(rng):
    return {
        "mlp": (mlp, {"W1": rng.standard_normal((3, 5)), "b1": rng.standard_normal(5),
                      "W2": rng.standard_normal((5, 2)), "b2": rng.standard_normal(2)},
                {"x": rng.standard_normal((4, 3)), "y": rng.standard_normal((4, 2))}),
        "attention": (attention, {"Wq": rng.standard_normal((4, 3)), "Wk": rng.standard_normal((4, 3)),
                                  "Wv": rng.standard_normal((4, 4))}, {"x": rng.standard_normal((5, 4))}),
        "layer_norm": (layer_norm, {"gamma": rng.uniform(0.5, 1.5, 4), "beta": rng.standard_normal(4)},
                       {"x": rng.standard_normal((3, 4))}),
    }


@pytest.mark.parametrize("model", ["mlp", "attention", "layer_norm"])
def test_plain_numpy_models_trace_and_verify(model):
    fn, params, inputs = _models(np.random.default_rng(7))[model]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TracerWarning)  # selecting with np.where is no branch
        graph, loss = _trace(fn, params, inputs, model)
    plain = fn(**params, **inputs)  # the same function on plain arrays
    assert float(loss.value) == pytest.approx(plain, rel=1e-12)  # the trace-time value
    report = verify(validate(graph))
    assert report.verdict == "pass", report.to_text()
    assert report.loss == pytest.approx(plain, rel=1e-12)  # the server's engine agrees with NumPy
    assert {p.name for p in report.parameters} == set(params)
    # the gradient against central differences of the plain NumPy function
    name = next(iter(params))
    g = next(p.gradient for p in report.parameters if p.name == name)
    h, flat = 1e-6, params[name].reshape(-1)
    for i in range(min(3, flat.size)):
        up, down = flat.copy(), flat.copy()
        up[i] += h
        down[i] -= h
        fd = (fn(**(params | {name: up.reshape(params[name].shape)}), **inputs)
              - fn(**(params | {name: down.reshape(params[name].shape)}), **inputs)) / (2 * h)
        assert g.reshape(-1)[i] == pytest.approx(fd, rel=1e-5, abs=1e-7)


def test_plain_numpy_models_verify_over_a_real_server():
    graphs = {m: _trace(fn, p, i, m)[0] for m, (fn, p, i) in _models(np.random.default_rng(3)).items()}
    with ServerProcess("--workers", "1") as server, Client(server.target) as client:
        for name, graph in graphs.items():
            report = client.verify(graph, timeout=60)
            assert report.verdict == "pass", report.text
            assert report.graph == name


def _traced_inputs(t, case):
    return [t.input(f"in{i}", x) for i, x in enumerate(case.inputs)]


def test_shape_ndim_len_right_for_every_op():
    """Each op on each of its registry test cases: the traced shape is the server's inferred one."""
    from gradcheck_svc.verify.audit import index_range, mask_shape

    checked = set()
    for op in REGISTRY.values():
        for k, case in enumerate(op.cases(np.random.default_rng(0)) if op.cases else ()):
            t = Tracer(f"{op.name}_{k}")
            y = ops.__getattr__(op.name)(*_traced_inputs(t, case), **case.attrs) if case.inputs else \
                t.apply(op.name, **case.attrs)
            if mask_shape(op, case) is not None:  # a bool mask: a float loss reads it through where
                ones = t.input("ones", np.ones(y.shape))
                loss = ops.where(y, ones, -ones).sum()
            elif index_range(op, case) is not None:  # int indices (top_k_indices): read through take
                loss = ops.take(t.input("r", np.arange(float(index_range(op, case)))), y, axis=0).sum()
            else:
                loss = y.sum() if y.shape else y
            server = validate(t.graph(loss), require_parameters=False).specs[y.name].shape
            assert y.shape == tuple(server), (op.name, case.attrs)
            assert y.ndim == len(server)
            if server:
                assert len(y) == server[0]
            else:
                with pytest.raises(TypeError):
                    len(y)
            checked.add(op.name)
    assert checked == set(REGISTRY)


def test_the_shape_memo_keeps_numpys_own_answers():
    """numpy_rule remembers each (op, input shapes, plain attributes) answer for the process (a traced module asks
    the same ones on every check): a second trace answers from it, and each answer kept is what the op's NumPy
    function gives afresh; an attribute whose repr is not exact (an array) never keys it."""
    import ast

    from gradcheck_core import shapes
    from gradcheck_core.op_values import OPS, VALUES

    shapes._SHAPES.clear()
    graphs = []
    for _ in range(2):
        t = Tracer()
        x = t.param("x", np.arange(6.0).reshape(2, 3) - 2.5)
        y = np.tanh(x @ x.T).sum(axis=0, keepdims=True) * np.exp(x[:, :2]).mean() + np.reshape(x, (3, 2))[:1]
        graphs.append(t.graph(y.sum()).SerializeToString(deterministic=True))
    assert graphs[0] == graphs[1]
    assert len(shapes._SHAPES) >= 5
    for (name, given_shapes, given), shape in shapes._SHAPES.items():
        stand_ins = shapes._stand_ins(ast.literal_eval(given_shapes), OPS[name]["inputs"])
        assert shape == np.shape(VALUES[name](*stand_ins, **dict(ast.literal_eval(given)))), name
    assert shapes._plain({"axis": (0, -1), "keepdims": True, "mode": "x"})
    assert not shapes._plain({"indices": np.arange(3)}) and not shapes._plain([np.int64(2)])


def test_numpy_functions_record_the_registry_ops():
    t = Tracer()
    x = t.param("x", np.arange(6.0).reshape(2, 3) - 2.5)
    cases = {
        "tanh": np.tanh(x), "exp": np.exp(x), "matmul": x @ x.T, "maximum": np.maximum(x, 0),
        "sum": np.sum(x, axis=1, keepdims=True), "mean": np.mean(x, axis=0), "where": np.where(x > 0, x, -x),
        "concat": np.concatenate([x, x], axis=0), "transpose": x.T, "reshape": x.reshape(3, 2),
        "abs": np.abs(x), "neg": -x, "take": np.take(x, [1, 0], axis=1), "squeeze": np.squeeze(x[:1]),
        "expand_dims": np.expand_dims(x, 0), "max": x.max(axis=1),
    }
    plain = np.arange(6.0).reshape(2, 3) - 2.5
    expected = {
        "tanh": np.tanh(plain), "exp": np.exp(plain), "matmul": plain @ plain.T, "maximum": np.maximum(plain, 0),
        "sum": np.sum(plain, axis=1, keepdims=True), "mean": np.mean(plain, axis=0),
        "where": np.where(plain > 0, plain, -plain), "concat": np.concatenate([plain, plain]),
        "transpose": plain.T, "reshape": plain.reshape(3, 2), "abs": np.abs(plain), "neg": -plain,
        "take": np.take(plain, [1, 0], axis=1), "squeeze": np.squeeze(plain[:1]),
        "expand_dims": np.expand_dims(plain, 0), "max": plain.max(axis=1),
    }
    for op, v in cases.items():
        ops_in_graph = [n.op for n in t.graph(v.sum() if v.shape else v).nodes]
        assert op in ops_in_graph, (op, ops_in_graph)
        assert v.shape == expected[op].shape, op
        g = validate(t.graph(v.sum() if v.shape else v))
        report = verify(g)
        assert report.verdict == "pass", (op, report.to_text())
        assert report.loss == pytest.approx(float(np.sum(expected[op])), rel=1e-12), op


@pytest.mark.parametrize("key", [
    0, -1, (1, 2), slice(1, 3), (slice(None), slice(None, None, -1)), (Ellipsis, None), (None, 1),
    (slice(None), 0), (-2, slice(0, 4, 2)), [2, 0, 2], (slice(None), [3, 1]),
    # integer arrays on several axes (broadcast together), ints among them, slices beside them
    (np.arange(3), [1, 3, 3]), ([[0], [2]], [1, -1]), (1, [0, 3, 3]), ([2, 0], slice(1, 4)),
    (Ellipsis, [0, 0], [3, 2]),
    # boolean masks: constants of the graph (their True positions)
    np.array([True, False, True]), (slice(None), np.array([False, True, True, False])),
    np.arange(12).reshape(3, 4) % 5 == 1,
])
def test_indexing_matches_numpy(key):
    plain = np.arange(12.0).reshape(3, 4) * 0.5 - 1.0
    t = Tracer("index")
    x = t.param("x", plain)
    y = x[key]
    want = plain[key]
    assert y.shape == want.shape
    loss = np.sum(y * np.arange(1.0, want.size + 1).reshape(want.shape))
    report = verify(validate(t.graph(loss)))
    assert report.verdict == "pass", report.to_text()
    assert report.loss == pytest.approx(float(np.sum(want * np.arange(1.0, want.size + 1).reshape(want.shape))))
    # d loss / d x: the weights scattered back to the indexed positions (repeats accumulate)
    expected = np.zeros_like(plain)
    np.add.at(expected, key, np.arange(1.0, want.size + 1).reshape(want.shape))
    np.testing.assert_allclose(report.parameters[0].gradient, expected, atol=1e-12)


def test_comparisons_follow_the_rule_and_branching_warns_once():
    t = Tracer()
    x = t.param("x", [0.5, 2.0])
    assert list(x == 0.5) == [True, False]  # trace-time values, not identity
    assert list(x != 0.5) == [False, True]
    assert list(0.5 == x) == [True, False]
    assert list(x > 1) == [False, True] and list(np.greater(x, 1)) == [False, True]
    assert {x: 1}[x] == 1  # still hashable by identity
    with pytest.warns(TracerWarning, match="baked into the graph"):
        if (x * 2).sum() > 1:
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error", TracerWarning)  # once per trace: no second warning
        assert bool(x.sum() > 1)


def test_ops_the_registry_lacks_fail_at_trace_time_by_name():
    t = Tracer()
    x = t.param("x", [0.5, 2.0])
    with pytest.raises(UnknownOpError, match="op 'sinh_of_x' is not in the server's registry"):
        ops.sinh_of_x(x)
    assert not hasattr(ops, "sinh_of_x")
    with pytest.raises(UnknownOpError, match="'frobnicate'"):
        t.apply("frobnicate", x)
    with pytest.raises(TracerError, match="numpy.arccosh has no op"):
        np.arccosh(x)
    with pytest.raises(TracerError, match="numpy.nancumsum has no op"):
        np.nancumsum(x)
    # NumPy's public names, not the function object's bare __name__; the user's line, too
    with pytest.raises(TracerError,
                       match=r"numpy.linalg.eigvals has no op.*test_tracer_numpy.py:\d+: `np.linalg.eigvals"):
        np.linalg.eigvals(x)
    with pytest.raises(TracerError, match=r"inside NumPy's AxisConcatenator.__getitem__.*`np.r_\[x, x\]`"):
        np.r_[x, x]
    with pytest.raises(TracerError, match="argument 'dtype'"):
        np.sum(x, dtype=np.float32)
    with pytest.raises(TracerError, match="numpy.take with axis=None"):
        np.take(x, [0])
    with pytest.raises(IndexError, match=r"boolean index of shape \[3\] does not match the indexed shape \[2\]"):
        x[np.array([True, False, True])]
    with pytest.raises(TracerError, match="unknown attribute"):
        ops.softmax(x, axes=0)
    with pytest.raises(TracerError, match=r"op 'matmul' on shapes \[2\], \[3\]"):
        x @ np.ones(3)
