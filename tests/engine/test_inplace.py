"""In-place nodes: validation, buffer semantics, version counters and hazards.

torch is the reference for what an eager framework does with the same
program: the same values, the same gradients, and the same refusal when a
value the backward needs was overwritten."""
import os

import numpy as np
import pytest
from conftest import LazyModule

import forked_cli

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_svc.errors import GraphError, InplaceHazardError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import VerifyOptions, verify

from conftest import EXAMPLES, ROOT

W = [1.5, -2.0, 0.5, -0.25]
X = [2.0, 1.0, -3.0, 4.0]
C = [1.0, 2.0, 3.0, 4.0]


def square_then_relu_(unused_write=False):
    """z = w*x; a = z**2; z.relu_(); loss = sum(a + z) -- the square's saved input is overwritten."""
    b = GraphBuilder("hazard")
    z = b.node("mul", b.input("w", W, requires_grad=True), b.input("x", X), name="z")
    a = b.node("square", z, name="a")
    r = b.node("relu", z, name="r", inplace=True)
    b.output(b.node("sum", a if unused_write else b.node("add", a, r, name="s"), name="L"))
    return load_graph(b.build())


def test_hazard_stops_with_both_nodes_and_versions_like_torch():
    with pytest.raises(InplaceHazardError) as exc:
        verify(square_then_relu_())
    msg = exc.value.message
    assert msg.startswith("node 'a': a value needed for its gradient has been modified by an inplace operation")
    assert "'z' was saved at version 0 and is now at version 1" in msg and "node 'r'" in msg
    w = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    z = w * torch.tensor(X, dtype=torch.float64)
    a = z.square()
    z.relu_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (a + z).sum().backward()


def test_a_write_whose_result_is_unused_still_overwrites():
    with pytest.raises(InplaceHazardError, match="node 'r'"):
        verify(square_then_relu_(unused_write=True))


def test_allowed_hazard_computes_the_wrong_gradient_and_is_diagnosed():
    report = verify(square_then_relu_(), VerifyOptions(allow_inplace_hazards=True))
    z = np.multiply(W, X)
    silently_wrong = 2 * np.maximum(z, 0) * X + (z > 0) * X  # the square's backward read relu(z)
    right = 2 * z * X + (z > 0) * X
    [p] = report.parameters
    np.testing.assert_allclose(p.gradient, silently_wrong)
    np.testing.assert_allclose(p.fd.reference, right, rtol=1e-7)
    [f] = [f for f in report.findings if f.severity == "error"]
    assert (f.node, f.op, f.cause) == ("a", "square", "inplace_overwrite")
    assert "overwritten in place by node 'r'" in f.detail and "version 0 → 1" in f.detail
    assert report.verdict == "fail"


