"""Issue 34 item 4: a model saved with external data (`onnx.save(..., save_as_external_data=True)`, the
torch exporter's default for big models) verifies the same in process and through a real server (every
reader embeds the data beside the file in the bytes it sends), and every limit measures the external
weights: a model whose .onnx file is tiny but whose data is not is refused by the request limit, with
the amount it needs and, in process, the flag that raises it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from onnx_helpers import onnx

from gradcheck_client.cli import main as ci_main
from gradcheck_core.onnx_files import model_bytes
from gradcheck_svc.cli import main as svc_main
from grpc_helpers import module_server

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

LIMIT = 64 * 1024  # the server's and the in-process request limit in these tests


def mlp(hidden: int):
    """y = tanh(x @ W1 + b1) @ W2, float64 weights (hidden * 9 + ... elements)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(s) / 3, n)
             for n, s in (("W1", (4, hidden)), ("b1", (hidden,)), ("W2", (hidden, 3)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Tanh", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def save_external(model, path):
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1", "--max-message-bytes", str(LIMIT))


def _json(capsys, code: int, argv: list) -> dict:
    assert ci_main(argv) == code, capsys.readouterr().err
    [result] = json.loads(capsys.readouterr().out)
    return result


def test_external_weights_verify_the_same_in_process_and_through_a_server(server, tmp_path, capsys):
    path = save_external(mlp(16), tmp_path / "mlp.onnx")
    assert b"location" in path.read_bytes() and (tmp_path / "mlp.onnx.data").stat().st_size == 8 * (64 + 16 + 48)
    flags = ["--loss", "cotangent", "--json"]
    local = _json(capsys, 0, ["verify", str(path), *flags])
    remote = _json(capsys, 0, ["verify", str(path), *flags, "--server", server.target])
    for result in (local, remote):
        assert result["status"] == "pass", result
    keep = ("verdict", "loss", "dtype")
    assert {k: remote["report"][k] for k in keep} == {k: local["report"][k] for k in keep}
    for result in (local, remote):
        assert {p["name"]: p["shape"] for p in result["report"]["parameters"]} == \
            {"W1": [4, 16], "b1": [16], "W2": [16, 3]}
    # the loss is the one the weights in the data file give: the same model saved embedded agrees
    onnx.save(mlp(16), tmp_path / "embedded.onnx")
    embedded = _json(capsys, 0, ["verify", str(tmp_path / "embedded.onnx"), *flags, "--server", server.target])
    assert embedded["report"]["loss"] == remote["report"]["loss"]
    # the Python client, given the path, sends the same
    from gradcheck_client import Client

    with Client(server.target, timeout=120) as client:
        report = client.verify(path)
    assert report.verdict == "pass" and sorted(p.name for p in report.parameters) == ["W1", "W2", "b1"]
    # the bytes every door sends: the model with its data in it, naming no file
    sent = onnx.load_model_from_string(model_bytes(path))
    assert all(t.data_location == TensorProto.DEFAULT and not t.external_data for t in sent.graph.initializer)
    assert numpy_helper.to_array(sent.graph.initializer[0]).tolist() == \
        numpy_helper.to_array(mlp(16).graph.initializer[0]).tolist()


def test_every_limit_counts_the_external_weights(server, tmp_path, capsys):
    """W1, b1, W2 hold 8 * 4096 doubles (256 KiB) beside a model file of a few hundred bytes."""
    path = save_external(mlp(4096), tmp_path / "wide.onnx")
    assert path.stat().st_size < 1000
    # through the server: the request it receives holds the weights, over its limit
    result = _json(capsys, 2, ["verify", str(path), "--json", "--server", server.target])
    assert result["status"] == "invalid"
    assert f"the limit is {LIMIT}" in result["error"] and "request is " in result["error"], result
    needed = int(result["error"].split("request is ")[1].split()[0])
    assert needed > 8 * 4096 * 8  # the weights are counted, not just the file
    # in process, the same limit: refused before the data is read, the amount and the flag in one line
    for main, prog in ((svc_main, "gradcheck-svc"), (ci_main, "gradcheck")):
        code = main(["verify", str(path), "--max-message-bytes", str(LIMIT)])
        captured = capsys.readouterr()
        assert code == 2
        text = captured.err if prog == "gradcheck-svc" else captured.out
        line = next(ln for ln in text.splitlines() if "external data" in ln)
        assert f"external data alone is {8 * 4096 * 8} bytes, over the request limit of {LIMIT}" in line, line
        assert line.endswith("(raise it with --max-message-bytes)"), line
    # and the element limit sees the external tensors too
    assert svc_main(["verify", str(path), "--max-elements", "1000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("external tensors alone hold 32768 elements, over the limit of 1000 (raise it with "
                        "--max-elements)"), err
    # embedded, over both limits: one line says both amounts (one round of raising, not two)
    onnx.save(mlp(4096), tmp_path / "wide_embedded.onnx")
    assert svc_main(["verify", str(tmp_path / "wide_embedded.onnx"), "--max-message-bytes", str(LIMIT),
                     "--max-elements", "1000"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"the limit is {LIMIT} (raise it with --max-message-bytes); its initializers alone hold 32768 " \
           "elements, over the limit of 1000 too (raise it with --max-elements)" in line, line
    # raised, the same model verifies
    assert svc_main(["verify", str(path), "--max-message-bytes", str(8 * LIMIT), "--fd", "projection"]) == 0
    capsys.readouterr()


def test_a_raw_request_naming_a_file_is_refused_with_the_way_to_send_it(server, tmp_path):
    import grpc

    from gradcheck.v1 import service_pb2, service_pb2_grpc

    path = save_external(mlp(4), tmp_path / "raw.onnx")
    with grpc.insecure_channel(server.target) as channel:
        stub = service_pb2_grpc.GradCheckServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Verify(service_pb2.VerifyRequest(onnx_model=path.read_bytes()), timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "refers to external data" in info.value.details() and "which embeds it" in info.value.details()


def test_torch_default_export_with_external_data(server, tmp_path, capsys):
    """torch.onnx.export(dynamo=True)'s default, external_data=True: its weights in model.onnx.data."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3)).double().eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(module, (torch.randn(2, 4, dtype=torch.float64),), str(path), dynamo=True,
                      external_data=True)
    capsys.readouterr()  # the exporter's progress lines
    assert (tmp_path / "model.onnx.data").stat().st_size > 0  # the weights are beside it
    local = _json(capsys, 0, ["verify", str(path), "--json"])
    remote = _json(capsys, 0, ["verify", str(path), "--json", "--server", server.target])
    assert local["status"] == remote["status"] == "pass"
    assert local["report"]["loss"] == remote["report"]["loss"]
    names = {s["name"] for p in remote["report"]["parameters"] for s in p.get("source_names", [])} | \
        {p["name"] for p in remote["report"]["parameters"]}
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= names, names
