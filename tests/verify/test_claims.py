"""Claimed gradients as the subject of a verification (verify/claims.py): a hand-written NumPy backward
through check(grad=), an .npz through both verify commands and over gRPC (a real loopback server),
claimed adjoints localizing a wrong rule, and bad claims refused naming the field."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import grpc
import numpy as np
import pytest

import gradcheck_client
import gradcheck_svc
from conftest import EXAMPLES
from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_client import Client
from gradcheck_core.claims import claims_message, with_claims
from gradcheck_core.graphio import load_graph as read_graph
from gradcheck_core.trace_errors import TracerError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.graph.decode import parse_graph
from gradcheck_svc.verify import verify
from grpc_helpers import module_server
import forked_cli


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


# ---- a hand-written NumPy backward: layer norm -------------------------------------------------------

def layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / np.sqrt(var + 1e-5) * g + b


def layer_norm_vjp(x, g, b, dy, mean_of=None):
    """The textbook backward; mean_of(v) replaces the mean term's mean (to plant a bug)."""
    mean = mean_of or (lambda v: v.mean(axis=-1, keepdims=True))
    mu = x.mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    xhat = (x - mu) * inv
    dxhat = dy * g
    dx = inv * (dxhat - mean(dxhat) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def wrong_mean_vjp(x, g, b, dy):
    """The mean term divided by n + 1 instead of n."""
    return layer_norm_vjp(x, g, b, dy, mean_of=lambda v: v.sum(axis=-1, keepdims=True) / (v.shape[-1] + 1))


RNG = np.random.default_rng(0)
LN_ARGS = (RNG.standard_normal((4, 5)), RNG.standard_normal(5), RNG.standard_normal(5))


def _error_finding(report, name):
    found = [f for f in report.findings if f.severity == "error"]
    assert len(found) == 1, [str(f) for f in found]
    assert found[0].node == name
    return found[0]


@pytest.mark.parametrize("where", ["here", "server"])
def test_layer_norm_vjp_with_a_wrong_mean_term_is_caught_naming_argument_element_and_error(where, server):
    def check(grad):
        if where == "here":
            return gradcheck_svc.check(layer_norm, *LN_ARGS, grad=grad)
        return gradcheck_client.check(layer_norm, *LN_ARGS, grad=grad, server=server.target)

    right = check(layer_norm_vjp)
    assert right.verdict == "pass", right.text
    assert right.data["subject"] == "claimed"
    assert [p.status for p in right.parameters] == ["ok", "ok", "ok"]
    assert right.text.startswith("checked layer_norm_vjp, the gradient of layer_norm with respect to x, g, b")

    wrong = check(wrong_mean_vjp)
    assert wrong.verdict == "fail"
    assert [p.status for p in wrong.parameters] == ["FAIL", "ok", "ok"]  # only dx has the mean term
    # the element named is the one furthest beyond its tolerance (atol 1e-7 * max|ref| + rtol 1e-6 * |ref|),
    # recomputed here from the exact backward
    c = np.random.default_rng(0).standard_normal((4, 5))  # the reduction's cotangent (seed 0), as stated
    exact = layer_norm_vjp(*LN_ARGS, c)[0]
    off = np.abs(wrong_mean_vjp(*LN_ARGS, c)[0] - exact)
    ratio = off / (1e-7 * max(1.0, np.abs(exact).max()) + 1e-6 * np.abs(exact))
    worst = np.unravel_index(int(np.argmax(ratio)), off.shape)
    f = _error_finding(wrong, "x")
    assert f.cause == "gradient_mismatch"
    assert f"its claimed gradient disagrees with the symbolic gradient (worst {[int(i) for i in worst]}" in f.detail
    assert re.search(r"off by ([0-9.e+-]+);", f.detail).group(1) == f"{off[worst]:.3g}"
    assert f.data["worst_element"]["reference"] == pytest.approx(exact[worst], rel=1e-12)


def test_a_scalar_output_takes_grad_of_the_arguments_by_name():
    f = lambda x, w: np.sum(np.tanh(x * w))  # noqa: E731
    x, w = np.array([0.3, -0.2, 0.5]), np.array([1.5, 0.7, -0.4])
    dt = 1 - np.tanh(x * w) ** 2
    assert gradcheck_svc.check(f, x, w, grad=lambda x, w: {"x": dt * w, "w": dt * x}).passed
    report = gradcheck_svc.check(f, x, w, grad=lambda x, w: {"x": dt * w, "w": dt * x + [0, 0, 1e-3]})
    assert [p.status for p in report.parameters] == ["ok", "FAIL"]
    assert "worst [2]" in _error_finding(report, "w").detail
    with pytest.raises(AssertionError, match="FAIL"):
        gradcheck_svc.assert_gradients(f, x, w, grad=lambda x, w: (dt * w, dt * x * 1.01))


def test_a_float32_backward_is_held_to_float32_tolerance_and_still_caught_when_wrong():
    f32 = lambda *a: tuple(np.float32(v) for v in layer_norm_vjp(*(np.float32(x) for x in a)))  # noqa: E731
    report = gradcheck_svc.check(layer_norm, *LN_ARGS, grad=f32)
    assert report.verdict == "pass", report.text
    assert {(p.data["tolerance"]["atol"], p.data["tolerance"]["rtol"]) for p in report.parameters} == {(1e-4, 1e-3)}
    off = lambda *a: (f32(*a)[0] * np.float32(1.01), *f32(*a)[1:])  # noqa: E731  (dx 1% off)
    assert [p.status for p in gradcheck_svc.check(layer_norm, *LN_ARGS, grad=off).parameters] == ["FAIL", "ok", "ok"]


@pytest.mark.parametrize("grad, message", [
    (lambda x, w: (x,), r"returned 1 gradient\(s\) for 2 checked argument\(s\) \(x, w\)"),
    (lambda x, w: (x, np.ones(2)), r"returned a gradient of shape \[2\] for 'w', whose shape is \[3\]"),
    (lambda x, w: {"x": x, "v": w}, r"returned a gradient for 'v', which is not a checked argument"),
    # the right real part with an imaginary one (a broken complex backward) passed: astype dropped it
    (lambda x, w: (w + 1j, x), r"returned complex128 values for 'x', not real numbers"),
    (lambda x, w: (w, None), r"returned None for 'w', not real numbers"),
])
def test_a_grad_of_the_wrong_form_is_refused_naming_the_argument(grad, message):
    f = lambda x, w: np.sum(x * w)  # noqa: E731
    with pytest.raises(TracerError, match=message):
        gradcheck_svc.check(f, np.ones(3), np.ones(3), grad=grad)


def test_a_gradient_left_out_of_the_dict_is_not_provided_and_fails():
    f = lambda x, w: np.sum(x * w)  # noqa: E731
    x, w = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    report = gradcheck_svc.check(f, x, w, grad=lambda x, w: {"x": w})
    assert report.verdict == "fail"
    assert [(p.name, p.status) for p in report.parameters] == [("x", "ok"), ("w", "not provided")]
    assert any("no claimed gradient for parameter 'w'" in w for w in report.warnings)
    assert [p.name for p in report.failed_parameters] == ["w"]
    assert "wrong gradient for w (no claimed gradient given)" in report.summary()


# ---- claimed adjoints: the culprit is the node whose claimed backward is wrong ------------------------

def chain_graph():
    """L = sum(tanh(w * x) ** 2): nodes z = w * x, t = tanh(z), s = t ** 2, L = sum(s)."""
    x, w = np.array([0.3, -1.2, 0.8]), np.array([0.9, 0.4, -1.5])
    return {"name": "chain", "inputs": [
        {"name": "w", "value": {"shape": [3], "data": w.tolist()}, "requiresGrad": True},
        {"name": "x", "value": {"shape": [3], "data": x.tolist()}, "requiresGrad": True}],
        "nodes": [{"name": "z", "op": "mul", "inputs": ["w", "x"]}, {"name": "t", "op": "tanh", "inputs": ["z"]},
                  {"name": "s", "op": "square", "inputs": ["t"]}, {"name": "L", "op": "sum", "inputs": ["s"]}],
        "output": "L"}, x, w


def chain_backward(x, w, tanh_rule=lambda t: 1 - t * t):
    """A hand-written backward of chain_graph, with its tanh rule replaceable: (gradients, adjoints)."""
    t = np.tanh(w * x)
    ds = np.ones(3)
    dt = ds * 2 * t
    dz = dt * tanh_rule(t)
    return {"w": dz * x, "x": dz * w}, {"s": ds, "t": dt, "z": dz, "L": np.array(1.0)}


def _claimed_graph(grads, adjoints):
    return with_claims(parse_graph(chain_graph()[0]), claims_message(grads, adjoints))


def test_claimed_adjoints_name_the_node_whose_rule_is_wrong():
    _, x, w = chain_graph()
    right = verify(load_graph(_claimed_graph(*chain_backward(x, w))))
    assert right.verdict == "pass" and right.subject == "claimed" and not right.findings
    wrong_rule = lambda t: 1 - t  # noqa: E731  (tanh' written as 1 - t)
    report = verify(load_graph(_claimed_graph(*chain_backward(x, w, wrong_rule))))
    assert report.verdict == "fail"
    [f] = [f for f in report.findings if f.severity == "error"]
    assert (f.node, f.op, f.cause) == ("t", "tanh", "rule_error")
    assert set(f.parameters) == {"w", "x"}
    # the worst element of dL/dz: where 1 - t and 1 - t^2 differ most, weighted by dL/dt
    t = np.tanh(w * x)
    assert list(f.worst.index) == [int(np.argmax(np.abs(2 * t * ((1 - t) - (1 - t * t)))))]
    assert f.worst.engine == pytest.approx((2 * t * (1 - t))[f.worst.index[0]], rel=1e-12)
    assert f.worst.reference == pytest.approx((2 * t * (1 - t * t))[f.worst.index[0]], rel=1e-6)


def test_without_the_culprits_output_adjoint_the_wrong_rule_is_not_localized():
    _, x, w = chain_graph()
    grads, adjoints = chain_backward(x, w, lambda t: 1 - t)
    del adjoints["t"]  # tanh's output adjoint: its consistency cannot be checked
    report = verify(load_graph(_claimed_graph(grads, adjoints)))
    assert report.verdict == "fail"
    assert {f.node for f in report.findings if f.severity == "error"} == {"w", "x"}
    assert all(f.cause == "gradient_mismatch" for f in report.findings if f.severity == "error")


def test_a_wrong_seed_is_named_at_the_loss():
    _, x, w = chain_graph()
    grads, adjoints = chain_backward(x, w)
    adjoints["L"] = np.array(2.0)
    grads = {k: 2 * v for k, v in grads.items()}  # a backward seeded with 2: every gradient doubled
    report = verify(load_graph(_claimed_graph(grads, adjoints)))
    [f] = [f for f in report.findings if f.severity == "error"]
    assert (f.node, f.cause) == ("L", "rule_error") and "the claimed adjoint of the loss is 2" in f.detail


def test_a_value_read_by_several_nodes_names_them_all():
    """shared_value: u = w x read by uu = u * u, sin_u and half_u; a backward that counts uu's u once."""
    msg = read_graph(EXAMPLES / "shared_value.json")
    w, x = (np.array(i.value.data) for i in msg.inputs[:2])
    u = w * x
    du = u + np.cos(u) + 0.5  # right: 2u + cos(u) + 0.5
    ones = np.ones(3)
    adjoints = {"s": ones, "t": ones, "half_u": ones, "uu": ones, "sin_u": ones, "u": du}
    report = verify(load_graph(with_claims(msg, claims_message({"w": du * x, "x": du * w}, adjoints))))
    [f] = [f for f in report.findings if f.severity == "error"]
    assert (f.node, f.cause) == ("u", "rule_error")
    assert "consumers 'uu', 'sin_u', 'half_u' (one of them is wrong; only their sum is claimed)" in f.detail
    assert report.verdict == "fail"


# ---- the same kink and float32 analyses as for the engine ----------------------------------------------

def _tied(op, x, y=None):
    """k = op(x[, y]) weighted by c = [1, 2, 3] and summed: x[0] on op's kink (a tie, or abs at 0)."""
    b = GraphBuilder(f"tie_{op}")
    names = [b.input("x", np.array(x), requires_grad=True)]
    if y is not None:
        names.append(b.input("y", np.array(y), requires_grad=True))
    k = b.node(op, *names, name="k")
    b.output(b.node("sum", b.node("mul", k, b.input("c", np.array([1.0, 2.0, 3.0])), name="wc"), name="L"))
    return b.build()


TIES = {"maximum": (_tied("maximum", [0.5, -0.25, 1.0], [0.5, 0.0, 2.0]),  # a tie at element 0
                    {"x": [0.5, 0.0, 0.0], "y": [0.5, 2.0, 3.0]}, {"x": [1.0, 0.0, 0.0], "y": [0.0, 2.0, 3.0]}),
        "abs": (_tied("abs", [0.0, -0.25, 1.0]), {"x": [0.0, -2.0, 3.0]}, {"x": [1.0, -2.0, 3.0]})}


@pytest.mark.parametrize("op", sorted(TIES))
def test_a_claim_at_a_declared_kink_is_judged_as_the_engines_is(op):
    """The engine's convention there: the exact-kink note; another subgradient (torch's convention, say):
    the kink warning, between the one-sided differences -- not a failure; outside them: an error at the kink."""
    msg, convention, other = TIES[op]
    claimed = lambda grads, adjoints=None: verify(load_graph(with_claims(  # noqa: E731
        msg, claims_message({k: np.array(v) for k, v in grads.items()}, adjoints))))
    report = claimed(convention)
    assert report.verdict == "pass" and report.subject == "claimed"
    [note] = report.findings
    assert (note.node, note.cause, note.severity) == ("k", "nondifferentiable_point", "info")
    assert "exactly at its kink" in note.detail
    report = claimed(other)
    assert report.verdict == "pass", report.to_text()
    [f] = report.findings
    assert (f.node, f.cause, f.severity) == ("k", "nondifferentiable_point", "warning")
    assert "the claimed (sub)gradient lies between the one-sided differences: not a failure" in f.detail
    assert {p.name: p.status for p in report.parameters}["x"] == "ok (kink)"
    outside = {**other, "x": [5.0, *other["x"][1:]]}
    for adjoints in (None, {"wc": np.ones(3), "L": np.array(1.0)}):  # the kink's own output adjoint absent
        report = claimed(outside, adjoints)
        assert report.verdict == "fail"
        [f] = [f for f in report.findings if f.severity == "error"]
        assert (f.node, f.cause) == ("k", "nondifferentiable_point")
        assert "the claimed gradient of x lies outside the one-sided differences" in f.detail
        assert f.worst.index == (0,) and f.worst.engine == 5.0
    # off where the loss is smooth (x[1]): a plain mismatch at that element, not blamed on the kink
    report = claimed({**convention, "x": [convention["x"][0], convention["x"][1] + 0.5, convention["x"][2]]})
    assert report.verdict == "fail"
    [f] = [f for f in report.findings if f.severity == "error"]
    assert (f.node, f.cause, f.worst.index) == ("x", "gradient_mismatch", (1,))


CANCELLATION = EXAMPLES / "faults" / "float32_cancellation.json"  # mse of (w + 1e5) and (target + 1e5)


def _cancelling_backward(scale=1.0):
    """A hand-written float32 backward of CANCELLATION: its rounding is the float32 forward's (w + 1e5)."""
    msg = read_graph(CANCELLATION)
    w, big, target = (np.array(i.value.data, dtype=np.float32).reshape(tuple(i.value.shape)) for i in msg.inputs)
    d = (w + big) - (target + big)  # float32 cancellation: ~1e-2 absolute
    dshifted = np.float32(2.0 / 3.0) * d * np.float32(scale)
    return msg, {"w": dshifted}, {"shifted": dshifted, "L": np.array(1.0, np.float32)}


@pytest.mark.parametrize("with_adjoints", [False, True])
def test_a_float32_claim_off_by_float32_rounding_only_gets_the_engines_float32_verdict(with_adjoints):
    msg, grads, adjoints = _cancelling_backward()
    engine = verify(load_graph(msg))  # the float32 engine: over the tolerance, explained as rounding
    assert engine.verdict == "pass" and engine.parameters[0].status == "ok (precision)"
    report = verify(load_graph(with_claims(msg, claims_message(grads, adjoints if with_adjoints else None))))
    assert report.verdict == "pass", report.to_text()
    [w] = report.parameters
    assert not w.passed and w.status == "ok (precision)"  # over float32's tolerance, explained
    [note] = report.findings
    assert (note.node, note.cause, note.severity) == ("w", "precision", "info")
    assert ("each of the 2 values on its path holds a claimed adjoint within its float32 rounding band"
            if with_adjoints else "within the float32 rounding band of the whole backward") in note.detail
    # 1% off is no rounding: a FAIL, at the node whose claimed adjoints say so where they are given
    msg, grads, adjoints = _cancelling_backward(1.01)
    report = verify(load_graph(with_claims(msg, claims_message(grads, adjoints if with_adjoints else None))))
    assert report.verdict == "fail" and report.parameters[0].status == "FAIL"
    [f] = [f for f in report.findings if f.severity == "error"]
    assert (f.node, f.cause) == (("L", "rule_error") if with_adjoints else ("w", "gradient_mismatch"))


def test_a_float32_claim_of_a_wrong_rule_still_names_the_culprit():
    _, x, w = chain_graph()
    f32 = lambda d: {k: np.float32(v) for k, v in d.items()}  # noqa: E731
    right = verify(load_graph(_claimed_graph(*map(f32, chain_backward(x, w)))))
    assert right.verdict == "pass" and not right.findings
    report = verify(load_graph(_claimed_graph(*map(f32, chain_backward(x, w, lambda t: 1 - t)))))
    assert report.verdict == "fail"
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [("t", "rule_error")]


# ---- an .npz through both verify commands, and over gRPC -------------------------------------------------

SEED = str(EXAMPLES / "seed.json")  # L = (w x)^2 / 4 at w = 3, x = 2: dL/dw = 6, dL/dx = 9


def _run(cmd, *args):
    p = forked_cli.run("gradcheck_svc.cli" if cmd == "svc" else "gradcheck_client.cli", "verify", *args, timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def seed_npz(tmp_path_factory):
    d = tmp_path_factory.mktemp("claims")
    np.savez(d / "good.npz", w=np.array(6.0), x=np.array(9.0))
    np.savez(d / "corrupt.npz", w=np.array(6.0), x=np.array(9.0 + 1e-3))
    return d


@pytest.mark.parametrize("cmd", ["svc", "client"])
def test_claimed_npz_through_both_verify_commands(cmd, seed_npz, tmp_path):
    code, out, err = _run(cmd, SEED, "--claimed", str(seed_npz / "good.npz"), "--format", "json")
    assert code == 0, err
    report = json.loads(out) if cmd == "svc" else json.loads(out)[0]["report"]
    assert report["subject"] == "claimed" and report["verdict"] == "pass"
    assert [(p["name"], p["claim"], p["gradient"]) for p in report["parameters"]] == \
        [("w", "provided", [6.0]), ("x", "provided", [9.0])]
    junit, html = tmp_path / "junit.xml", tmp_path / "report.html"
    code, out, err = _run(cmd, SEED, "--claimed", str(seed_npz / "corrupt.npz"), "--junit", str(junit),
                          "--html", str(html))
    assert code == 1, err
    assert "node 'x' (input): gradient_mismatch — its claimed gradient disagrees" in out
    assert "claimed 9.001, reference 9, off by 0.001" in out
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert props["subject"] == "claimed" and props["verdict"] == "fail"
    assert "Subject: <strong>the claimed gradients</strong>" in html.read_text()


def test_claimed_npz_with_finite_differences_in_shards(seed_npz, tmp_path):
    """The shards difference against the claims too: the merge pairs them with the same gradients."""
    claimed = ("--claimed", str(seed_npz / "corrupt.npz"))
    for i in range(2):
        code, out, err = _run("svc", SEED, *claimed, "--fd-shard-count", "2", "--fd-shard-index", str(i),
                              "--fd-out", str(tmp_path))
        assert code == 0, err
    code, out, err = _run("svc", SEED, *claimed, "--fd-from", str(tmp_path), "--format", "json")
    assert code == 1, err
    report = json.loads(out)
    assert report["subject"] == "claimed"
    assert [(p["name"], p["status"]) for p in report["parameters"]] == [("w", "ok"), ("x", "FAIL")]


def test_claimed_npz_over_grpc_one_element_corrupted(server, tmp_path):
    msg = read_graph(EXAMPLES / "mlp_cross_entropy.json")
    graph = load_graph(msg)
    engine = verify(graph)  # engine gradients, themselves verified against the references
    assert engine.verdict == "pass"
    grads = {p.name: p.gradient.copy() for p in engine.parameters}
    name = engine.parameters[0].name
    index = tuple(i // 2 for i in grads[name].shape)
    with Client(server.target, timeout=120) as client:
        good = client.verify(with_claims(msg, claims_message(grads)))
        assert good.verdict == "pass" and good.data["subject"] == "claimed"
        grads[name][index] += 0.05
        bad = client.verify(with_claims(msg, claims_message(grads)))
    assert bad.verdict == "fail"
    assert [p.name for p in bad.parameters if p.status == "FAIL"] == [name]
    [f] = [f for f in bad.findings if f.severity == "error"]
    assert f.node == name and f"worst {list(index)}" in f.detail and "off by 0.05" in f.detail
    # the same archive through the CI command against that server
    np.savez(tmp_path / "grads.npz", **grads)
    code, out, err = _run("client", str(EXAMPLES / "mlp_cross_entropy.json"), "--server", server.target,
                          "--claimed", str(tmp_path / "grads.npz"))
    assert code == 1, err
    assert f"node '{name}' (input): gradient_mismatch — its claimed gradient" in out


def test_claims_written_in_a_json_graph_file_are_verified(tmp_path):
    graph, x, w = chain_graph()
    grads, adjoints = chain_backward(x, w, lambda t: 1 - t)  # tanh's rule wrong
    tensor = lambda a: {"shape": list(np.shape(a)), "data": np.ravel(a).tolist()}  # noqa: E731
    graph["claimed"] = {"gradients": {k: tensor(v) for k, v in grads.items()},
                        "adjoints": {k: tensor(v) for k, v in adjoints.items()}}
    (tmp_path / "chain.json").write_text(json.dumps(graph))
    code, out, err = _run("svc", str(tmp_path / "chain.json"), "--format", "json")
    assert code == 1, err
    report = json.loads(out)
    assert report["subject"] == "claimed"
    assert [(f["node"], f["cause"]) for f in report["findings"] if f["severity"] == "error"] == [("t", "rule_error")]


# ---- bad claims: one line naming the field, exit 2 / INVALID_ARGUMENT -----------------------------------

BAD = [
    ({"ww": np.array(6.0), "x": np.array(9.0)}, "claimed gradient 'ww': names no parameter (an input with "
     "requires_grad) of the graph (did you mean 'w'?)"),
    ({"w": np.array([6.0]), "x": np.array(9.0)}, "claimed gradient 'w': has shape [1], the parameter has shape []"),
    ({"w": np.array(np.inf), "x": np.array(9.0)}, "claimed gradient 'w': holds 1 NaN/Inf value(s), first inf at "
     "index []"),
    ({"w": np.array(6.0), "adjoint:q": np.array(1.0)},
     "claimed adjoint 'q': names no node of the graph (names: 'L', 'a', 'z')"),
]


@pytest.mark.parametrize("cmd", ["svc", "client"])
def test_bad_claims_exit_2_with_one_line(cmd, tmp_path):
    for k, (arrays, message) in enumerate(BAD):
        np.savez(tmp_path / f"bad{k}.npz", **arrays)
        code, out, err = _run(cmd, SEED, "--claimed", str(tmp_path / f"bad{k}.npz"))
        assert code == 2, (message, out, err)
        assert message in out + err and "Traceback" not in out + err
    (tmp_path / "text.npz").write_text("w = 6")
    code, out, err = _run(cmd, SEED, "--claimed", str(tmp_path / "text.npz"))
    assert code == 2 and err.strip().endswith("--claimed: " + str(tmp_path / "text.npz") +
                                              ": not an .npz archive (np.savez writes one)")
    code, out, err = _run(cmd, str(EXAMPLES), "--claimed", str(tmp_path / "bad0.npz"))
    assert code == 2 and "claimed gradients are one graph's: give one graph file" in err


def test_bad_claims_over_grpc_are_invalid_argument(server):
    channel = grpc.insecure_channel(server.target)
    stub = service_pb2_grpc.GradCheckServiceStub(channel)
    try:
        for arrays, message in BAD:
            grads = {k: v for k, v in arrays.items() if not k.startswith("adjoint:")}
            adjoints = {k[len("adjoint:"):]: v for k, v in arrays.items() if k.startswith("adjoint:")}
            request = service_pb2.VerifyRequest(graph=with_claims(read_graph(SEED), claims_message(grads, adjoints)))
            with pytest.raises(grpc.RpcError) as info:
                stub.Verify(request, timeout=60)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == message
    finally:
        channel.close()
