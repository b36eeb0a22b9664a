"""Names a PyTorch user recognises (issue 22 item 4): a report's `source_names` maps each parameter an
exporter merged, transposed or derived back to the torch parameters it stands for, and the gradients
bear that out against torch autograd: a merged initializer's gradient is the sum of its torch
parameters', an `onnx::MatMul_*` one's is the Linear weight's gradient transposed.

Real exports (torch.onnx.export, the TorchScript exporter with its defaults), real verification, the
report's JSON, proto (report_to_proto) and text."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
from torch import nn  # noqa: E402

from gradcheck.v1 import graph_pb2  # noqa: E402
from gradcheck_svc.errors import GraphError, LimitError  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.oracles.symbolic import SymbolicOptions  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions  # noqa: E402
from gradcheck_svc.report_proto import report_to_proto  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402


class Net(nn.Module):
    """Three convs whose biases are all zero (freshly initialized SqueezeNet-style: the exporter merges
    them), a BatchNorm folded into one conv, two Linear layers on a rank-3 input (MatMul: transposed)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 1)
        self.conv4, self.bn4 = nn.Conv2d(3, 3, 1, bias=False), nn.BatchNorm2d(3)
        self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 2)

    def forward(self, x):
        y = torch.tanh(self.conv1(x))
        y = torch.tanh(self.conv3(torch.tanh(self.conv2(y))))
        y = torch.tanh(self.bn4(self.conv4(y)))
        return self.fc2(torch.tanh(self.fc1(y)))


def _net():
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        for conv in (model.conv1, model.conv2, model.conv3):
            conv.bias.zero_()
        model.bn4.running_mean.uniform_(-0.5, 0.5)
        model.bn4.running_var.uniform_(0.5, 1.5)
    return model.eval().double(), torch.randn(1, 2, 3, 4, dtype=torch.float64)


def _export(model, x) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        f = io.BytesIO()
        torch.onnx.export(model, (x,), f, dynamo=False)
        return f.getvalue()


@pytest.fixture(scope="module")
def exported():
    model, x = _net()
    blob = _export(model, x)
    import onnx

    m = onnx.load_from_string(blob)
    inits = {t.name for t in m.graph.initializer}
    (xname,) = [vi.name for vi in m.graph.input if vi.name not in inits]
    y = model(x)
    c = np.random.default_rng(1).standard_normal(tuple(y.shape))
    (y * torch.from_numpy(c)).sum().backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    graph = load_graph(import_onnx(blob, ImportOptions(inputs={xname: x.numpy()}, loss="cotangent", cotangent=c)))
    report = verify(graph, VerifyOptions(symbolic=SymbolicOptions(enabled=False)))
    return graph, report, grads


def _by_name(report) -> dict:
    return {p["name"]: p for p in report.to_dict()["parameters"]}


def test_merged_zero_biases_list_every_torch_name_and_reader(exported):
    graph, report, grads = exported
    assert report.verdict == "pass"
    rows = _by_name(report)
    merged = [r for r in rows.values() if {s["name"] for s in r["source_names"]} >= {"conv1.bias", "conv3.bias"}]
    assert len(merged) == 1, [r["name"] for r in rows.values()]
    row = merged[0]
    names = {s["name"]: s for s in row["source_names"]}
    assert set(names) == {"conv1.bias", "conv2.bias", "conv3.bias"}
    assert all(s["relation"] == "same" for s in names.values())
    assert {n: s["read_by"] for n, s in names.items()} == {
        "conv1.bias": ["/conv1/Conv"], "conv2.bias": ["/conv2/Conv"], "conv3.bias": ["/conv3/Conv"]}
    # the one tensor's gradient is the sum of the three torch biases' gradients
    total = grads["conv1.bias"] + grads["conv2.bias"] + grads["conv3.bias"]
    np.testing.assert_allclose(row["gradient"], total, rtol=1e-10, atol=1e-13)
    assert not np.allclose(row["gradient"], grads[row["name"]])  # not the gradient of its own name alone


