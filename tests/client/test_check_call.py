"""check(f, *args) / assert_gradients: one call, in process (gradcheck_svc) and through a real loopback
server (gradcheck_client), giving the same Report."""
from __future__ import annotations

import numpy as np
import pytest

import gradcheck_client
import gradcheck_svc
from gradcheck_core.trace_errors import TracerError
from grpc_helpers import module_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def layer(x, w, scale):
    return np.tanh(x @ w) * scale  # a (2, 3) output: reduced with the seeded cotangent


ARGS = (np.arange(6.0).reshape(2, 3) / 6, np.eye(3) * 0.5 + 0.1, 2)


def _same(a, b):
    assert a.verdict == b.verdict == "pass"
    assert a.loss == pytest.approx(b.loss, rel=1e-15)
    assert a.data["check"] == b.data["check"]
    assert [p.name for p in a.parameters] == [p.name for p in b.parameters] == ["x", "w"]
    for p, q in zip(a.parameters, b.parameters):
        assert p.status == q.status and p.fd_mode == q.fd_mode
        np.testing.assert_array_equal(p.gradient, q.gradient)
        np.testing.assert_array_equal(p.reference, q.reference)
    assert a.text.splitlines()[0] == b.text.splitlines()[0]


def test_check_in_process_and_through_a_server_give_the_same_report(server):
    here = gradcheck_svc.check(layer, *ARGS, fd_mode="full", seed=3)
    there = gradcheck_client.check(layer, *ARGS, server=server.target, fd_mode="full", seed=3)
    _same(here, there)
    # the reduction is stated, and it is the one a user can recompute: sum(f(x) * c), c seeded
    assert here.data["check"] == {"function": "layer", "parameters": ["x", "w"], "output_shape": [2, 3],
                                  "cotangent": {"distribution": "normal(0, 1)", "seed": 3}}
    assert "reduced to sum(output * c), c ~ N(0, 1) seeded with 3" in here.text
    c = np.random.default_rng(3).standard_normal((2, 3))
    assert here.loss == pytest.approx(np.sum(layer(*ARGS) * c), rel=1e-13)
    # the gradient, an array of each parameter's shape, is the true one: d/dw sum(tanh(xw) * 2c)
    x, w, s = ARGS
    upstream = (1 - np.tanh(x @ w) ** 2) * s * c
    np.testing.assert_allclose(here.parameters["w"].gradient, x.T @ upstream, rtol=1e-12)
    np.testing.assert_allclose(here.parameters["x"].gradient, upstream @ w.T, rtol=1e-12)
    assert here.parameters["w"].reference.shape == (3, 3)


def test_assert_gradients_raises_with_the_text_report(server):
    f = lambda x: np.sum(np.exp(x))  # noqa: E731  (nodes: exp_1, then the loss)
    x = np.array([0.1, -0.4, 0.3])
    assert gradcheck_svc.assert_gradients(f, x).passed
    with pytest.raises(AssertionError, match=r"f: FAIL") as here:
        gradcheck_svc.assert_gradients(f, x, faults=["exp_1:scale:2"])
    with pytest.raises(AssertionError, match=r"f: FAIL") as there:
        gradcheck_client.assert_gradients(f, x, server=server.target, faults=["exp_1:scale:2"])
    assert str(here.value).splitlines()[:2] == str(there.value).splitlines()[:2]
    assert "checked f with respect to x" in str(here.value)