def test_inplace_relu_over_relu_output_is_safe():
    report = verify(load_graph(EXAMPLES / "inplace_relu.json"))
    assert report.verdict == "pass"
    [f] = [f for f in report.findings if f.cause == "inplace_overwrite"]
    assert (f.node, f.cause, f.severity) == ("y", "inplace_overwrite", "info")
    # relu over relu's zeros sits exactly on the second relu's kink: a note, not a failure
    [note] = [f for f in report.findings if f.cause == "nondifferentiable_point"]
    assert (note.node, note.severity) == ("y2", "info")
    assert "unchanged: safe" in f.detail
    w = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    (w.relu().relu() * torch.tensor(C, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(report.parameters[0].gradient, w.grad.numpy())


def test_readers_after_a_write_see_the_new_value_like_torch():
    """z = w*x; q = z + 1; z.neg_(); z.add_(c); loss = sum(z * z) + sum(q * q), as torch runs it."""
    b = GraphBuilder("order")
    z = b.node("mul", b.input("w", W, requires_grad=True), b.input("x", X), name="z")
    q = b.node("add", z, b.input("one", 1.0), name="q")  # reads z before the writes
    r = b.node("neg", z, name="r", inplace=True)
    b.node("add", r, b.input("c", C), name="m", inplace=True)
    sq = b.node("mul", z, z, name="sq")  # declared on z, runs after both writes: reads their result
    b.output(b.node("add", b.node("sum", sq, name="s1"), b.node("sum", b.node("square", q, name="q2"), name="s2"),
                    name="L"))
    graph = load_graph(b.build())
    assert graph.node("sq").inputs == ("m", "m") and graph.node("q").inputs == ("z", "one")
    report = verify(graph)
    w = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    zt = w * torch.tensor(X, dtype=torch.float64)
    qt = zt + 1.0
    zt.neg_()
    zt.add_(torch.tensor(C, dtype=torch.float64))
    loss = (zt * zt).sum() + (qt * qt).sum()
    loss.backward()
    assert report.loss == pytest.approx(loss.item(), rel=1e-12)
    assert report.verdict == "pass" and report.findings == []
    np.testing.assert_allclose(report.parameters[0].gradient, w.grad.numpy(), rtol=1e-12)


def test_writes_never_touch_the_graphs_input_arrays_or_views():
    b = GraphBuilder("views")
    w = b.input("w", [[1.0, -2.0], [3.0, -4.0]], requires_grad=True)
    c = b.input("c", [[0.5, -0.5], [-1.5, 2.0]])
    acc = b.node("add", c, w, name="acc", inplace=True)  # c += w: c is a graph input without grad
    flat = b.node("reshape", acc, name="flat", shape=[4])  # a view of acc's buffer
    b.node("relu", acc, name="clipped", inplace=True)  # must not change `flat`
    total = b.node("add", b.node("sum", flat, name="s1"), b.node("sum", acc, name="s2"), name="L")
    b.output(total)
    graph = load_graph(b.build())
    before = graph.inputs["c"].value.copy()
    report = verify(graph)
    s = np.add([[0.5, -0.5], [-1.5, 2.0]], [[1.0, -2.0], [3.0, -4.0]])
    assert report.loss == pytest.approx(s.sum() + np.maximum(s, 0).sum())
    np.testing.assert_array_equal(graph.inputs["c"].value, before)
    assert report.verdict == "pass", report.to_text()


def _graph(build):
    b = GraphBuilder("bad")
    build(b)
    return b.build()


BAD = {
    "leaf that requires grad": (
        lambda b: b.output(b.node("sum", b.node("relu", b.input("w", [1.0, -1.0], requires_grad=True),
                                                name="r", inplace=True), name="L")),
        "node 'r': in-place write into graph input 'w', which requires grad"),
    "shape change": (
        lambda b: b.output(b.node("sum", b.node("sum", b.node("exp", b.input("w", [1.0, 2.0], requires_grad=True),
                                                              name="e"), name="t", inplace=True), name="L")),
        "node 't': in-place result (float []) does not fit the buffer of its first input 'e' (float [2])"),
    "broadcast growth": (
        lambda b: b.output(b.node("sum", b.node("add", b.node("exp", b.input("w", 1.0, requires_grad=True), name="e"),
                                                b.input("v", [1.0, 2.0]), name="t", inplace=True), name="L")),
        "node 't': in-place result (float [2]) does not fit the buffer of its first input 'e' (float [])"),
    "dtype change": (
        lambda b: b.output(b.node("sum", b.node("where", b.input("m", [True, False]),
                                                b.input("w", [1.0, 2.0], requires_grad=True), b.input("z", [0.0, 0.0]),
                                                name="t", inplace=True), name="L")),
        "node 't': in-place result (float [2]) does not fit the buffer of its first input 'm' (bool [2])"),
    "racing writers": (
        lambda b: (b.node("exp", b.input("w", [1.0, 2.0], requires_grad=True), name="e"),
                   b.node("relu", "e", name="r1", inplace=True), b.node("neg", "e", name="r2", inplace=True),
                   b.output(b.node("sum", b.node("add", "r1", "r2", name="s"), name="L"))),
        "node 'r2': in-place writers 'r1' and 'r2' race on the buffer of 'e'"),
    "nothing to write into": (
        lambda b: b.output(b.node("sum", b.node("mul", b.node("constant", name="k", value=[1.0], inplace=True),
                                                b.input("w", [1.0], requires_grad=True)), name="L")),
        "node 'k': op 'constant' has no input to write into in place"),
}


def _svc_verify(path, *flags):
    """`gradcheck-svc verify PATH FLAGS` in a fork of this process (tests/forked_cli.py: its main, environment,
    pipes and exit status, without an interpreter's start-up)."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'clients' / 'python'}")
    return forked_cli.run("gradcheck_svc.cli", "verify", path, *flags, env=env, timeout=60)


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_invalid_inplace_nodes_are_clear_graph_errors(case, tmp_path):
    build, message = BAD[case]
    msg = _graph(build)
    with pytest.raises(GraphError) as exc:
        load_graph(msg)
    assert exc.value.message.startswith(message)
    path = tmp_path / "bad.pb"
    path.write_bytes(msg.SerializeToString())
    r = _svc_verify(path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr


def test_ordered_writers_on_one_buffer_are_fine():
    b = GraphBuilder("chain")
    e = b.node("mul", b.input("w", [1.0, -2.0], requires_grad=True), b.input("x", [0.5, 2.0]), name="e")
    r1 = b.node("neg", e, name="r1", inplace=True)
    b.node("add", r1, b.input("k", [1.0, 1.0]), name="r2", inplace=True)
    b.output(b.node("sum", b.node("square", e, name="m"), name="L"))  # reads the latest: (1 - w*x)**2
    graph = load_graph(b.build())
    assert graph.node("m").inputs == ("r2",)
    report = verify(graph)
    assert report.verdict == "pass" and report.findings == []
    w, x = np.array([1.0, -2.0]), np.array([0.5, 2.0])
    np.testing.assert_allclose(report.parameters[0].gradient, -2 * (1 - w * x) * x)


def test_cli_hazard_exit_codes_and_findings():
    import json

    path = EXAMPLES / "faults" / "inplace_square.json"
    r = _svc_verify(path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gradcheck-svc: error: node 'a': a value needed for its gradient has been modified")
    r = _svc_verify(path, "--allow-inplace-hazards", "--format", "json")
    assert r.returncode == 1
    [f] = json.loads(r.stdout)["findings"]
    assert (f["node"], f["op"], f["cause"], f["severity"]) == ("a", "square", "inplace_overwrite", "error")
    assert f["worst_element"] == {"index": [1], "engine": 0.0, "reference": -2.0}  # relu(z) read for z = -2
