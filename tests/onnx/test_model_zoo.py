"""Today's architectures through both PyTorch exporters with their defaults: torch.onnx.export(model,
args, f) (the TorchScript exporter) and torch.onnx.export(..., dynamo=True) (with its optimizer, the
default, and without). Each model (tests/model_zoo.py: tiny, random weights, float64) imports with the
default import options (only its input's value is given, so torch sees the same one), its loss and
gradients equal torch autograd's on the same loss (sum(output * c)) within 1e-10 relative, and a full
verification (finite differences, the symbolic oracle where the graph is small enough) says PASS.

Gradients are compared for the input and for every initializer that is a torch parameter (its name,
shape and value; the exporters rename MatMul weights, merge the RNNs' into W, R, B, and fold BatchNorm
into the Conv before it under the Conv weight's name: those gradients the verification checks), and
through the report's source_names for every other one: each name there is a named_parameters() key,
and the tensor's value and gradient are torch's through its relation (the sum of merged ones, the
transpose, the reshape, the RNN's directions stacked with the gate blocks reordered)."""
from __future__ import annotations

import hashlib
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from model_zoo import ZOO, causal_attention, exact_reference  # noqa: E402
from onnx_helpers import torch_image  # noqa: E402
from torch_export import export_onnx  # noqa: E402

from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.oracles.symbolic import SymbolicOptions  # noqa: E402
from gradcheck_svc.verify.run import run_engine  # noqa: E402

EXPORTERS = ["legacy", "dynamo", "dynamo-unoptimized"]


def export(build, exporter: str):
    """(model, x, the export) of a model_zoo builder (seeded: the same model and input each call); its dynamo
    export is made once per test process for both dynamo exporters (torch_export.export_onnx)."""
    model, x = build()
    return model, x, export_onnx(model, (x,), exporter, key=("model_zoo", build.__name__))


def _input_name(blob: bytes) -> str:
    import onnx

    m = onnx.load_from_string(blob)
    inits = {t.name for t in m.graph.initializer}
    (name,) = [vi.name for vi in m.graph.input if vi.name not in inits]
    return name


# GPT-2's causal attention: the dynamo exporter stores its masked_fill value as -inf (see the test below)
CASES = [(b, e) for b in ZOO for e in EXPORTERS] + [(causal_attention, "legacy")]


@pytest.mark.parametrize(("build", "exporter"), CASES, ids=[f"{b.__name__}-{e}" for b, e in CASES])
def test_model_zoo(build, exporter):
    model, x, blob = export(build, exporter)
    xname = _input_name(blob)
    y = model(x)
    c = np.random.default_rng(1).standard_normal(tuple(y.shape))
    # the defaults (--params weights), plus the input as a parameter: its gradient needs no name mapping
    msg = import_onnx(blob, ImportOptions(params=f"weights,{xname}", inputs={xname: x.numpy()},
                                          loss="cotangent", cotangent=c))
    # the exporter's own constants here are fills, masks, shapes and a vanished parameter's named holders: none
    # is an expression of a parameter still read, so none is warned (test_dynamo_folded_expression_..._warned)
    assert not [n for n in msg.notes if n.startswith(FOLDED)], msg.notes
    checked = _checked_key(build, exporter, msg)
    if checked in _CHECKED:  # this very graph passed every check below (the other dynamo exporter's)
        return
    graph = load_graph(msg)

    reference = exact_reference(model)
    xt = x.clone().requires_grad_(True)
    loss = (reference(xt) * torch.from_numpy(c)).sum()
    params = dict(reference.named_parameters())
    grads = torch.autograd.grad(loss, [xt] + list(params.values()))
    want = {xname: grads[0].numpy()} | {n: g.numpy() for n, g in zip(params, grads[1:])}

    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    assert engine.loss == pytest.approx(float(loss.detach()), rel=1e-10)
    # an initializer is a torch parameter when it has its name, shape and value: the exporters fold
    # BatchNorm into the preceding Conv's weights and keep the Conv's name for the folded tensor
    values = {n: p.detach().numpy() for n, p in params.items()} | {xname: x.numpy()}
    # (a tensor merged from several torch parameters is compared through its source_names, below; a constant the
    # exporter made of one in part is tied to it -- the dynamo optimizer's folded first step of an nn.RNN,
    # h0 @ W_hh^T + b_hh with h0 = 0, stored as 'linear_1', is b_hh over the batch: ties.py -- so all of
    # torch's gradient is the parameter's)
    compared = [n for n in want if n in graph.inputs and np.shape(graph.inputs[n].value) == want[n].shape
                and np.array_equal(graph.inputs[n].value, values[n])
                and len({s.name for s in graph.inputs[n].source_names}) <= 1]
    assert xname in compared
    for n in compared:
        scale = max(np.abs(want[n]).max(), 1e-300)
        np.testing.assert_allclose(engine.gradients[n], want[n], rtol=1e-10, atol=1e-10 * scale,
                                   err_msg=f"{build.__name__} ({exporter}): {n}")

    _check_source_names(graph, engine.gradients, model, want, (build.__name__, exporter), xname)

    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    _CHECKED.add(checked)


