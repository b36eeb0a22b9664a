"""Gradient checkpointing: bit-identical gradients under every policy on
chains, residual graphs and an MLP; sqrt-like activation memory; the
recompute check (a planted nondeterministic op is named, replayed dropout is
not); the measured memory figures."""
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from google.protobuf import json_format

from gradcheck_svc import cli
from gradcheck_svc.backend import NUMPY, cuda_available, get_backend
from gradcheck_svc.engine import Program, backward, checkpoint_plan, forward, parse_policy, prepare_feeds
from gradcheck_svc.engine.fingerprint import fingerprints, word_sums
from gradcheck_svc.errors import OptionError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops.base import FLOAT, OpDef, Spec
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify
from graphs_memory import chain, mlp, residual

POLICIES = ["sqrt", "every:1", "every:2", "every:3", "every:7"]


def gradients(graph, policy, backend=NUMPY):
    program = Program(graph, np.float64)
    feeds = prepare_feeds(program, backend)
    tape = forward(program, backend, feeds, checkpoint=checkpoint_plan(program, policy))
    grads = backward(tape)
    return tape, {p: backend.to_host(g) for p, g in grads.items()}


def explicit(graph, every=4):
    """An explicit list: every 4th node by name."""
    return ",".join(n.name for n in graph.nodes[::every])


@pytest.mark.parametrize("make", [lambda: chain(40), residual, mlp], ids=["chain40", "residual", "mlp"])
def test_gradients_bit_identical_under_every_policy(make):
    graph = make()
    _, base = gradients(graph, "none")
    assert any(np.any(g != 0) for g in base.values())
    for policy in POLICIES + [explicit(graph)]:
        tape, grads = gradients(graph, policy)
        for p in base:
            assert np.array_equal(grads[p], base[p]), f"{policy}: gradient of {p} differs"
        run = tape.checkpoint
        assert run.mismatches == []
        # everything recomputed was released: nothing kept, nothing saved after backward
        assert run.kept == {} and len(tape.store) == 0 and tape.store.saved.current == 0
        assert tape.op_evaluations > len(tape.program.steps)  # something was recomputed


def test_residual_keeps_values_that_cross_segments():
    graph = residual()
    program = Program(graph, np.float64)
    plan = checkpoint_plan(program, "every:3")
    # h0 is read by every later block, so it must be kept until the earliest of those segments is recomputed
    readers = [program.by_name[f"g{k}"].index for k in range(1, 6)]
    assert "h0" in plan.kept
    assert plan.kept["h0"] == min(plan.segment_of[i] for i in readers if plan.segment_of[i] != plan.final)
    # every value a checkpointed segment reads from an earlier segment is kept
    for s, seg in enumerate(plan.segments[:-1]):
        for i in seg:
            for name in program.steps[i].inputs:
                if name in program.by_name and plan.segment_of[program.by_name[name].index] < s:
                    assert name in plan.kept


def test_segments_without_gradients_are_neither_kept_nor_recomputed():
    """A no-grad prefix (data preprocessing) before the parameters enter."""
    b = GraphBuilder("prefix")
    h = b.input("x", np.linspace(-1, 1, 6).reshape(2, 3))
    for k in range(4):
        h = b.node("sin", h, name=f"p{k}")
    for k in range(4):
        h = b.node("tanh", b.node("matmul", h, b.input(f"W{k}", np.eye(3) * 0.5, requires_grad=True)), name=f"h{k}")
    b.output(b.node("sum", h, name="loss"))
    graph = load_graph(b.build())
    _, base = gradients(graph, "none")
    tape, grads = gradients(graph, "every:2")
    plan = tape.checkpoint.plan
    assert plan.recomputed[:2] == [False, False]  # p0..p3 need no gradient
    assert "p1" not in plan.kept and "p3" in plan.kept  # p3 enters the first recomputed segment
    recomputed = sum(len(seg) for s, seg in enumerate(plan.segments) if plan.recomputed[s])
    assert tape.op_evaluations == len(plan.segment_of) + recomputed
    assert all(np.array_equal(grads[p], base[p]) for p in base)