def test_matmul_initializers_are_the_linear_weights_transposed(exported):
    graph, report, grads = exported
    rows = _by_name(report)
    transposed = {r["name"]: r for r in rows.values() if any(s["relation"] == "transposed" for s in r["source_names"])}
    assert len(transposed) == 2 and all(n.startswith("onnx::MatMul_") for n in transposed)
    seen = set()
    for name, row in transposed.items():
        (s,) = row["source_names"]
        assert s["onnx_name"] == name and s["read_by"] == [f"/{s['name'].split('.')[0]}/MatMul"]
        seen.add(s["name"])
        torch_grad = grads[s["name"]]
        assert row["shape"] == list(torch_grad.T.shape)
        np.testing.assert_allclose(np.reshape(row["gradient"], row["shape"]), torch_grad.T, rtol=1e-10, atol=1e-13)
    assert seen == {"fc1.weight", "fc2.weight"}


def test_batchnorm_folded_conv_is_derived_and_plain_names_say_nothing(exported):
    graph, report, grads = exported
    rows = _by_name(report)
    derived = {s["name"]: r["name"] for r in rows.values() for s in r["source_names"] if s["relation"] == "derived"}
    assert derived.get("conv4.weight", "").startswith("onnx::Conv_")
    # a parameter read by its own name only: no source_names (its name says it all)
    assert rows["conv1.weight"]["source_names"] == [] and rows["fc1.bias"]["source_names"] == []
    np.testing.assert_allclose(np.reshape(rows["conv1.weight"]["gradient"], rows["conv1.weight"]["shape"]),
                               grads["conv1.weight"], rtol=1e-10, atol=1e-13)


def test_source_names_reach_the_proto_and_the_text(exported):
    graph, report, grads = exported
    proto = {p.name: p for p in report_to_proto(report).parameters}
    for row in report.to_dict()["parameters"]:
        got = [{"name": s.name, "relation": s.relation, "onnx_name": s.onnx_name, "read_by": list(s.read_by)}
               for s in proto[row["name"]].source_names]
        assert got == row["source_names"]
    text = report.to_text()
    assert "conv1.bias + conv2.bias + conv3.bias: merged by the exporter, its gradient is the sum of theirs" in text
    matmul = next(p for p in report.parameters if p.name.startswith("onnx::MatMul_") and
                  p.source_names[0].name == "fc1.weight")
    assert f"{matmul.name} = fc1.weight transposed; read by /fc1/MatMul" in text
    assert "= the exporter's tensor in conv4.weight's place: its gradient is no torch parameter's; read by " \
        "/conv4/Conv" in text


def test_source_names_are_checked_on_load():
    msg = graph_pb2.Graph(name="g", output="y")
    inp = msg.inputs.add(name="w", requires_grad=True)
    inp.value.data.append(1.0)
    msg.nodes.add(name="y", op="sum", inputs=["w"])
    inp.source_names.add(name="fc.weight", relation="renamed", onnx_name="w", read_by=["y"])
    with pytest.raises(GraphError, match="unknown relation 'renamed'") as err:
        load_graph(msg)
    assert err.value.field == "inputs[0].source_names[0]"
    inp.source_names[0].relation = "same"
    inp.source_names[0].read_by[0] = "n" * 100_000
    with pytest.raises(LimitError, match="characters long"):
        load_graph(msg)
    inp.source_names[0].read_by[0] = "y"
    assert load_graph(msg).inputs["w"].source_names[0].name == "fc.weight"


@pytest.fixture(scope="module")
def grpc_client(tmp_path_factory):
    from grpc_helpers import module_client

    yield from module_client(tmp_path_factory, "--workers", "1")


def test_source_names_over_grpc(grpc_client, exported):
    """The exported model sent as bytes to a real server: the client's report has the same source_names."""
    from gradcheck.v1 import service_pb2
    from gradcheck_core.onnx_options import OnnxModel

    graph, report, grads = exported
    model, x = _net()
    local = {p["name"]: p["source_names"] for p in report.to_dict()["parameters"]}
    remote = grpc_client.verify(OnnxModel(_export(model, x), service_pb2.OnnxImport()), symbolic=False)
    assert remote.verdict == "pass"
    got = {p.name: p.data["source_names"] for p in remote.parameters}
    assert got == local and any(got.values())


