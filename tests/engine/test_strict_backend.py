"""The CPU stand-in for CuPy (backend "strict", strict_backend.py): it refuses what CuPy refuses,
and every op, bundled example and bug-zoo case runs on it with NumPy's results. A failure here
is an implicit host transfer or a host/device mix that would break on a real GPU. The same
bodies run on CuPy ("cuda") where a GPU is present (bench/gpu_check.sh)."""
import json

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY, cuda_available, get_backend
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.ops import all_ops
from gradcheck_svc.strict_backend import HostTransferError, StrictArray
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.audit import op_graph

from conftest import EXAMPLES
from graphs_memory import chain, mlp, residual
from zoo_cases import CASES, run_case
from zoo_cases import case_param as _case_param

STRICT = get_backend("strict")
xp = STRICT.xp
DEVICES = ["strict", pytest.param("cuda", marks=pytest.mark.skipif(not cuda_available(), reason="no CUDA device"))]


# --- the wrapper refuses what CuPy refuses -------------------------------------------

@pytest.mark.parametrize("how", [
    np.asarray, float, int, bool, list, lambda a: a.item(), lambda a: a.tolist(), lambda a: a.tobytes(),
    lambda a: np.sum(a), lambda a: np.exp(a), lambda a: a + np.ones(3), lambda a: np.ones(3) * a,
    lambda a: xp.add(a, np.ones(3)), lambda a: xp.concatenate([a, np.ones(3)]),
], ids=["asarray", "float", "int", "bool", "iter", "item", "tolist", "tobytes", "np.sum", "np.exp",
        "add-host", "radd-host", "xp.add-host", "xp.concat-host"])
def test_implicit_host_transfers_and_mixing_are_refused(how):
    a = xp.asarray(np.array([1.5, -2.0, 3.0]))
    with pytest.raises(HostTransferError):
        how(a[:1] if how in (float, int, bool) else a)


def test_device_arithmetic_stays_on_the_device_and_to_host_is_the_door():
    a = xp.asarray(np.array([[1.0, 2.0], [3.0, 4.0]]))
    b = (xp.exp(a) * np.float64(2) + 1.0) @ a.T  # a NumPy scalar is a scalar, as on CuPy
    s = b.sum()  # a reduction is a 0-d device array, as on CuPy, not a host scalar
    assert isinstance(b, StrictArray) and isinstance(s, StrictArray) and s.shape == ()
    host = np.exp([[1.0, 2.0], [3.0, 4.0]]) * 2 + 1.0
    expect = host @ np.array([[1.0, 3.0], [2.0, 4.0]])
    np.testing.assert_array_equal(STRICT.to_host(b), expect)
    assert type(STRICT.to_host(s)) is np.ndarray and STRICT.to_host(s) == expect.sum()


def test_strict_is_not_offered_to_users():
    from gradcheck_svc.errors import OptionError
    from gradcheck_svc.config import ServerLimits
    from gradcheck_svc.request import verify_options

    assert verify_options({"device": "cpu"}, ServerLimits()).device == "cpu"
    with pytest.raises(OptionError, match="unknown device 'strict'"):
        verify_options({"device": "strict"}, ServerLimits())


# --- every op, forward and VJP, as on NumPy --------------------------------------------

def _run(graph, backend):
    program = Program(graph, np.float64)
    tape = forward(program, backend, prepare_feeds(program, backend))
    grads = backward(tape)
    if backend is not NUMPY:  # the run really stayed on the device
        assert all(isinstance(v, backend.xp.ndarray) for v in [*tape.values.values(), *grads.values()])
    return ({k: backend.to_host(v) for k, v in tape.values.items()},
            {k: backend.to_host(v) for k, v in grads.items()})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", all_ops(), ids=lambda o: o.name)
def test_every_op_forward_and_vjp_match_numpy(op, device, rng):
    for case in op.cases(rng):
        shape = op_graph(op, case).specs["y"].shape
        graph = op_graph(op, case, rng.uniform(0.5, 1.5, size=shape))
        values, grads = _run(graph, get_backend(device))
        ref_values, ref_grads = _run(graph, NUMPY)
        assert values.keys() == ref_values.keys() and grads.keys() == ref_grads.keys()
        # the stand-in runs NumPy's own kernels: equal to rounding; CuPy's differ in the last bits
        rtol, atol = (1e-12, 0) if device == "strict" else (1e-9, 1e-12)
        for k in ref_values:
            np.testing.assert_allclose(values[k], ref_values[k], rtol=rtol, atol=atol, err_msg=f"{op.name} {k}")
        for k in ref_grads:
            np.testing.assert_allclose(grads[k], ref_grads[k], rtol=rtol, atol=atol, err_msg=f"{op.name} d{k}")


# --- the bundled examples and the bug zoo -----------------------------------------------

EXAMPLE_GRAPHS = sorted((EXAMPLES).glob("*.json"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", EXAMPLE_GRAPHS, ids=lambda p: p.stem)
def test_examples_report_what_numpy_reports(path, device):
    dev = verify(load_graph(path), VerifyOptions(device=device))
    ref = verify(load_graph(path), VerifyOptions())
    assert dev.verdict == ref.verdict == ("fail" if path.stem.endswith("_wrong") else "pass")
    assert [(p.name, p.passed) for p in dev.parameters] == [(p.name, p.passed) for p in ref.parameters]
    for p, q in zip(dev.parameters, ref.parameters):
        np.testing.assert_allclose(p.gradient, q.gradient, rtol=1e-12 if device == "strict" else 1e-9, atol=0)
    assert {(f.node, f.cause) for f in dev.findings} == {(f.node, f.cause) for f in ref.findings}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_bug_zoo(case, device):
    case = json.loads(json.dumps(case))
    case["options"] = {**case.get("options", {}), "device": device}
    ok, text = run_case(case)
    assert ok, f"expected {case['expect']}\n{text}"


# --- memory: checkpointing and the byte counts ------------------------------------------

@pytest.mark.parametrize("make", [lambda: chain(40), residual, mlp], ids=["chain40", "residual", "mlp"])
def test_checkpointing_and_memory_figures_on_strict_match_numpy(make):
    """Views must resolve to their base buffer by identity on the device as on NumPy, else every
    view is counted as a buffer of its own (the stand-in's first version overcounted 3x)."""
    graph = make()
    for policy in ("none", "sqrt", "every:3"):
        dev = verify(graph, VerifyOptions(device="strict", checkpoint=policy))
        ref = verify(graph, VerifyOptions(checkpoint=policy))
        assert dev.verdict == ref.verdict == "pass"
        assert dev.memory == ref.memory and dev.memory["live_peak_bytes"] > 0
        assert all(np.array_equal(p.gradient, q.gradient) for p, q in zip(dev.parameters, ref.parameters))
