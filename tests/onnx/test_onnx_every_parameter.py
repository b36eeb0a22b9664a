"""Issue 45: every torch parameter accounted for, whatever the exporter did to it (tests/param_models.py,
both exporters). A tied head's transpose is the embedding itself (its gradient torch's whole one, through the
report's source_names); F.linear's weights on a rank-4 input are checked transposed; a parameter the exporter
folded into a constant is named by the "not checked" warning with that constant; and torch's own gradients
of a training step, the whole named_parameters() archive, pass --claimed, a folded key explained, not refused.
The ops of item 2 the same way: a top-2 MoE gating with ScatterElements at TopK's computed indices, CLIP's
pooling at each row's argmax (GatherND), nn.EmbeddingBag with offsets (a Loop over the bags, unrolled). And an
LSTM's and a GRU's weights, which both exporters stack into the ONNX node's W, R, B by direction with the gate blocks
reordered: each torch key's gradient is its part of them, its planted error named as that key's element; keys the
import cannot place (no module says whose W, R, B) explained, not refused."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from onnx_helpers import GATES, torch_image  # noqa: E402
from param_models import MODELS  # noqa: E402
from torch_export import export_onnx  # noqa: E402

from gradcheck.v1 import service_pb2  # noqa: E402
from gradcheck_core.claims import claims_message  # noqa: E402
from gradcheck_svc.request import prepare, run_request  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.engine_run import run_engine  # noqa: E402

EXPORTERS = ("legacy", "dynamo")
# (both exporters give a GRU the node layout they give an LSTM, checked with lstm_seq2seq: one dynamo export of
# seconds spared; test_model_zoo's gru compares the dynamo export's W, R, B with torch's through source_names)
CASES = [(m, e) for m in MODELS for e in EXPORTERS if (m, e) != ("gru_seq2seq", "dynamo")]
# what each export holds under no torch name, and the tensor that holds it (folded into a constant by the dynamo
# optimizer; the TorchScript exporter's own tensors: onnx::Add_N, the gathered table; onnx::Expand_N, the
# queries unsqueezed)
FOLDED = {("gpt", "dynamo"): {"pos.weight": "embedding_1"}, ("swin", "dynamo"): {"table": "permute_1"},
          ("detr", "dynamo"): {"query_embed.weight": "repeat"}, ("swin", "legacy"): {"table": "onnx::Add_"},
          ("detr", "legacy"): {"query_embed.weight": "onnx::Expand_"}}
# a parameter each model must have checked, and how (None: under its own name or through any relation); the
# first is the one a planted error must fail: the tied embedding, the rank-4 F.linear, the queries' reader, the
# router reached only through TopK and ScatterElements with its computed indices, the embedding read by GatherND,
# the bags' table read in each unrolled iteration of the Loop, the recurrent weights (every one, both directions)
MUST = {"gpt": {"emb.weight": "tied"}, "swin": {"qkv.weight": "transposed", "proj.weight": "transposed"},
        "detr": {"lin.weight": "transposed"}, "scatter_moe": {"router.weight": None, "experts.weight": None},
        "argmax_pool": {"emb.weight": None}, "embedding_bag": {"bag.weight": None},
        "lstm_seq2seq": {f"rnn.{w}_{g}_l{k}{d}": "lstm_gates" for w in ("weight", "bias") for g in ("hh", "ih")
                         for k in (0, 1) for d in ("", "_reverse")},
        "gru_seq2seq": {f"rnn.{w}_{g}_l0": "gru_gates" for w in ("weight", "bias") for g in ("hh", "ih")}}
# where the planted error goes (flat index; else the first element): weight_hh_l0[5, 1] is in torch's gate block
# 2 (h = 2 rows a block: LSTM g, GRU n), ONNX's block 3 (LSTM c) and 2 (GRU h) -- the blocks move
PLANTED = {"lstm_seq2seq": 5 * 2 + 1, "gru_seq2seq": 5 * 2 + 1}


def _tensor(a: np.ndarray) -> bytes:
    return onnx.numpy_helper.from_array(a).SerializeToString()


_BLOBS: dict = {}


def _case(name: str, exporter: str):
    """(model, input, the exported bytes, the cotangent, the request, torch's gradients of sum(y * c))."""
    model, x = MODELS[name]()
    args = x if isinstance(x, tuple) else (x,)
    if (name, exporter) not in _BLOBS:  # exports are slow: once per case in this module
        _BLOBS[name, exporter] = export_onnx(model, args, exporter)
    blob = _BLOBS[name, exporter]
    c = np.random.default_rng(1).standard_normal(tuple(model(*args).shape))
    names = [vi.name for vi in onnx.load_from_string(blob).graph.input][:len(args)]
    req = service_pb2.VerifyRequest(onnx_model=blob, onnx=service_pb2.OnnxImport(
        inputs={n: _tensor(a.numpy()) for n, a in zip(names, args)}, loss="cotangent", cotangent=_tensor(c)),
        options=service_pb2.VerifyOptions(symbolic=False))  # finite differences judge the claims (seconds spared)
    params = dict(model.named_parameters())
    grads = torch.autograd.grad((model(*args) * torch.from_numpy(c)).sum(), list(params.values()))
    return req, {n: g.numpy() for n, g in zip(params, grads)}


@pytest.mark.parametrize(("name", "exporter"), CASES, ids=[f"{n}-{e}" for n, e in CASES])
def test_every_parameter_is_checked_through_its_relation_or_named_where_it_went(name, exporter):
    req, want = _case(name, exporter)
    graph, _ = prepare(req)
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    covered: dict[str, set] = {}
    for p in graph.parameters:
        entries = graph.inputs[p].source_names
        kept = [(s.name, s.relation) for s in entries if s.relation not in ("tied", "derived")] or \
            ([] if entries else [(p, "same")])
        for s in entries:
            covered.setdefault(s.name, set()).add(s.relation)
        if not kept or not all(n for n, _ in kept):
            continue
        shape = graph.inputs[p].value.shape
        expected = torch_image([s for s in entries if s.relation in GATES], want, shape) if kept[0][1] in GATES \
            else sum(want[n].T if r == "transposed" else want[n].reshape(shape) for n, r in dict.fromkeys(kept))
        # 1e-7: the dynamo exporter stores some of a model's scalars (attention's scale) in float32
        np.testing.assert_allclose(engine.gradients[p], expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max(),
                                   err_msg=f"{name} ({exporter}): {p} = {kept}")
        covered.setdefault(kept[0][0], set()).add(kept[0][1])
    for torch_name, relation in MUST[name].items():
        assert torch_name in covered and (relation is None or relation in covered[torch_name]), (torch_name, covered)
    folded = FOLDED.get((name, exporter), {})
    assert set(want) - set(covered) == set(folded), (sorted(want), covered)
    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    unchecked = [w for w in report.warnings if w.startswith("not checked")]
    if exporter == "dynamo" and folded:  # each missing parameter with the constant that holds it, nothing else
        [note] = unchecked
        for torch_name, const in folded.items():
            assert f"{torch_name}: folded" in note and f" {const} read by " in note, note
        assert not set(want) - set(folded) & {w.strip(",:") for w in note.split()}, note
    else:
        assert not unchecked, unchecked


def _corrupted(grads: dict, key: str, at: int = 0) -> dict:
    out = {k: v.copy() for k, v in grads.items()}
    out[key].reshape(-1)[at] += 1e-3 * max(1.0, abs(out[key].reshape(-1)[at]))
    return out


@pytest.mark.parametrize(("name", "exporter"), CASES, ids=[f"{n}-{e}" for n, e in CASES])
def test_torchs_whole_named_parameters_archive_passes_claimed(name, exporter):
    req, want = _case(name, exporter)
    req.graph.claimed.CopyFrom(claims_message(want))
    folded = FOLDED.get((name, exporter), {})
    report = run_request(req)
    # every key maps to a checked row or is explained; the exporter's own tensor holding a folded parameter
    # (the TorchScript export's onnx::Add_N, onnx::Expand_N: no torch name) is no row, never "not provided"
    assert report.verdict == "pass", report.to_text()
    assert all(p.status == "ok" for p in report.parameters), report.to_text()
    assert all(p.name in want or any(s.name for s in p.source_names) for p in report.parameters), report.to_text()
    explained = {w.split("'")[1]: w for w in report.warnings if "not checkable" in w}
    assert sorted(explained) == sorted(folded), explained
    for key, holder in folded.items():  # named with the tensor that holds it and the node reading it
        assert f": folded into {holder}" in explained[key] or f"one of {holder}" in explained[key], explained[key]
        assert " read by " in explained[key], explained[key]
    # the tied / transposed gradient is compared, not waved through: a planted error in it fails
    key = next(iter(MUST[name]))
    req.graph.claimed.CopyFrom(claims_message(_corrupted(want, key, PLANTED.get(name, 0))))
    bad = run_request(req)
    assert bad.verdict == "fail", bad.to_text()
    failed = [p for p in bad.parameters if p.status != "ok"]  # the one row that is that key's image
    assert len(failed) == 1 and (failed[0].name == key or key in {s.name for s in failed[0].source_names}), \
        bad.to_text()
    if name in PLANTED:  # the worst element of the stacked W, R named as torch's, its block put back in place
        row, col = divmod(PLANTED[name], want[key].shape[1])
        assert f"= {key}[{row}, {col}] (gate block 2 of torch's)" in bad.to_text(), bad.to_text()


def test_rnn_keys_the_import_cannot_place_are_explained_not_refused():
    # the GRU node of the TorchScript export without its scoped name: no module says whose W, R, B these are (no
    # source_names), so torch's keys cannot be placed -- each is one "not checkable" line naming the exporter's
    # tensors that hold it, those are constants (no row, never "not provided"), and every other key is checked
    req, want = _case("gru_seq2seq", "legacy")
    model = onnx.load_from_string(req.onnx_model)
    (gru,) = [n for n in model.graph.node if n.op_type == "GRU"]
    gru.name = ""
    req.onnx_model = model.SerializeToString()
    req.graph.claimed.CopyFrom(claims_message(want))
    report = run_request(req)
    assert report.verdict == "pass", report.to_text()
    keys = sorted(k for k in want if k.startswith("rnn."))
    explained = {w.split("'")[1]: w for w in report.warnings if "not checkable" in w}
    assert sorted(explained) == keys, report.warnings
    stacked = set(gru.input[1:4])  # W, R, B
    assert all(all(f"{t} read by the GRU node" in w for t in stacked) for w in explained.values()), explained
    rows = {p.name for p in report.parameters}
    assert not rows & stacked and {"emb.weight", "head.bias"} <= rows, report.to_text()


def test_holders_of_a_folded_parameter_are_never_scales_masks_or_rotary_tables():
    # tables.may_hold on a real ModelProto: of four constants an exporter made, only the one read as a value
    # (an Add's operand) may hold a folded parameter; Resize's scales, a causal mask and a table read only
    # through Cos are made of buffers and numbers, and the "not checked" note never names them
    from onnx import TensorProto, helper, numpy_helper

    from gradcheck_svc.onnx_import.tables import may_hold

    values = {"scales": np.array([1.0, 1.0, 2.0, 2.0], np.float32),
              "mask": np.array([0.0, np.finfo(np.float32).min], np.float32),
              "freqs": np.array([0.5, 0.25], np.float32), "permute_1": np.array([0.1, -0.2], np.float32)}
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["r"]), helper.make_node("Add", ["t", "mask"], ["m"]),
             helper.make_node("Cos", ["freqs"], ["c"]), helper.make_node("Add", ["m", "permute_1"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "xt"],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("r", "c", "y")],
                              [numpy_helper.from_array(v, n) for n, v in values.items()])
    assert may_hold(graph, values, set(values)) == {"permute_1"}