def test_wrt_scalar_outputs_and_refusals():
    x, w = np.array([0.5, -1.0]), np.array([2.0, 3.0])
    report = gradcheck_svc.check(lambda x, w: np.sum(x * w), x, w, wrt="w")
    assert [p.name for p in report.parameters] == ["w"] and "cotangent" not in report.data["check"]
    np.testing.assert_allclose(report.parameters["w"].gradient, x, rtol=1e-15)
    report = gradcheck_svc.check(lambda k, w: np.sum(w ** k), np.array([2, 2]), w)  # ints pass through as data
    np.testing.assert_allclose(report.parameters["w"].gradient, 2 * w, rtol=1e-13)
    with pytest.raises(TracerError, match="no parameters: nothing to check"):
        gradcheck_svc.check(lambda k: np.sum(k), np.array([1, 2]))
    with pytest.raises(TypeError, match="unknown option"):
        gradcheck_svc.check(lambda x: np.sum(x), x, fd="full")
    with pytest.raises(TracerError, match="returned a tuple"):
        gradcheck_svc.check(lambda x: (x, x), x)
    # a value its VerifyOptions field cannot hold names the option (was protobuf's "Value out of range")
    from gradcheck_core.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"^options\.seed: 18446744073709551616 does not fit the field"):
        gradcheck_svc.check(lambda x: np.sum(x), x, seed=2**64)
    with pytest.raises(InvalidInput, match=r"^options\.directions: 'x' does not fit"):
        gradcheck_client.check(lambda x: np.sum(x), x, directions="x")


def test_a_list_option_given_one_string_is_one_item():
    """faults="z:zero" was split into its characters (each refused as a fault 'z', ':', ...): one string is one
    item, as one --fault flag is; a value that is not a list is refused naming the option. make_request is the
    one place every door (check, verify, Client.verify, both CLIs) turns options into a request."""
    from gradcheck_core.errors import InvalidInput
    from gradcheck_core.request_message import make_request

    graph = {"inputs": [{"name": "x", "value": {"data": [1.0]}, "requiresGrad": True}],
             "nodes": [{"name": "z", "op": "square", "inputs": ["x"]}], "output": "z"}
    for given in ("z:zero", ["z:zero"], ("z:zero",)):
        assert list(make_request(graph, faults=given).options.faults) == ["z:zero"], given
    with pytest.raises(InvalidInput, match=r"^options\.faults: 5 is not a list of strings \(or one string\)$"):
        make_request(graph, faults=5)


def test_one_check_signature_in_process_unless_server_is_given(server):
    """gradcheck_client.check, gradcheck_svc.check and the torch front end take the same call: in process
    without `server=`, on the server with it (an address or a Client); gradcheck_core's check, which has no
    verifier of its own, keeps `server=` and says so without it."""
    import inspect

    from gradcheck_client.torch import check as torch_check
    from gradcheck_core.check_call import check as core_check
    from gradcheck_core.client import Client

    for entry in (gradcheck_client.check, gradcheck_svc.check, torch_check):
        params = inspect.signature(entry).parameters
        assert params["server"].default is None and params["wrt"].default is None, entry
        assert params["server"].kind == inspect.Parameter.KEYWORD_ONLY, entry
    for entry in (gradcheck_client.check, gradcheck_svc.check):
        assert inspect.signature(entry).parameters["grad"].default is None
    here = gradcheck_client.check(layer, *ARGS, fd_mode="full", seed=3)  # in process: no server needed
    _same(here, gradcheck_svc.check(layer, *ARGS, fd_mode="full", seed=3))
    _same(here, gradcheck_svc.check(layer, *ARGS, server=server.target, fd_mode="full", seed=3))
    with Client(server.target) as client:  # a Client kept open by the caller, the old form
        _same(here, core_check(layer, *ARGS, server=client, fd_mode="full", seed=3))
    with pytest.raises(TypeError, match="server="):
        core_check(layer, *ARGS)
    # the user's own backward, in process and on the server alike
    grad = lambda x: 2 * x  # noqa: E731
    x = np.array([0.5, -1.0, 2.0])
    for kw in ({}, {"server": server.target}):
        assert gradcheck_client.check(lambda x: np.sum(x * x), x, grad=grad, **kw).data["subject"] == "claimed"
        with pytest.raises(AssertionError, match="FAIL"):
            gradcheck_client.assert_gradients(lambda x: np.sum(x * x), x, grad=lambda x: 3 * x, **kw)
