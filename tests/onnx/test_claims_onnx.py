"""`--claimed` with an ONNX model (gradcheck_svc/onnx_import/claim_names.py): torch's own gradients of a real
model (`{n: p.grad for n, p in model.named_parameters()}`), keyed by torch names, checked against the exported
model's initializers through the importer's source_names -- merged biases summed, MatMul weights transposed --
through both verify commands and over gRPC (a real loopback server); one element corrupted fails naming that
torch parameter and element; what has no exact image is refused in one line."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402
from torch import nn  # noqa: E402

from gradcheck.v1 import service_pb2  # noqa: E402
from gradcheck_client import Client  # noqa: E402
from gradcheck_core.claims import claims_message, with_claims  # noqa: E402
from gradcheck_core.onnx_options import OnnxModel  # noqa: E402
from grpc_helpers import module_server  # noqa: E402
import forked_cli


class Net(nn.Module):
    """Three convs with zero biases (the TorchScript exporter merges them into one initializer), two Linear
    layers on a rank-4 input (MatMul: their weights stored transposed as onnx::MatMul_N), optionally a
    BatchNorm folded into a fourth conv (a derived tensor: no torch parameter's gradient)."""

    def __init__(self, bn: bool = False):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 1)
        self.conv4, self.bn4 = (nn.Conv2d(3, 3, 1, bias=False), nn.BatchNorm2d(3)) if bn else (None, None)
        self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 2)

    def forward(self, x):
        y = torch.tanh(self.conv1(x))
        y = torch.tanh(self.conv3(torch.tanh(self.conv2(y))))
        if self.conv4 is not None:
            y = torch.tanh(self.bn4(self.conv4(y)))
        return self.fc2(torch.tanh(self.fc1(y)))


