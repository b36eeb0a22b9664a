"""Issue 34 item 4: GPT-2- and LLaMA-style decoder blocks (tests/lm_blocks.py, plain torch) through
both exporters import and verify PASS, with the loss torch computes and every parameter's gradient
equal to torch autograd's through its source_names. A causal mask's -inf (LLaMA's triu,
scaled_dot_product_attention's is_causal) is the model's own constant, not input data: no
--allow-nonfinite needed; a user's input holding NaN/Inf is still refused."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from lm_blocks import block  # noqa: E402
from torch_export import export_onnx  # noqa: E402

from gradcheck.v1 import service_pb2  # noqa: E402
from gradcheck_svc.errors import GraphError  # noqa: E402
from gradcheck_svc.limits import ServerLimits  # noqa: E402
from gradcheck_svc.onnx_import import graph_from_request  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.ir import FOLDED_CONSTANTS  # noqa: E402
from gradcheck_svc.request import prepare  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.engine_run import run_engine  # noqa: E402

EXPORTERS = ("legacy", "dynamo")
# read twice by the forward (input and output embedding): the exporters keep one read under its name and make
# the other a tensor of their own (wte.weight transposed), which the importer ties back (onnx_import/ties.py):
# wte.weight's gradient is torch's whole one, its copy's reads included
TIED = {"gpt2": {"wte.weight"}}
# folded by the dynamo exporter's optimizer at the constant positions (wpe read at arange(t)): not in the model,
# named by the report's note instead
FOLDED = {("gpt2", "dynamo"): {"wpe.weight"}}


_LEGACY: dict = {}  # block name -> its TorchScript export


def export(model, ids, exporter: str, name: str | None = None) -> bytes:
    """`name`: the lm_blocks.block (seeded) the model is, exported once per process by each exporter."""
    if exporter == "dynamo":  # the dynamo exporter's defaults, its optimizer on
        return export_onnx(model, (ids,), "dynamo", key=None if name is None else (__name__, name))
    if name in _LEGACY:
        return _LEGACY[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        f = io.BytesIO()
        torch.onnx.export(model, (ids,), f, dynamo=False, input_names=["ids"])
    if name is not None:
        _LEGACY[name] = f.getvalue()
    return f.getvalue()


def tensor_bytes(a: np.ndarray) -> bytes:
    return onnx.numpy_helper.from_array(a).SerializeToString()


def request(blob: bytes, ids, c: np.ndarray, **options) -> service_pb2.VerifyRequest:
    name = next(vi.name for vi in onnx.load_from_string(blob).graph.input)
    return service_pb2.VerifyRequest(onnx_model=blob, onnx=service_pb2.OnnxImport(
        inputs={name: tensor_bytes(ids.numpy())}, loss="cotangent", cotangent=tensor_bytes(c)),
        options=service_pb2.VerifyOptions(**options))


def torch_gradients(model, ids, c) -> tuple[float, dict]:
    params = dict(model.named_parameters())
    loss = (model(ids) * torch.from_numpy(c)).sum()
    grads = torch.autograd.grad(loss, list(params.values()))
    return float(loss.detach()), {n: g.numpy() for n, g in zip(params, grads)}


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["gpt2", "llama", "llama_eager"])
def test_decoder_block_verifies_with_torchs_gradients(name, exporter):
    model, ids = block(name)
    c = np.random.default_rng(1).standard_normal(tuple(model(ids).shape))
    blob = export(model, ids, exporter, name)
    graph, _ = prepare(request(blob, ids, c), ServerLimits())  # the server's own path: no allow_nonfinite
    loss, want = torch_gradients(model, ids, c)
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    assert engine.loss == pytest.approx(loss, rel=1e-10)
    # each parameter's gradient is the sum of its torch parameters' ("same": merged, the exporter keeps one of
    # equal tensors) or their transpose; every torch parameter is compared so
    covered = set()
    for p in graph.parameters:
        entries = [(s.name, s.relation) for s in graph.inputs[p].source_names if s.relation != "tied"] or [(p, "same")]
        if any(r == "derived" for n, r in entries):
            continue
        tied = {s.name for s in graph.inputs[p].source_names if s.relation == "tied"}
        assert tied == {n for n, _ in entries} & TIED.get(name, set()), (p, graph.inputs[p].source_names)
        assert all(r in ("same", "transposed") for _, r in entries), (p, entries)
        expected = sum(want[n].T if r == "transposed" else want[n] for n, r in entries)
        np.testing.assert_allclose(engine.gradients[p], expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max(),
                                   err_msg=f"{name} ({exporter}): {p} = {entries}")
        covered |= {n for n, _ in entries}
    folded = FOLDED.get((name, exporter), set())
    assert covered == set(want) - folded, (sorted(want), sorted(covered))
    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    unchecked = [w for w in report.warnings if w.startswith("not checked")]
    # LLaMA's folded cos/sin tables and the causal masks are constants of the model: no folded-expression warning
    assert not [w for w in report.warnings if w.startswith(FOLDED_CONSTANTS)], report.warnings
    if folded:  # which parameter, into which constant (and who reads it), and how to keep it
        [note] = unchecked
        assert all(n in note for n in folded) and "embedding_1 read by node_add" in note, note
        # the line that reads the constant, from the exporter's metadata, names the parameter folded into it
        assert "wpe.weight: folded into embedding_1 read by node_add (`x = self.wte(ids) + self.wpe(torch.arange(" \
            in note, note
        assert "unsqueeze(0))`) by the exporter" in note, note
        assert note.count(" read by ") == 1, note  # the one constant that holds it, nothing else
        assert "optimize=False" in note and "do_constant_folding=False" in note, note
        assert "embedding_1" not in graph.parameters  # its gradient means nothing to a torch user
    else:
        assert not unchecked, unchecked


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["llama", "llama_eager"])
def test_rotary_cos_sin_tables_are_constants_by_default(name, exporter):
    """RoPE's cos/sin: the dynamo optimizer folds them into initializers named cos and sin; the TorchScript
    exporter computes them from constants in the graph (inverse frequencies times positions, Cos, Sin)."""
    model, ids = block(name)
    blob = export(model, ids, exporter, name)
    c = np.random.default_rng(1).standard_normal(tuple(model(ids).shape))
    graph, _ = prepare(request(blob, ids, c), ServerLimits())
    torch_names = set(dict(model.named_parameters()))
    for p in graph.parameters:  # every parameter is a torch parameter (or its transpose), none a table
        names = {s.name for s in graph.inputs[p].source_names} or {p}
        assert names <= torch_names, (p, names)
    inits = {t.name for t in onnx.load_from_string(blob).graph.initializer}
    if exporter == "dynamo":
        assert {"cos", "sin"} <= inits  # what the exporter does today: the tables are initializers
        assert {"cos", "sin"} <= set(graph.inputs) - set(graph.parameters)  # constants


def test_a_rotary_table_initializer_read_through_cos_and_sin_is_a_constant():
    """The TorchScript exporter keeps a persistent inverse-frequency buffer as an initializer that only
    Cos and Sin (through positions times it) read: a constant, while the same model's weights stay
    parameters; named explicitly, it is one."""
    from gradcheck_svc.onnx_import import import_onnx
    from gradcheck_svc.onnx_import.importer import ImportOptions

    model, ids = block("llama_eager")
    model.register_buffer("inv_freq", model.inv_freq.clone(), persistent=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = io.BytesIO()
        torch.onnx.export(model, (ids,), f, dynamo=False, input_names=["ids"], do_constant_folding=False)
    blob = f.getvalue()
    inits = {t.name for t in onnx.load_from_string(blob).graph.initializer}
    assert "inv_freq" in inits
    msg = import_onnx(blob, ImportOptions(inputs={"ids": ids.numpy()}))
    params = {i.name for i in msg.inputs if i.requires_grad}
    assert "inv_freq" not in params and "embed.weight" in params
    msg = import_onnx(blob, ImportOptions(params="weights,inv_freq", inputs={"ids": ids.numpy()}))
    assert "inv_freq" in {i.name for i in msg.inputs if i.requires_grad}


def test_a_users_nonfinite_input_is_still_refused():
    model, ids = block("llama_eager")
    c = np.random.default_rng(1).standard_normal(tuple(model(ids).shape))
    blob = export(model, ids, "legacy")
    c[0, 1, 2] = np.inf
    with pytest.raises(GraphError, match=r"onnx.cotangent: data holds 1 NaN/Inf value\(s\), first inf at index "
                                         r"\[0, 1, 2\] \(allow them with allow_nonfinite"):
        graph_from_request(request(blob, ids, c))
    load_graph(graph_from_request(request(blob, ids, c, allow_nonfinite=True)), allow_nonfinite=True)


def test_the_folded_note_fits_a_graphs_note_limit():
    """Many long parameter names and constants: the note is cut, never over validation's bound, and still
    ends with the way to keep them."""
    from gradcheck_svc.graph.validate import MAX_NOTE_LENGTH
    from gradcheck_svc.onnx_import.importer import _SIGNATURE, folded_note

    model = onnx.ModelProto()
    model.graph.metadata_props.add(key=_SIGNATURE, value=" ".join(
        f": PARAMETER target='{'layer' * 50}.{k}.weight'" for k in range(20)))
    note = folded_note(model, set(), {f"constant_{k}" * 20: None for k in range(20)})
    assert len(note) == MAX_NOTE_LENGTH and note.startswith("not checked: 20 torch parameter(s)")
    assert note.endswith("(the TorchScript exporter: do_constant_folding=False)")