# Both dynamo exporters' models often import to the same graph, byte for byte (mlp_layernorm_gelu, the UNets,
# moe_top2: what the optimizer changed, the import undoes). Everything test_model_zoo checks after the import
# is a function of that graph, the seeded model and input, the cotangent and NAMELESS: a graph that has passed
# for a model is not checked again (seconds each; a different graph, or a run of one exporter alone, is checked
# in full).
_CHECKED: set = set()


def _checked_key(build, exporter: str, msg) -> tuple:
    digest = hashlib.sha256(msg.SerializeToString(deterministic=True)).hexdigest()
    return build.__name__, digest, frozenset(NAMELESS.get((build.__name__, exporter), ()))


# parameters the exporter's optimizer computed from torch parameters and stored under a name of its own,
# with nothing in the model to say which (issue 34 item 4): `cls.expand(...)`
NAMELESS = {("tiny_vit", "dynamo"): {"expand"}, ("tiny_vit_merged", "dynamo"): {"expand"}}
def _check_source_names(graph, gradients, model, torch_grads, case, xname):
    """Every source_names entry names a real named_parameters() key, and says how the ONNX tensor is
    made from them: its value and its gradient are torch's through that relation (a derived one makes
    no claim). A parameter without source_names is a torch parameter or buffer by its own name."""
    keys = dict(model.named_parameters())
    values = {n: p.detach().numpy() for n, p in keys.items()}
    buffers = {n for n, _ in model.named_buffers()}
    for name, inp in graph.inputs.items():
        if not inp.requires_grad:
            continue
        # a single number is a parameter only as a torch parameter (the attention scale is a constant)
        assert np.size(inp.value) > 1 or name in keys or any(e.name in keys for e in inp.source_names), (case, name)
        entries = [e for e in inp.source_names if e.relation != "derived"]
        entries = [e for e in entries if e.relation != "tied"]  # a copy tied to it (ties.py) is the parameter
        assert all(e.name in keys for e in entries), (case, name, inp.source_names)
        assert all(e.name in keys or e.name == "" for e in inp.source_names), (case, name, inp.source_names)
        if not inp.source_names:
            assert name in keys or name in buffers or name == xname or name in NAMELESS.get(case, ()), (case, name)
            continue
        if not entries:
            continue
        shape = np.shape(inp.value)
        merged = [[e] for e in entries] if entries[0].relation in ("same", "transposed", "reshaped") else [entries]
        for part in merged:  # merged: each torch parameter's value is the tensor's
            np.testing.assert_array_equal(inp.value, torch_image(part, values, shape), err_msg=f"{case}: {name} value")
        want = torch_image(entries, {n: torch_grads[n] for n in keys}, shape)
        np.testing.assert_allclose(gradients[name], want, rtol=1e-10, atol=1e-10 * max(np.abs(want).max(), 1e-300),
                                   err_msg=f"{case}: {name} = {[(e.name, e.relation) for e in entries]}")