def test_verify_under_checkpoint_reports_pass_and_equal_gradients():
    graph = residual()
    plain = verify(graph)
    report = verify(graph, VerifyOptions(checkpoint="every:3"))
    assert report.verdict == "pass" and report.findings == []
    m = report.memory
    assert m["checkpoint"] == "every:3" and m["checkpoint_profile"] == "every:3"
    assert m["checkpoint_gradients_equal"] is True
    for a, b in zip(plain.parameters, report.parameters):
        assert np.array_equal(a.gradient, b.gradient)
    assert m["checkpoint_op_evaluations"] > m["op_evaluations"]


def _fit_exponent(ns, values):
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


def test_activation_peak_linear_without_and_sqrt_with_checkpointing():
    ns = [16, 64, 256]
    peaks = {"none": [], "sqrt": []}
    for n in ns:
        graph = chain(n, width=8, batch=4)
        for policy in peaks:
            tape, _ = gradients(graph, policy)
            peaks[policy].append(tape.store.saved.peak)
    none, sqrt = _fit_exponent(ns, peaks["none"]), _fit_exponent(ns, peaks["sqrt"])
    assert 0.9 < none < 1.1, peaks
    assert 0.35 < sqrt < 0.65, peaks
    assert peaks["sqrt"][-1] < peaks["none"][-1] / 5


def test_inference_saves_nothing():
    small, big = chain(16), chain(256)
    peaks = []
    for graph in (small, big):
        program = Program(graph, np.float64)
        feeds = prepare_feeds(program, NUMPY)
        tape = forward(program, NUMPY, feeds, grad=False)
        assert tape.store is None
        inputs = sum(v.nbytes for v in feeds.values())
        peaks.append(tape.live.peak - inputs)
    # beyond the inputs, a no-grad chain holds at most a few layer outputs at a time, whatever its depth
    layer = 4 * 8 * 8
    assert peaks[0] == peaks[1] and peaks[1] <= 3 * layer
    report = verify(small)
    assert report.memory["inference_peak_bytes"] < report.memory["live_peak_bytes"]


def test_memory_figures_are_the_bytes_held():
    """x (100 float64, a parameter) -> a = tanh(x) -> b = tanh(a) -> sum: each tanh saves its output."""
    b = GraphBuilder("two_tanh")
    x = b.input("x", np.linspace(-1, 1, 100), requires_grad=True)
    b.output(b.node("sum", b.node("tanh", b.node("tanh", x, name="a"), name="b"), name="L"))
    m = verify(load_graph(b.build())).memory
    assert m["parameters_bytes"] == 800 and m["gradients_bytes"] == 800
    assert m["activations_peak_bytes"] == 1600  # a and b; the parameter x is not an activation
    assert m["inference_peak_bytes"] == 2400  # x, a, b while b is computed; then a is released
    assert m["op_evaluations"] == 3 and m["memory_source"] == "engine_arrays"


# --- the recompute check -------------------------------------------------------------------------


def _noisy_op():
    """A test-only nondeterministic op: each evaluation adds a different tiny offset."""
    calls = [0]

    def fwd(xp, x):
        calls[0] += 1
        return x + 1e-9 * calls[0]

    return OpDef(name="test_nondeterministic", forward=fwd, vjp=lambda xp, g, s: (g,),
                 infer=lambda node, specs, attrs: (Spec(specs[0].shape, FLOAT), attrs),
                 arity=1, input_kinds=(FLOAT,), doc="test only")


@pytest.fixture
def noisy_op():
    op = register(_noisy_op())
    try:
        yield op
    finally:
        del REGISTRY[op.name]