def test_a_constant_repeating_a_weight_over_leading_dimensions_is_tied_to_it():
    # ties.find_ties: the dynamo optimizer's folded first step of an nn.RNN (`linear_1`: b_hh over the batch) is
    # b_hh broadcast; a ones tensor's repetition, or a near-copy, is no tie (its gradient would be made up)
    from gradcheck_svc.onnx_import.ties import find_ties

    b = np.array([0.3, -1.2, 0.7])
    inits = {"rnn.bias_hh_l0": b, "ln.weight": np.ones(3), "linear_1": np.broadcast_to(b, (1, 2, 3)).copy(),
             "onnx::Add_1": np.ones((2, 3)), "val_2": np.stack([b, b + [0.0, 0.0, 1e-12]])}
    assert find_ties(inits, {"linear_1", "onnx::Add_1", "val_2"}, {"rnn.bias_hh_l0", "ln.weight"}) == \
        {"linear_1": ("rnn.bias_hh_l0", "broadcast")}


class _Sliced(torch.nn.Module):
    """A weight read whole and through a block of it (`self.pos[:, :T]`, `w[:3, :3]`): the TorchScript exporter's
    constant folding stores the block as an initializer of its own (onnx::ReduceSum_N)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 5, dtype=torch.float64))

    def forward(self, x):
        return (x @ self.w)[:, :3] * self.w[1:3, 2:5].sum(0)


def test_a_folded_block_of_a_weight_is_tied_to_it_and_torchs_gradient_passes_claimed():
    # ties.find_ties "sliced": held constant, the block's part of w's gradient would be lost -- torch's own
    # gradient, claimed, failed as a mismatch on a correct model; a wrong element of it still fails
    torch.manual_seed(0)
    model, x = _Sliced(), torch.randn(2, 4, dtype=torch.float64)
    blob = export_onnx(model, (x,), "legacy")
    m = onnx.load_from_string(blob)
    folded = [t.name for t in m.graph.initializer if t.name != "w"]
    assert folded and all(n.startswith("onnx::") for n in folded)  # what the exporter does today
    xname = m.graph.input[0].name
    (want,) = torch.autograd.grad(model(x).sum(), [model.w])
    req = service_pb2.VerifyRequest(onnx_model=blob, onnx=service_pb2.OnnxImport(inputs={xname: _tensor(x.numpy())}),
                                    options=service_pb2.VerifyOptions(symbolic=False))  # finite differences judge
    graph, _ = prepare(req)
    assert set(graph.parameters) == {"w"}
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    np.testing.assert_allclose(engine.gradients["w"], want.numpy(), rtol=1e-12, atol=1e-12)
    req.graph.claimed.CopyFrom(claims_message({"w": want.numpy()}))
    assert run_request(req).verdict == "pass"
    req.graph.claimed.CopyFrom(claims_message(_corrupted({"w": want.numpy()}, "w", 7)))  # w[1, 2]: in the block
    bad = run_request(req)
    assert bad.verdict == "fail" and [p.name for p in bad.parameters if p.status != "ok"] == ["w"], bad.to_text()