def _exported(tmp, bn: bool = False):
    """(model path, --input flag, torch's gradients of sum(model(x)) by named_parameters() key)."""
    torch.manual_seed(0)
    model = Net(bn)
    with torch.no_grad():
        for conv in (model.conv1, model.conv2, model.conv3):
            conv.bias.zero_()
    model = model.eval().double()
    x = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (x,), f, dynamo=False)
    m = onnx.load_from_string(f.getvalue())
    inits = {t.name for t in m.graph.initializer}
    (xname,) = [vi.name for vi in m.graph.input if vi.name not in inits]
    (tmp / "net.onnx").write_bytes(f.getvalue())
    (tmp / "x.pb").write_bytes(numpy_helper.from_array(x.numpy(), xname).SerializeToString())
    model(x).sum().backward()  # the importer's default loss: sum of the first output
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    return tmp / "net.onnx", f"{xname}={tmp / 'x.pb'}", grads


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    return _exported(tmp_path_factory.mktemp("net"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def _run(cmd, *args):
    p = forked_cli.run("gradcheck_svc.cli" if cmd == "svc" else "gradcheck_client.cli", "verify", *args, timeout=300)
    return p.returncode, p.stdout, p.stderr


def _corrupt(grads, name, index, by=1e-3):
    out = {k: v.copy() for k, v in grads.items()}
    out[name][index] += by
    return out


@pytest.mark.parametrize("cmd", ["svc", "client"])
def test_torchs_own_gradients_by_torch_name_pass_and_a_corrupted_element_fails_naming_it(cmd, net, tmp_path):
    model, xflag, grads = net
    np.savez(tmp_path / "torch.npz", **grads)
    code, out, err = _run(cmd, model, "--input", xflag, "--claimed", tmp_path / "torch.npz")
    assert code == 0, out + err
    assert "PASS" in out and "subject: the claimed gradients" in out
    np.savez(tmp_path / "bad.npz", **_corrupt(grads, "fc1.weight", (3, 1)))  # stored transposed: [1, 3]
    code, out, err = _run(cmd, model, "--input", xflag, "--claimed", tmp_path / "bad.npz")
    assert code == 1, out + err
    [line] = [ln for ln in out.splitlines() if "gradient_mismatch —" in ln]
    assert "worst [1, 3] = fc1.weight[3, 1] (transposed): claimed 0.0734" in line and "off by 0.001" in line
    assert line.lstrip().startswith("node 'onnx::MatMul_")
    # a merged bias: the initializer's claim is the sum of the three torch gradients, one of them corrupted
    np.savez(tmp_path / "bad_bias.npz", **_corrupt(grads, "conv2.bias", (1,)))
    code, out, err = _run(cmd, model, "--input", xflag, "--claimed", tmp_path / "bad_bias.npz")
    assert code == 1, out + err
    [line] = [ln for ln in out.splitlines() if "gradient_mismatch —" in ln]
    assert line.lstrip().startswith("node 'conv1.bias'")
    assert "worst [1] of the sum of conv1.bias, conv2.bias, conv3.bias (merged by the exporter)" in line


def test_over_grpc_by_torch_name_and_by_initializer_name(net, server, tmp_path):
    model, xflag, grads = net
    name, path = xflag.split("=", 1)
    onnx_options = service_pb2.OnnxImport(inputs={name: open(path, "rb").read()})
    m = OnnxModel(model.read_bytes(), onnx_options)
    with Client(server.target, timeout=120) as client:
        report = client.verify(with_claims(m, claims_message(grads)))
        assert report.verdict == "pass" and report.data["subject"] == "claimed"
        by_init = {p["name"]: np.array(p["gradient"]).reshape(p["shape"]) for p in report.data["parameters"]}
        assert set(by_init) != set(grads)  # the model's names are not torch's (merged, transposed)
        report = client.verify(with_claims(m, claims_message(_corrupt(grads, "fc2.weight", (0, 4)))))
        assert report.verdict == "fail"
        [row] = [p for p in report.data["parameters"] if p["status"] != "ok"]
        assert row["source_names"][0]["name"] == "fc2.weight" and row["worst_index"] == [4, 0]
        # the initializers' own names, as the report gives them, are claims too
        assert client.verify(with_claims(m, claims_message(by_init))).verdict == "pass"
    # the CI command against that server: the same archive, the same verdict
    np.savez(tmp_path / "bad.npz", **_corrupt(grads, "fc2.weight", (0, 4)))
    code, out, err = _run("client", model, "--input", xflag, "--claimed", tmp_path / "bad.npz",
                          "--server", server.target)
    assert code == 1, out + err
    assert "= fc2.weight[0, 4] (transposed)" in out


@pytest.mark.parametrize("cmd", ["svc", "client"])
def test_what_cannot_be_mapped_exactly_is_refused_in_one_line(cmd, net, tmp_path):
    model, xflag, grads = net
    [fc1] = [n.input[1] for n in onnx.load(str(model)).graph.node if n.name == "/fc1/MatMul"]  # onnx::MatMul_N
    cases = {
        "unknown": ({**grads, "fc3.weight": np.ones((2, 5))},
                    "claimed gradient 'fc3.weight': names no parameter of the model: neither an initializer that is "
                    "one nor a torch name the importer traced to one (source_names) (did you mean"),
        "partial merge": ({k: v for k, v in grads.items() if k != "conv3.bias"},
                          "claimed gradient 'conv1.bias': the exporter merged it with 'conv3.bias' into one "
                          "initializer 'conv1.bias' (its gradient is the sum of theirs): give all of them"),
        "twice": ({**grads, fc1: grads["fc1.weight"].T},
                  f"claimed gradient '{fc1}': is given twice: by its own name and as 'fc1.weight'"),
        "shape": ({**grads, "fc1.weight": grads["fc1.weight"].T},
                  "claimed gradient 'fc1.weight': has shape [4, 5], needs shape [5, 4] (the model's 'onnx::MatMul_"),
    }
    for what, (arrays, message) in cases.items():
        np.savez(tmp_path / f"{what}.npz", **arrays)
        code, out, err = _run(cmd, model, "--input", xflag, "--claimed", tmp_path / f"{what}.npz")
        assert code == 2, (what, out, err)
        assert message in out + err and "Traceback" not in out + err, (what, out, err)


def test_a_folded_batchnorm_is_explained_and_every_other_key_checked(tmp_path):
    # the whole named_parameters() archive of an eval-mode export: conv4.weight's image is derived (BatchNorm
    # folded in: no torch parameter's gradient), bn4's keys have none; each is explained, the rest pass
    model, xflag, grads = _exported(tmp_path, bn=True)
    np.savez(tmp_path / "g.npz", **grads)
    code, out, err = _run("svc", model, "--input", xflag, "--claimed", tmp_path / "g.npz")
    assert code == 0, out + err
    assert "claimed gradient 'conv4.weight': folded with another parameter (a BatchNorm into its Conv) into " \
           "onnx::Conv_" in out and "read by /conv4/Conv by the exporter: not checkable" in out, out
    for key in ("bn4.weight", "bn4.bias"):  # the one tensor of the exporter's own: the folded weight
        assert f"claimed gradient '{key}': folded into onnx::Conv_" in out, out
    # the folded bias is zero (BatchNorm at its init), so the exporter merged it with the zero conv biases:
    # their initializer's gradient sums a part no torch parameter's gradient is
    for key in ("conv1.bias", "conv2.bias", "conv3.bias"):
        assert f"claimed gradient '{key}': merged by the exporter into conv1.bias with a tensor that is no torch " \
               "parameter's (derived, read by /conv4/Conv): not checkable" in out, out
    assert "not checked: onnx::" not in out, out  # the folded weight is said with the keys it holds
    assert "not provided" not in out and "Traceback" not in out + err, out + err


def _model_message():
    """An imported model's graph as the importer writes it: parameters with their source_names (real protobuf)."""
    from gradcheck.v1 import graph_pb2

    msg = graph_pb2.Graph(name="m")
    for name, shape, names in [("gn_w", [3, 1, 1], [("gn.weight", "reshaped")]),
                               ("W", [2, 8, 2], [("lstm.weight_ih_l0", "lstm_gates"),
                                                 ("lstm.weight_ih_l0_reverse", "lstm_gates")]),
                               ("B", [1, 12], [("gru.bias_ih_l0", "gru_gates"), ("gru.bias_hh_l0", "gru_gates")]),
                               ("emb", [4, 2], [("emb.weight", "same")]),
                               ("onnx::MatMul_9", [2, 4], [("emb.weight", "transposed")])]:
        inp = msg.inputs.add(name=name, requires_grad=True)
        inp.value.shape[:] = shape
        inp.value.data[:] = [0.0] * int(np.prod(shape))
        for n, relation in names:
            inp.source_names.add(name=n, relation=relation, onnx_name=name)
    return msg


def test_reshaped_and_stacked_gates_map_and_tied_weights_are_refused():
    from gradcheck_svc.errors import GraphError
    from gradcheck_svc.graph.validate import decode_tensor
    from gradcheck_svc.onnx_import.claim_names import onto_initializers

    msg = _model_message()
    out = onto_initializers(msg, claims_message({"gn.weight": np.arange(3, dtype=np.float32)}))
    value, dtype = decode_tensor(out.gradients["gn_w"], "gn_w")
    assert dtype == "float32" and value.shape == (3, 1, 1) and value.reshape(-1).tolist() == [0.0, 1.0, 2.0]
    # an RNN's W, R, B: each key its direction (and bias half), its gate blocks (h = 2 rows each) in ONNX's order:
    # LSTM i, o, f, c = torch's blocks 0, 3, 1, 2; GRU z, r, h = torch's 1, 0, 2
    w, w_rev, b_ih, b_hh = np.arange(16.0).reshape(8, 2), 100 + np.arange(16.0).reshape(8, 2), np.arange(6.0), \
        10 + np.arange(6.0)
    out = onto_initializers(msg, claims_message({"lstm.weight_ih_l0": w, "lstm.weight_ih_l0_reverse": w_rev,
                                                 "gru.bias_ih_l0": b_ih, "gru.bias_hh_l0": b_hh}))
    lstm_rows, gru_rows = [0, 1, 6, 7, 2, 3, 4, 5], [2, 3, 0, 1, 4, 5]
    np.testing.assert_array_equal(decode_tensor(out.gradients["W"], "W")[0], np.stack([w[lstm_rows], w_rev[lstm_rows]]))
    np.testing.assert_array_equal(decode_tensor(out.gradients["B"], "B")[0], [np.r_[b_ih[gru_rows], b_hh[gru_rows]]])
    with pytest.raises(GraphError, match=r"claimed gradient 'lstm.weight_ih_l0': the exporter stacked it with "
                                         r"'lstm.weight_ih_l0_reverse' into one initializer 'W' \(lstm_gates"):
        onto_initializers(msg, claims_message({"lstm.weight_ih_l0": w}))
    with pytest.raises(GraphError, match=r"claimed gradient 'gru.bias_hh_l0': has shape \[12\], needs \[6\] \(its gate "
                                         r"blocks in the model's 'B', shape \[1, 12\]: gru_gates"):
        onto_initializers(msg, claims_message({"gru.bias_ih_l0": b_ih, "gru.bias_hh_l0": np.r_[b_ih, b_hh]}))
    with pytest.raises(GraphError, match=r"claimed gradient 'emb.weight': stands for 2 of the model's initializers "
                                         r"\('emb', 'onnx::MatMul_9': a tied or copied weight\)"):
        onto_initializers(msg, claims_message({"emb.weight": np.ones((4, 2))}))


def test_every_element_of_a_stacked_rnn_tensor_is_named_as_the_torch_element_placed_there():
    # graph/gates.py both ways: a report names element [d, r(, c)] of W, R or B as torch's key[row(, c)]; that
    # element is where the claims' mapping puts torch's key[row(, c)] (values all distinct: each found once)
    import re

    from gradcheck_svc.graph.gates import placed, torch_element

    cases = [("lstm_gates", (2, 8, 3), ["m.weight_hh_l1", "m.weight_hh_l1_reverse"]),
             ("gru_gates", (1, 12), ["m.bias_ih_l0", "m.bias_hh_l0"]),
             ("rnn_stacked", (2, 4), ["a.bias_ih_l0", "a.bias_hh_l0", "a.bias_ih_l0_reverse", "a.bias_hh_l0_reverse"])]
    for relation, shape, keys in cases:
        values = {k: 1000.0 * i + np.arange(np.prod(shape) // len(keys), dtype=float).reshape(
            -1, *shape[2:]) for i, k in enumerate(keys)}
        image = sum(placed(v, relation, k, "W", shape, k) for k, v in values.items())
        for index in np.ndindex(*shape):
            said = torch_element(keys, relation, shape, list(index))
            key, where = re.fullmatch(r" = (\S+)\[([\d, ]+)\] \(gate block \d of torch's\)", said).groups()
            assert values[key][tuple(int(i) for i in where.split(", "))] == image[index], (relation, index, said)
    assert torch_element(["m.bias_ih_l0", "m.bias_hh_l0"], "gru_gates", (1, 12), [0, 8]) == \
        " = m.bias_hh_l0[0] (gate block 0 of torch's)"  # GRU's r is ONNX's block 1: torch's block 0, hidden half


def test_a_torchscript_exports_folded_key_is_named_with_the_tensors_read_in_its_module():
    # archive.py on a real ModelProto and imported message: two tensors of the exporter's own, read in modules
    # a and b; a key of b's is held by b's (an op reads its own module's parameters), a root key by one of both
    from onnx import TensorProto, helper

    from gradcheck.v1 import graph_pb2
    from gradcheck_svc.onnx_import.archive import legacy_unheld, unclaimable_note, unnamed_tensors

    nodes = [helper.make_node("Add", ["x", "onnx::Add_1"], ["y"], name="/a/Add"),
             helper.make_node("Add", ["y", "onnx::Add_2"], ["z"], name="/b/blk/Add")]
    inits = [helper.make_tensor(f"onnx::Add_{i}", TensorProto.DOUBLE, [2], [0.5 * i, 1.0]) for i in (1, 2, 3)]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2])],
        [helper.make_tensor_value_info("z", TensorProto.DOUBLE, [2])], inits))
    msg = graph_pb2.Graph(name="g")
    for name in ("onnx::Add_1", "onnx::Add_2", "b.kept", "x"):  # x: a graph input made a parameter, the user's
        msg.inputs.add(name=name, requires_grad=True)
    msg.inputs.add(name="onnx::Add_3")  # a constant: never a holder
    unnamed = unnamed_tensors(model, msg, [])
    assert sorted(unnamed) == ["onnx::Add_1", "onnx::Add_2"]
    said = legacy_unheld(["b.blk.table", "table"], unnamed)
    assert said["b.blk.table"] == "folded into onnx::Add_2 read by /b/blk/Add by the exporter"
    assert said["table"].startswith("folded by the exporter into one of onnx::Add_1 read by /a/Add, "
                                    "onnx::Add_2 read by /b/blk/Add (the TorchScript export does not say which)")
    assert legacy_unheld(["table"], {}) == {}  # nothing the exporter named: the key names nothing (refused)
    # a tensor made a constant under the archive is said once: by the key holding it, else in a note of its own
    assert unclaimable_note(["onnx::Add_2"], said["b.blk.table"]) == ""
    note = unclaimable_note(["onnx::Add_1", "onnx::Add_2"], "folded into onnx::Add_20 read by /c/Add")
    assert note.startswith("not checked: onnx::Add_1, onnx::Add_2: made by the exporter and traced to no torch "
                           "parameter"), note