def _noisy_chain():
    rng = np.random.default_rng(5)
    b = GraphBuilder("noisy")
    h = b.input("x", rng.uniform(-1, 1, size=(2, 4)))
    for k in range(6):
        w = b.input(f"W{k}", rng.standard_normal((4, 4)) / 2, requires_grad=True)
        h = b.node("tanh", b.node("matmul", h, w, name=f"z{k}"), name=f"h{k}")
        if k == 1:
            h = b.node("test_nondeterministic", h, name="noise")
    b.output(b.node("sum", h, name="loss"))
    return load_graph(b.build())


def test_recompute_mismatch_names_the_nondeterministic_node(noisy_op):
    graph = _noisy_chain()
    report = verify(graph, VerifyOptions(checkpoint="every:2"))
    found = [f for f in report.findings if f.cause == "recompute_mismatch"]
    assert [f.node for f in found] == ["noise"]  # where it starts, not the values downstream of it
    f = found[0]
    assert f.op == "test_nondeterministic" and f.severity == "error"
    assert f.parameters == ["W0", "W1"]  # the parameters whose gradient flows through it
    assert set(f.to_dict()) == {"node", "op", "cause", "severity", "parameters", "detail", "worst_element"}
    assert report.verdict == "fail"
    d = report.to_dict()
    assert d["findings"][0]["node"] == "noise"
    json.dumps(d)
    # without checkpointing in force, the sqrt what-if profile still warns
    report = verify(graph)
    assert [(f.node, f.severity) for f in report.findings] == [("noise", "warning")]
    assert "node 'noise' (test_nondeterministic): recompute_mismatch" in report.to_text()


def test_noisy_op_is_not_in_the_shipped_registry():
    assert "test_nondeterministic" not in REGISTRY


def test_dropout_is_replayed_on_recompute():
    graph = mlp(dropout=True)
    program = Program(graph, np.float64)
    feeds = prepare_feeds(program, NUMPY)
    a = forward(program, NUMPY, feeds, grad=False, keep_values=True).values
    b = forward(program, NUMPY, feeds, grad=False, keep_values=True).values
    assert np.array_equal(a["drop0"], b["drop0"])
    dropped = (a["drop0"] == 0) & (a["act0"] != 0)
    assert 0 < dropped.sum() < dropped.size  # it really drops, and not everything
    assert np.allclose(a["drop0"][~dropped], a["act0"][~dropped] / 0.7)
    # the same seed at another node draws another mask
    assert not np.array_equal(a["drop1"] == 0, a["drop0"][:, :16] == 0)

    _, base = gradients(graph, "none")
    for policy in ("every:2", "sqrt", "drop0,drop1"):
        tape, grads = gradients(graph, policy)
        assert tape.checkpoint.mismatches == []
        recomputed = {program.steps[i].name for s, seg in enumerate(tape.checkpoint.plan.segments)
                      if tape.checkpoint.plan.recomputed[s] for i in seg}
        assert "drop0" in recomputed
        assert all(np.array_equal(grads[p], base[p]) for p in base)
    report = verify(graph, VerifyOptions(checkpoint="every:2"))
    assert report.verdict == "pass" and report.findings == []


def test_batched_fingerprints_equal_single_ones(rng):
    arrays = [rng.standard_normal((3, 5)), np.zeros((0, 2)), np.float32(rng.standard_normal(7)), np.array(2.5),
              rng.integers(0, 5, size=3), rng.standard_normal((6, 6))[::2, 1:], np.ones(3, dtype=bool)]
    assert fingerprints(NUMPY.xp, arrays) == [word_sums(NUMPY.xp, a) for a in arrays]
    changed = [a.copy() for a in arrays]
    changed[0][1, 2] += 1e-12
    assert fingerprints(NUMPY.xp, changed)[0] != fingerprints(NUMPY.xp, arrays)[0]


# --- policies and the command line -----------------------------------------------------------------