class _Powers(torch.nn.Module):
    """x ** 2 and x ** 3 on values of both signs: the dynamo exporter stores 2.0 and 3.0 as 0-d
    initializers, and d/d(exponent) of x ** p at a negative x is NaN. Plus an expression of the weight
    (its block summed), which the dynamo optimizer folds into a constant of its own while the weight is
    read whole by the Linear (test_dynamo_folded_expression_of_a_weight_is_warned)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)

    def forward(self, x):
        y = self.lin(x)
        return y ** 2 + 0.5 * y ** 3 + self.lin.weight[:, :2].sum(1)


def test_dynamo_scalar_initializers_are_constants_by_default():
    import onnx

    torch.manual_seed(0)
    model = _Powers().double().eval()
    x = torch.randn(2, 3, dtype=torch.float64)
    assert (model.lin(x) < 0).any()  # negative bases: the exponent's derivative would be NaN
    blob = export_onnx(model, (x,), "dynamo", key=("powers",))
    scalars = [t.name for t in onnx.load_from_string(blob).graph.initializer
               if not t.dims and t.data_type == onnx.TensorProto.DOUBLE]
    assert scalars  # what the exporter does today; the default must cope with it
    graph = load_graph(import_onnx(blob))
    assert set(graph.parameters) == {"lin.weight", "lin.bias"}
    assert verify(graph, VerifyOptions()).verdict == "pass"
    # asked for, a scalar initializer is a parameter like any other
    everything = load_graph(import_onnx(blob, ImportOptions(params="initializers")))
    assert set(scalars) <= set(everything.parameters)


FOLDED = "constants the exporter made, no torch parameter or buffer, that may be computed from a parameter"


def test_dynamo_folded_expression_of_a_weight_is_warned():
    """`self.lin.weight[:, :2].sum(1)` reaches the dynamo export (with its optimizer) as a constant of its own
    while lin.weight is read whole: the graph's gradient of lin.weight lacks the sum's part, a wrong PASS
    unless the report says so. The warning names the constant, its shape and its reader; without the
    optimizer the expression stays in the graph and nothing is warned. (test_model_zoo: no zoo model's
    constants -- fills, masks, shapes, a folded BatchNorm's -- are warned.)"""
    import onnx

    torch.manual_seed(0)
    model = _Powers().double().eval()
    x = torch.randn(2, 3, dtype=torch.float64)
    blob = export_onnx(model, (x,), "dynamo", key=("powers",))
    inits = {t.name: list(t.dims) for t in onnx.load_from_string(blob).graph.initializer}
    folded = [n for n, dims in inits.items() if dims == [4] and n != "lin.bias"]
    assert len(folded) == 1, inits  # what the exporter does today: the sum is a constant
    xname = _input_name(blob)
    msg = import_onnx(blob, ImportOptions(inputs={xname: x.numpy()}))
    (note,) = [n for n in msg.notes if n.startswith(FOLDED)]
    assert f"{folded[0]} [4] read by node_" in note and "optimize=False" in note
    assert "self.lin.weight[:, :2].sum(1)" in note, note  # the reader's source line, from the export's metadata
    # torch's own (correct) gradients, claimed: lin.weight's fails (the graph lacks the sum's path), and its
    # failure points at the constants; lin.bias's, which the sum does not read, passes
    from gradcheck_core.claims import claims_message, with_claims

    model(x).sum().backward()
    claims = claims_message({n: p.grad.numpy() for n, p in model.named_parameters()})
    report = verify(load_graph(with_claims(msg, claims)), VerifyOptions(symbolic=SymbolicOptions(max_elements=0)))
    rows = {r.name: r.passed for r in report.parameters}
    assert rows == {"lin.weight": False, "lin.bias": True}, report.to_text()
    (finding,) = [f for f in report.findings if f.parameters == ["lin.weight"]]
    assert "constants its exporter made that may be computed from a parameter" in finding.detail, finding.detail
    plain = export_onnx(model, (x,), "dynamo-unoptimized", key=("powers",))
    assert not [n for n in import_onnx(plain).notes if n.startswith(FOLDED)]


def test_dynamo_shape_one_scalars_are_constants_like_0d_ones():
    """The dynamo exporter stores attention's scale 1/sqrt(head dim) as a shape-[1] `val_N`: a constant
    by default, as 0-d scalars are; `--params initializers` still makes it a parameter."""
    import onnx

    from model_zoo import transformer_encoder_layer

    blob = export(transformer_encoder_layer, "dynamo")[2]
    ones = {t.name for t in onnx.load_from_string(blob).graph.initializer
            if list(t.dims) == [1] and t.data_type == onnx.TensorProto.DOUBLE}
    assert ones and all(n.startswith("val_") for n in ones)  # what the exporter does today
    graph = load_graph(import_onnx(blob))
    assert not ones & set(graph.parameters)
    assert set(graph.parameters) >= {"layer.self_attn.in_proj_bias", "layer.norm1.weight"}
    everything = load_graph(import_onnx(blob, ImportOptions(params="initializers")))
    assert ones <= set(everything.parameters)


def test_fault_on_a_value_layer_norm_saves_is_caught_at_that_node():
    """nn.TransformerEncoderLayer through the dynamo exporter: LayerNormalization saves its input for
    the backward; scaling that saved copy is caught, and the finding names the layer_norm node."""
    import onnx

    from gradcheck_svc.engine.faults import parse_fault
    from model_zoo import transformer_encoder_layer

    blob = export(transformer_encoder_layer, "dynamo")[2]
    norm = [n for n in onnx.load_from_string(blob).graph.node if n.op_type == "LayerNormalization"][0]
    graph = load_graph(import_onnx(blob, ImportOptions(loss="cotangent")))
    assert graph.node(norm.output[0]).op.name == "layer_norm"
    report = verify(graph, VerifyOptions(faults=(parse_fault(f"{norm.input[0]}:scale:1.5"),), integrity="off"))
    assert report.verdict == "fail"
    errors = [f for f in report.findings if f.severity == "error"]
    assert errors and errors[0].node == norm.output[0] and errors[0].op == "layer_norm", report.to_text()


def test_a_faults_before_and_after_show_an_element_it_changed():
    """A fault scaling a ReLU's output: element 0 is 0 there (scaled, still 0); the record shows one
    the fault changed."""
    from gradcheck_svc.engine.faults import parse_fault
    from gradcheck_svc.graph.build import GraphBuilder

    b = GraphBuilder("relu_fault")
    x = b.input("x", np.array([-1.0, 2.0, 3.0]), requires_grad=True)
    r = b.node("relu", x, name="r")
    b.output(b.node("sum", b.node("square", r, name="sq"), name="L"))
    report = verify(load_graph(b.build()), VerifyOptions(faults=(parse_fault("r:scale:1.5"),), integrity="off"))
    (record,) = report.faults
    assert (record.before, record.after, record.index) == (2.0, 3.0, 1)
    assert "element 1: 2 -> 3" in report.to_text()


def test_a_parameter_named_by_a_fault_finding_whose_gradient_checks_out_reads_affected():
    """A relu's output scaled after the forward: the relu's mask is unchanged, so w1 (upstream) keeps
    its right gradient and w2 (read with the scaled value) does not. Had the finding named w1 too (as a
    finding at a node whose input is a chain of parameters does), w1 reads "affected", not FAIL."""
    from gradcheck_svc.engine.faults import parse_fault
    from gradcheck_svc.graph.build import GraphBuilder
    from gradcheck_svc.verify.findings import Finding
    from gradcheck_svc.verify.verdict import settle

    b = GraphBuilder("relu_fault")
    x = b.input("x", np.array([0.5, -1.0, 2.0, 1.0]))
    w1 = b.input("w1", np.array([1.5, 0.3, -0.7, 0.8]), requires_grad=True)
    w2 = b.input("w2", np.array([[0.2, 0.4], [0.9, -0.3], [0.1, 0.5], [0.7, 0.2]]), requires_grad=True)
    r = b.node("relu", b.node("mul", x, w1, name="m1"), name="r")
    b.output(b.node("sum", b.node("tanh", b.node("matmul", r, w2, name="m2"), name="t"), name="L"))
    report = verify(load_graph(b.build()), VerifyOptions(faults=(parse_fault("r:scale:1.5"),), integrity="off"))
    rows = {p.name: p for p in report.parameters}
    assert report.verdict == "fail" and rows["w2"].status == "FAIL" and rows["w1"].status == "ok"
    wide = Finding("m2", "matmul", "cache_corruption", "error", "a finding naming both", ["w2", "w1"])
    assert settle(report.parameters, [wide]) == "fail"
    assert (rows["w1"].status, rows["w1"].failed_by) == ("affected", "cache_corruption")
    assert rows["w2"].status == "FAIL"


@pytest.mark.parametrize("opset", [16, 17, 20])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_layer_norm_at_each_opset(opset, approximate):
    """The legacy exporter below opset 20 writes GELU out (Erf, or Tanh and Pow for the tanh form), and
    LayerNorm below 17 as ReduceMean, Sub, Pow, Sqrt, Div; at 20 both are single nodes (Gelu,
    LayerNormalization). Every form imports and its gradients equal torch's."""
    import onnx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.GELU(approximate=approximate),
                                torch.nn.Linear(6, 2)).double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), f, dynamo=False, opset_version=opset, input_names=["x"])
    ops = {n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node}
    assert ("Gelu" in ops) == (opset >= 20) and ("LayerNormalization" in ops) == (opset >= 17)
    c = np.random.default_rng(2).standard_normal((3, 2))
    graph = load_graph(import_onnx(f.getvalue(), ImportOptions(params="weights,x", inputs={"x": x.numpy()},
                                                               loss="cotangent", cotangent=c)))
    xt = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((model(xt) * torch.from_numpy(c)).sum(), [xt])
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    np.testing.assert_allclose(engine.gradients["x"], g.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("exporter", ["dynamo", "dynamo-unoptimized"])
def test_causal_attention_from_dynamo_needs_allow_nonfinite(exporter):
    """masked_fill(finfo(float64).min) reaches the dynamo export as a -inf constant: graph data must be
    finite unless allowed, so the default says so in one line naming the flag; allowed, it verifies."""
    from gradcheck_svc.errors import GraphError

    msg = import_onnx(export(causal_attention, exporter)[2])  # unoptimized: split as SplitToSequence + SequenceAt
    with pytest.raises(GraphError, match="allow-nonfinite") as err:
        load_graph(msg)
    assert "\n" not in str(err.value)
    assert verify(load_graph(msg, allow_nonfinite=True), VerifyOptions()).verdict == "pass"
