"""ONNX through every door: `gradcheck-svc import-onnx`, `gradcheck-svc verify MODEL.onnx`,
`gradcheck verify MODEL.onnx` (the CI command, in-process and over gRPC), VerifyRequest.onnx_model
over a real server; and bad models: each a one-line error, exit 2 / INVALID_ARGUMENT."""
from __future__ import annotations

import json
import os

import grpc
import numpy as np
import pytest

from onnx_helpers import DATA, onnx

from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_client.cli import main as ci_main
from gradcheck_core.graphio import load_graph as read_graph_file
from gradcheck_svc.cli import main
from gradcheck_svc.graph import load_graph
from gradcheck_svc.onnx_import import import_onnx
from gradcheck_svc.onnx_import.importer import ImportOptions
from grpc_helpers import module_server

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SQUEEZENET = DATA / "light" / "light_squeezenet.onnx"


def tiny_mlp(opset: int = 17):
    """y = softmax(relu(x @ W1 + b1) @ W2), with float initializers W1, b1, W2."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W1", (4, 5)), ("b1", (5,)), ("W2", (5, 3)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


# --- import-onnx ---------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".pb", ".json"])
def test_import_onnx_writes_a_graph_that_loads(tmp_path, capsys, suffix):
    out = tmp_path / f"squeezenet{suffix}"
    assert main(["import-onnx", str(SQUEEZENET), "-o", str(out), "--params", "conv1_b_0,fire6/squeeze1x1_w_0",
                 "--loss", "cotangent", "--loss-output", "r65"]) == 0
    assert "-> " in capsys.readouterr().err
    written = load_graph(read_graph_file(out))
    direct = load_graph(import_onnx(SQUEEZENET, ImportOptions(params="conv1_b_0,fire6/squeeze1x1_w_0",
                                                              loss="cotangent", output="r65")))
    assert written.parameters == direct.parameters == ["conv1_b_0", "fire6/squeeze1x1_w_0"]
    assert [n.op.name for n in written.nodes] == [n.op.name for n in direct.nodes]
    assert written.node("r33").op.name == "conv"  # ONNX value names are the node names
    w = written.inputs["fire6/squeeze1x1_w_0"].value  # a ConstantOfShape weight, made a parameter
    assert w.shape == (48, 256, 1, 1) and np.all(w == np.float32(0.02))


def test_inputs_from_tensor_files_and_seed(tmp_path):
    model = tiny_mlp()
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    (tmp_path / "x.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    out = tmp_path / "g.json"
    assert main(["import-onnx", str(path), "-o", str(out), "--input", f"x={tmp_path / 'x.pb'}"]) == 0
    graph = load_graph(read_graph_file(out))
    np.testing.assert_array_equal(graph.inputs["x"].value, x)
    assert graph.parameters == ["W1", "b1", "W2"]  # float initializers of rank >= 1 by default (--params weights)
    seeded = [load_graph(import_onnx(path, ImportOptions(input_seed=s))).inputs["x"].value for s in (3, 3, 4)]
    np.testing.assert_array_equal(seeded[0], seeded[1])
    assert not np.array_equal(seeded[0], seeded[2]) and 0 <= seeded[0].min() and seeded[0].max() < 1


@pytest.mark.parametrize("loss, check", [
    ("sum", lambda y, c, L: np.isclose(L, y.sum())),  # softmax rows sum to 1: L = 2
    ("mean", lambda y, c, L: np.isclose(L, y.mean())),
    ("cotangent", lambda y, c, L: np.isclose(L, (y * c).sum())),
])
def test_loss_reductions(loss, check):
    from onnx_helpers import engine_values

    msg = import_onnx(tiny_mlp().SerializeToString(), ImportOptions(loss=loss, cotangent_seed=5))
    values = engine_values(msg)
    c = np.random.default_rng(5).standard_normal((2, 3))
    assert check(values["y"], c, float(values[msg.output]))


# --- verify MODEL.onnx: SqueezeNet (light) with projection FD -----------------------------

SQUEEZE_FLAGS = ["--fd", "projection", "--directions", "4", "--dtype", "float64", "--loss", "cotangent",
                 "--loss-output", "r65", "--params", "conv1_b_0,fire6/squeeze1x1_w_0,fire9/squeeze1x1_b_0",
                 "--format", "json"]


def test_verify_squeezenet_passes(capsys):
    assert main(["verify", str(SQUEEZENET), *SQUEEZE_FLAGS]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "pass"
    assert {p["name"] for p in report["parameters"]} == {"conv1_b_0", "fire6/squeeze1x1_w_0", "fire9/squeeze1x1_b_0"}
    assert all(p["fd_mode"] == "projection" for p in report["parameters"])


def test_fault_on_a_middle_convs_cached_input_is_caught_and_named(capsys):
    # r32 is what the middle Conv (output r33, weight fire6/squeeze1x1_w_0) reads; with integrity
    # checking off, only the gradient comparison and localization can find it
    assert main(["verify", str(SQUEEZENET), *SQUEEZE_FLAGS, "--fault", "r32:scale:1.5", "--integrity", "off"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "fail"
    failed = {p["name"] for p in report["parameters"] if not p["passed"]}
    assert failed == {"fire6/squeeze1x1_w_0"}
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors and errors[0]["node"] == "r33" and errors[0]["op"] == "conv"


# --- the CI command and gRPC ---------------------------------------------------------------


def test_ci_command_verifies_onnx_in_process(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_mlp(), path)
    assert ci_main(["verify", str(path), "--loss", "cotangent", "--params", "initializers,inputs", "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["status"] == "pass"
    assert {p["name"] for p in result["report"]["parameters"]} == {"x", "W1", "b1", "W2"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def test_onnx_over_grpc(server, tmp_path, capsys):
    channel = grpc.insecure_channel(server.target)
    stub = service_pb2_grpc.GradCheckServiceStub(channel)
    request = service_pb2.VerifyRequest(id="onnx-1", onnx_model=tiny_mlp().SerializeToString(),
                                        onnx=service_pb2.OnnxImport(loss="cotangent", params="W1,b1"))
    report = stub.Verify(request, timeout=60).report
    assert report.verdict == "pass" and [p.name for p in report.parameters] == ["W1", "b1"]
    [rec] = [r for r in server.log_lines() if r.get("id") == "onnx-1"]  # the request log names the model's size
    assert rec["onnx_model_bytes"] == len(request.onnx_model) and "nodes" not in rec and rec["verdict"] == "pass"
    request = service_pb2.VerifyRequest(onnx_model=b"\x08\x07garbage")
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid ONNX model" in info.value.details()
    channel.close()
    # the CI command over the same server
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_mlp(), path)
    assert ci_main(["verify", str(path), "--server", server.target, "--loss", "cotangent", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "pass"


# --- bad models: one line, exit 2 -------------------------------------------------------------


def test_truncated_and_non_onnx_files(tmp_path, capsys, monkeypatch):
    data = tiny_mlp().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.onnx").write_text("this is not a model\n")
    monkeypatch.chdir(tmp_path)  # a short path: an echoed path is cut at its fixed length
    for name in ("cut.onnx", "text.onnx"):
        assert main(["verify", name]) == 2
        _one_line_error(capsys, name, "not a valid ONNX model")
    os.mkfifo("fifo.onnx")  # import-onnx read it and waited for a writer for ever (verify refused it)
    assert main(["import-onnx", "fifo.onnx", "-o", "g.pb"]) == 2
    _one_line_error(capsys, "'fifo.onnx' is not a regular file")


def test_opset_out_of_range(tmp_path, capsys):
    model = tiny_mlp()
    model.opset_import[0].version = 99
    path = tmp_path / "future.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["import-onnx", str(path), "-o", str(tmp_path / "g.pb")]) == 2
    _one_line_error(capsys, "opset 99 is outside the supported range")


def test_every_unsupported_op_is_listed_with_count_and_first_node(tmp_path, capsys):
    nodes = [helper.make_node("Shrink", ["x"], ["e1"], name="shrink_a"), helper.make_node("Relu", ["e1"], ["r"]),
             helper.make_node("Shrink", ["r"], ["e2"], name="shrink_b"),
             helper.make_node("Hardmax", ["e2"], ["y"], name="hardmax_1")]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    path = tmp_path / "unsupported.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["verify", str(path)]) == 2
    _one_line_error(capsys, "unsupported ONNX ops:", "Shrink x2 (first: node 'shrink_a')",
                    "Hardmax x1 (first: node 'hardmax_1')")


def test_missing_external_data(tmp_path, capsys):
    model = tiny_mlp()
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    assert main(["import-onnx", str(path), "-o", str(tmp_path / "ok.pb")]) == 0  # present: fine
    capsys.readouterr()
    (tmp_path / "ext.data").unlink()
    assert main(["import-onnx", str(path), "-o", str(tmp_path / "g.pb")]) == 2
    _one_line_error(capsys, "external data file 'ext.data'", "is missing")


def test_a_model_without_outputs_or_with_a_negative_dimension_is_refused():
    """Were an internal error (IndexError: no output to reduce) and an input silently made of size 1."""
    from gradcheck_svc.errors import GraphError

    model = tiny_mlp()
    del model.graph.output[:]
    with pytest.raises(GraphError, match="the model declares no output: name the value the loss reduces"):
        import_onnx(model.SerializeToString())
    assert import_onnx(model.SerializeToString(), ImportOptions(output="y")).output  # named: imported
    model = tiny_mlp()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -2
    with pytest.raises(GraphError, match=r"input 'x' declares shape \[-2, 4\] with a negative dimension"):
        import_onnx(model.SerializeToString())


def test_a_static_zero_dimension_is_kept_and_an_input_given_for_it_must_match():
    """A declared 0 was drawn at size 1 (a different model verified) and, given with --input, matched any
    size; the engine verifies empty tensors, so the model's declared size is the one imported."""
    from gradcheck_svc.errors import GraphError

    model = tiny_mlp()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    graph = import_onnx(model.SerializeToString())
    assert list(next(i for i in graph.inputs if i.name == "x").value.shape) == [0, 4]
    given = import_onnx(model.SerializeToString(), ImportOptions(inputs={"x": np.zeros((0, 4), np.float32)}))
    assert list(next(i for i in given.inputs if i.name == "x").value.shape) == [0, 4]
    with pytest.raises(GraphError, match=r"input 'x' has shape \[2, 4\], the model declares \[0, 4\]"):
        import_onnx(model.SerializeToString(), ImportOptions(inputs={"x": np.ones((2, 4), np.float32)}))


