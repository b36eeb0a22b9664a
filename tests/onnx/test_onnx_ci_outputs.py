"""ONNX models through every CI output (issue 21 item 4): `gradcheck verify MODEL.onnx` with --html,
--summary-md, $GITHUB_STEP_SUMMARY and --junit, in-process and with --server, for a model with an error
finding (a planted fault on a value with a hostile name) next to a file that is not a model. Every output
is written and says the same thing; the client never holds an ONNX model's graph, so nothing is drawn
for it and the page says why."""
from __future__ import annotations

import contextlib
import io
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from grpc_helpers import module_server
from hostile_outputs import assert_inert_markdown, recognisable
from onnx_helpers import onnx

from gradcheck_client.cli import NO_ONNX_DRAWING
from gradcheck_client.cli import main as ci_main
from gradcheck_core.outputs.html import h
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# an ONNX value name is any string: this one is Markdown, HTML and a bidi override at once
HOSTILE = "t<!--[✅ all gradients verified](//evil.example)\u202e<b>x</b>"


def hostile_model():
    """y = tanh(x @ W1) @ W2; the tanh output (saved by the second MatMul) carries the hostile name."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W1", (3, 4)), ("W2", (4, 2)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Tanh", ["h"], [HOSTILE]),
             helper.make_node("MatMul", [HOSTILE, "W2"], ["y"])]
    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    onnx.save(hostile_model(), d / "model.onnx")
    (d / "broken.onnx").write_bytes(b"not a model")
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def run_ci(models, tmp_path, *extra):
    out = {k: tmp_path / f for k, f in (("md", "summary.md"), ("step", "step.md"), ("junit", "junit.xml"),
                                        ("html", "page.html"))}
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        mp.setenv("GITHUB_STEP_SUMMARY", str(out["step"]))
        code = ci_main(["verify", str(models / "model.onnx"), str(models / "broken.onnx"), "--fault",
                        f"{HOSTILE}:scale", "--summary-md", str(out["md"]), "--junit", str(out["junit"]),
                        "--html", str(out["html"]), *extra])
    return code, out, stdout.getvalue(), stderr.getvalue()


def check_outputs(out, models) -> str:
    md = out["md"].read_text()
    assert out["step"].read_text() == md  # the step summary is written, the same document
    assert "| ❌ fail |" in md and "| ⚠️ invalid |" in md and "1 fail, 1 invalid" in md
    assert "```mermaid" not in md  # no graph on this side to draw a neighbourhood from
    assert_inert_markdown(md, [HOSTILE])

    root = ET.parse(out["junit"]).getroot()
    cases = {c.get("name").rsplit("/", 1)[1]: c for c in root.iter("testcase")}
    assert root.get("tests") == "2" and root.get("failures") == "1" and root.get("errors") == "1"
    assert cases["model.onnx"].find("failure") is not None and cases["broken.onnx"].find("error") is not None
    props = [(p.get("name"), p.get("value")) for p in cases["model.onnx"].iter("property")]
    assert ("verdict", "fail") in props and ("cause", "cache_corruption") in props
    assert any(n == "node" and v.startswith(recognisable(HOSTILE)) for n, v in props), props

    page = out["html"].read_text()
    assert page.count("<section>") == 2 and "<strong>FAIL</strong>" in page
    assert h(NO_ONNX_DRAWING, 200) in page  # the model's graph is not drawn, and the page says why
    assert h(recognisable(HOSTILE)) in page and "<b>x</b>" not in page and "\u202e" not in page
    return md


def test_onnx_outputs_in_process(models, tmp_path):
    code, out, stdout, stderr = run_ci(models, tmp_path)
    assert code == 2, stderr  # the broken file is invalid input, which outranks the mismatch
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "gradcheck: 1 fail, 1 invalid"
    check_outputs(out, models)
    assert recognisable(HOSTILE) in stdout and "\u202e" not in stdout


def test_onnx_outputs_with_a_server_match_in_process(models, server, tmp_path):
    (tmp_path / "local").mkdir()
    local = run_ci(models, tmp_path / "local")[1]
    code, out, _, stderr = run_ci(models, tmp_path, "--server", server.target)
    assert code == 2, stderr
    md = check_outputs(out, models)
    assert md == local["md"].read_text()  # the same summary, wherever the model was verified