def test_policy_parsing():
    assert str(parse_policy("sqrt")) == "sqrt" and str(parse_policy("every:4")) == "every:4"
    assert str(parse_policy(["h1", "h2"])) == "h1,h2" and str(parse_policy(None)) == "none"
    for bad in ("every:0", "every:x", "a,,b"):
        with pytest.raises(OptionError) as e:
            parse_policy(bad)
        assert e.value.field == "checkpoint"
    program = Program(chain(4), np.float64)
    for name, why in (("nope", "not a node of this graph"), ("W1", "a graph input")):
        with pytest.raises(OptionError, match=why):
            checkpoint_plan(program, name)
    plan = checkpoint_plan(program, "every:5")
    assert [len(s) for s in plan.segments] == [5, 5, 3] and plan.final == 2
    assert len(checkpoint_plan(program, "sqrt").segments) == round(math.sqrt(len(program.steps)))


def test_cli_checkpoint_json_and_memory_plots(tmp_path, capsys):
    path = tmp_path / "residual.json"
    path.write_text(json_format.MessageToJson(residual(as_message=True)))
    svg = tmp_path / "mem.svg"
    rc = cli.main(["verify", str(path), "--checkpoint", "sqrt", "--format", "json", "--memory-plot", str(svg)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    keys = {"parameters_bytes", "gradients_bytes", "activations_peak_bytes", "live_peak_bytes",
            "inference_peak_bytes", "op_evaluations"}
    assert keys <= set(out["memory"]) and out["memory"]["checkpoint"] == "sqrt"
    root = ET.parse(svg).getroot()
    lines = [e for e in root.iter() if e.tag.endswith("polyline")]
    assert len(lines) == 3  # none, inference, sqrt
    labels = " ".join(e.text or "" for e in root.iter() if e.tag.endswith("text"))
    assert "sqrt checkpointing" in labels and "no checkpointing" in labels
    png = tmp_path / "mem.png"
    assert cli.main(["verify", str(path), "--memory-plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "memory: training" in text and "sqrt checkpointing would need" in text

    assert cli.main(["verify", str(path), "--checkpoint", "every:0"]) == 2
    assert cli.main(["verify", str(path), "--checkpoint", "h1,nope"]) == 2
    assert cli.main(["verify", str(path), "--memory-plot", str(tmp_path / "m.pdf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # a policy that does not parse is an option error at the edge, naming the flag; one naming a value the
    # graph lacks is the graph's verification's, naming the option
    assert err == ["gradcheck-svc: error: --checkpoint: 'every:0': every:K needs a positive integer K",
                   "gradcheck-svc: error: checkpoint: 'nope' is not a node of this graph",
                   f"gradcheck-svc: error: memory-plot: '{tmp_path / 'm.pdf'}': the plot file must end in "
                   ".svg or .png"]


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_cupy_checkpoint_matches_and_reads_the_pool():
    backend = get_backend("cuda")
    graph = residual()
    _, base = gradients(graph, "none", backend)
    _, grads = gradients(graph, "sqrt", backend)
    assert all(np.array_equal(grads[p], base[p]) for p in base)
    report = verify(graph, VerifyOptions(device="cuda", checkpoint="sqrt"))
    assert report.memory["memory_source"] == "cupy_pool" and report.memory["live_peak_bytes"] > 0


def test_the_recompute_checks_cheap_fingerprint_sees_any_changed_or_moved_word():
    from gradcheck_svc.engine.fingerprint import pass_fingerprint

    a = np.random.default_rng(0).random((256, 32))
    fp = pass_fingerprint(np, a)
    assert pass_fingerprint(np, a.copy()) == fp
    swapped = a.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # rows moved, the same words
    flipped = a.copy()
    flipped.view(np.uint64).reshape(-1)[77] ^= 1  # one bit
    assert pass_fingerprint(np, swapped) != fp and pass_fingerprint(np, flipped) != fp
    nan = a.copy()
    nan[3, 3] = np.nan
    assert pass_fingerprint(np, nan) == pass_fingerprint(np, nan.copy()) != fp
    other = nan.copy()
    other[4, 4] = np.inf  # a second non-finite word: the dot is NaN either way, the word sum is not
    assert pass_fingerprint(np, other) != pass_fingerprint(np, nan)