def test_a_float16_model_imports_without_a_warning():
    """Its weights compared with the mask magnitude (1e30, beyond float16) printed numpy's RuntimeWarning
    "overflow encountered in cast" on stderr of a run that passed: not the one line a user reads."""
    import warnings

    model = tiny_mlp()
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for vi in (*model.graph.input, *model.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert import_onnx(model.SerializeToString()).inputs


def test_bad_import_flags(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_mlp(), path)
    for flags, needle in ((["--params", "nope"], "'nope' is not a float initializer"),
                          (["--loss-output", "zz"], "no output or value 'zz'"),
                          (["--input", "x"], "is not NAME=FILE.pb"),
                          (["--input", f"q={path}"], "not a serialized TensorProto")):
        assert main(["verify", str(path), *flags]) == 2, flags
        _one_line_error(capsys, needle)


def test_import_flags_without_a_model_are_refused_not_ignored(capsys):
    """A graph file verifies its own values: an import flag given with no .onnx path would change nothing
    (an --input that looks honoured), so every door refuses it before verifying anything."""
    from conftest import EXAMPLES

    seed = str(EXAMPLES / "seed.json")
    for command, argv in ((main, ["verify", seed, "--input", "x=x.pb"]), (main, ["plan-memory", seed, "--params", "all"]),
                          (ci_main, ["verify", seed, "--loss", "mean"])):
        assert command(argv) == 2, argv
        _one_line_error(capsys, f"{argv[2]}: applies to ONNX models (.onnx) only")


def test_verify_onnx_writes_its_html_page(tmp_path, capsys):
    """The page draws the graph that was verified (the imported model), not the .onnx bytes."""
    path, page = tmp_path / "tiny.onnx", tmp_path / "tiny.html"
    onnx.save(tiny_mlp(), path)
    assert main(["verify", str(path), "--loss", "cotangent", "--html", str(page)]) == 0
    html = page.read_text()
    assert "<html" in html.lower() and "W1" in html and "MatMul" not in capsys.readouterr().err
