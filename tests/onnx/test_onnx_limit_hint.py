"""Issue 22 item 3: an ONNX model over a limit is refused in one line that says which flag raises it
(in-process, where the limit is the user's to raise); the server's refusal names the limit in the
error (LimitError.limit) but no flag."""
from __future__ import annotations

import sys

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from gradcheck.v1 import service_pb2  # noqa: E402
from gradcheck_svc.errors import LimitError  # noqa: E402
from gradcheck_svc.limits import ServerLimits  # noqa: E402
from gradcheck_svc.outcome import report_of  # noqa: E402
from gradcheck_svc.request import run_request  # noqa: E402
from grpc_helpers import ROOT, _env  # noqa: E402
import forked_cli


def _model() -> bytes:
    """y = x @ W, x [1, 4], W [4, 3]: 20 elements with y and the loss."""
    w = helper.make_tensor("W", TensorProto.DOUBLE, [4, 3], [0.1 * i for i in range(12)])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "small",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _cli(path, *flags):
    return forked_cli.run("gradcheck_svc.cli", "verify", path, *flags, env=_env(), cwd=ROOT, timeout=120)


@pytest.mark.parametrize(("flags", "expected"), [
    (("--max-elements", "10"), "graph holds 20 elements (inputs and node outputs), the limit is 10 (raise it with "
                               "--max-elements)"),
    (("--max-message-bytes", "100"), "the limit is 100 (raise it with --max-message-bytes)"),
    (("--max-nodes", "1"), "nodes, the limit is 1 (raise it with --max-nodes)"),
])
def test_in_process_refusal_names_the_flag_in_one_line(tmp_path, flags, expected):
    path = tmp_path / "small.onnx"
    path.write_bytes(_model())
    r = _cli(path, *flags)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("gradcheck-svc: error: ") and line.endswith(expected), line
    assert line.count("raise it with") == 1
    assert _cli(path).returncode == 0  # within the defaults it verifies


def test_the_server_names_the_limit_not_a_flag():
    request = service_pb2.VerifyRequest(onnx_model=_model())
    with pytest.raises(LimitError) as err:
        report_of(run_request(request, ServerLimits(max_elements=10)))
    assert err.value.limit == "max_elements"
    assert "graph holds 20 elements (inputs and node outputs), the limit is 10" in err.value.message
    assert "raise it" not in err.value.message


def test_the_ci_command_in_process_names_the_amount_and_the_flag_too(tmp_path, capsys):
    from gradcheck_client.cli import main as ci_main

    path = tmp_path / "small.onnx"
    path.write_bytes(_model())
    assert ci_main(["verify", str(path), "--max-elements", "10"]) == 2
    out = capsys.readouterr().out
    assert "INVALID: node 'y': graph holds 20 elements (inputs and node outputs), the limit is 10 (raise it with " \
           "--max-elements)" in out, out