def test_dynamo_export_transposed_and_folded():
    """The dynamo exporter: Linear weights as MatMul's `val_N` (transposed), BatchNorm folded into conv4
    under conv4's own names, its bias's too (the node marked FuseBatchNormIntoConv: derived, so torch's
    gradients of conv4.weight and conv4.bias, claimed, are explained, not compared with the folded tensors':
    a false FAIL of correct claims); its optimizer drops the all-zero conv biases altogether (nothing to name)."""
    import onnx
    from torch_export import export_onnx  # the dynamo exporter's defaults, its optimizer on

    from gradcheck.v1 import service_pb2
    from gradcheck_core.claims import claims_message
    from gradcheck_svc.request import prepare

    model, x = _net()
    model.conv4.bias = nn.Parameter(torch.rand(3, dtype=torch.float64))
    blob = export_onnx(model, (x,), "dynamo")
    graph = load_graph(import_onnx(blob))
    found = {n: [(s.name, s.relation) for s in i.source_names] for n, i in graph.inputs.items() if i.source_names}
    transposed = {v[0] for n, v in found.items() if n.startswith("val_")}
    assert transposed == {("fc1.weight", "transposed"), ("fc2.weight", "transposed")}
    assert found["conv4.weight"] == [("conv4.weight", "derived")]
    assert found["conv4.bias"] == [("conv4.bias", "derived")]
    assert "conv1.weight" not in found and "conv1.bias" not in graph.inputs
    model(x).sum().backward()
    claims = claims_message({n: p.grad.numpy() for n, p in model.named_parameters()})
    request = service_pb2.VerifyRequest(onnx_model=blob, onnx=service_pb2.OnnxImport(
        inputs={"x": onnx.numpy_helper.from_array(x.numpy()).SerializeToString()}))
    request.graph.claimed.CopyFrom(claims)
    claimed, _ = prepare(request)
    assert not {"conv4.weight", "conv4.bias"} & set(claimed.parameters) and "fc1.bias" in claimed.parameters
    assert all(any(n.startswith("not checked: claimed gradient") and f"'{k}'" in n for n in claimed.notes)
               for k in ("conv4.weight", "conv4.bias")), claimed.notes  # each explained (the notes are bounded)


def test_rnn_tensors_name_torch_keys_and_the_gate_order():
    """An LSTM's W, R, B are torch's weight_ih_l0, weight_hh_l0, bias_ih_l0 + bias_hh_l0 stacked by
    direction with the gates reordered: the report says so in its JSON and its text (the values and
    gradients through the reorder: tests/onnx/test_model_zoo.py)."""
    torch.manual_seed(0)
    model = nn.LSTM(3, 2, batch_first=True).double().eval()
    x = torch.randn(1, 2, 3, dtype=torch.float64)

    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = model

        def forward(self, x):
            return self.rnn(x)[0]

    graph = load_graph(import_onnx(_export(Out(), x), ImportOptions(loss="cotangent")))
    found = {n: [(s.name, s.relation) for s in i.source_names] for n, i in graph.inputs.items() if i.source_names}
    assert sorted(found.values()) == [[("rnn.bias_ih_l0", "lstm_gates"), ("rnn.bias_hh_l0", "lstm_gates")],
                                      [("rnn.weight_hh_l0", "lstm_gates")], [("rnn.weight_ih_l0", "lstm_gates")]]
    text = verify(graph, VerifyOptions(symbolic=SymbolicOptions(enabled=False))).to_text()
    bias = next(n for n, v in found.items() if len(v) == 2)
    assert (f"{bias} = rnn.bias_ih_l0, rnn.bias_hh_l0 stacked by direction (input then hidden bias), gate blocks "
            "in ONNX's order i, o, f, c (torch's: i, f, g, o); read by /rnn/LSTM") in text
