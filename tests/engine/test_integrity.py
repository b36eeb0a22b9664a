"""Saved-tensor integrity: fingerprints taken at save, checked when the backward reads them;
every --fault kind is caught and named as cache_corruption at the node that read it."""
import json
import os

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY, cuda_available
from gradcheck_svc.engine import Program, backward, forward, inject, parse_fault, prepare_feeds
from gradcheck_svc.engine.faults import KINDS
from gradcheck_svc.graph import load_graph
from gradcheck_svc.verify import VerifyOptions, verify

from conftest import EXAMPLES, ROOT
import forked_cli

SEED = EXAMPLES / "seed.json"


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'clients' / 'python'}")
    return forked_cli.run("gradcheck_svc.cli", *args, env=env, timeout=120)


def test_seed_overwrite_is_named_cache_corruption_at_the_square():
    report = verify(load_graph(SEED), VerifyOptions(faults=(parse_fault("z:overwrite:999"),)))
    assert report.verdict == "fail"
    [f] = report.findings
    assert (f.node, f.op, f.cause, f.severity) == ("a", "square", "cache_corruption", "error")
    assert f.to_text().startswith("node 'a' (square): cache_corruption — saved input 'z' changed between "
                                  "forward and backward (6 → 999)")
    assert (f.worst.engine, f.worst.reference) == (999.0, 6.0)
    assert f.parameters == ["w", "x"]


def test_clean_seed_has_no_findings():
    report = verify(load_graph(SEED))
    assert report.verdict == "pass" and report.findings == []


@pytest.mark.parametrize("kind", [k for k in KINDS])
def test_every_fault_kind_is_caught_in_the_store(kind):
    spec = {"overwrite": "z:overwrite:999", "scale": "z:scale:3", "bitflip": "z:bitflip", "stale": "z:stale:0.5"}
    fault = parse_fault(spec.get(kind, f"z:{kind}"))
    report = verify(load_graph(SEED), VerifyOptions(faults=(fault,)))
    causes = {(f.node, f.cause, f.severity) for f in report.findings}
    assert ("a", "cache_corruption", "error") in causes
    assert report.verdict == "fail"


@pytest.mark.parametrize("text, node, kind, value", [
    ("dense/BiasAdd:0:scale:3", "dense/BiasAdd:0", "scale", 3.0),  # a name holding ':' could not be targeted
    ("z:1:nan", "z:1", "nan", None),
    ("z:overwrite:nan", "z", "overwrite", np.nan),  # a NaN value is a value, not the kind
])
def test_a_fault_on_a_node_whose_name_holds_a_colon(text, node, kind, value):
    fault = parse_fault(text)
    assert (fault.node, fault.kind) == (node, kind)
    assert (fault.value is None) == (value is None)
    assert value is None or np.isclose(fault.value, value, equal_nan=True)


def test_fingerprint_is_taken_at_save_before_injection():
    graph = load_graph(SEED)
    program = Program(graph, np.float64)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY), integrity="check")
    inject(np, tape.store, parse_fault("z:overwrite:999"), NUMPY.to_host)
    grads = backward(tape)
    [ev] = tape.store.events
    assert (ev.kind, ev.node, ev.source, ev.value_changed) == ("corruption", "a", "z", True)
    assert float(ev.tensor) == 999.0
    assert float(grads["w"]) == 999.0  # the backward still ran on the corrupted value (as the seed's tape does)


def test_integrity_off_records_nothing_but_diagnosis_still_infers_the_node():
    graph = load_graph(SEED)
    program = Program(graph, np.float64)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY), integrity="off")
    inject(np, tape.store, parse_fault("z:overwrite:999"), NUMPY.to_host)
    backward(tape)
    assert tape.store.events == []
    report = verify(graph, VerifyOptions(faults=(parse_fault("z:scale:2"),), integrity="off"))
    [f] = report.findings
    assert (f.node, f.cause, f.severity) == ("a", "cache_corruption", "error")
    assert "integrity checking off" in f.detail


def test_a_bit_flip_deep_in_a_large_tensor_is_caught():
    b_graph = load_graph(EXAMPLES / "faults" / "cached_activations.json")
    report = verify(b_graph, VerifyOptions(faults=(parse_fault("t:bitflip:3"),)))  # a low mantissa bit
    assert any(f.cause == "cache_corruption" and f.node in ("t", "sq") for f in report.findings)
    assert report.verdict == "fail"


def _square_of(n: int):
    """z = w * x; a = square(z) (saves z: n float64 elements); L = sum(a)."""
    from gradcheck_svc.graph.build import GraphBuilder
    rng = np.random.default_rng(n)
    b = GraphBuilder("sq")
    z = b.node("mul", b.input("w", rng.uniform(1, 2, n), requires_grad=True), b.input("x", rng.uniform(1, 2, n)),
               name="z")
    b.output(b.node("sum", b.node("square", z, name="a"), name="L"))
    return Program(load_graph(b.build()), np.float64)


@pytest.mark.parametrize("n", [100, 512, 4096])  # 800 B, 4 KiB, 32 KiB: the bytes, their hash, the word sum + dot
def test_every_fault_kind_is_caught_at_each_host_fingerprint_size(n):
    program = _square_of(n)
    spec = {"overwrite": "z:overwrite:999", "scale": "z:scale:3", "bitflip": "z:bitflip:0", "stale": "z:stale:0.5"}
    for kind in KINDS:
        tape = forward(program, NUMPY, prepare_feeds(program, NUMPY), integrity="check")
        earlier = {"z": program.graph.inputs["w"].value * program.graph.inputs["x"].value * 0.5}
        inject(np, tape.store, parse_fault(spec.get(kind, f"z:{kind}")), NUMPY.to_host, earlier)
        backward(tape)
        assert [(e.kind, e.node, e.source) for e in tape.store.events] == [("corruption", "a", "z")], kind
    clean = forward(program, NUMPY, prepare_feeds(program, NUMPY), integrity="check")
    backward(clean)
    assert clean.store.events == []


def test_cli_json_findings_and_flags():
    r = run_cli("verify", str(SEED), "--fault", "z:overwrite:999", "--format", "json")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    [f] = d["findings"]
    assert f == {"node": "a", "op": "square", "cause": "cache_corruption", "severity": "error",
                 "parameters": ["w", "x"], "detail": f["detail"],
                 "worst_element": {"index": [], "engine": 999.0, "reference": 6.0}}
    assert d["verdict"] == "fail" and "parameters" in d and "memory" in d
    r = run_cli("verify", str(SEED), "--integrity", "bogus")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run_cli("verify", str(SEED), "--fault", "z:scale:2", "--no-localize", "--integrity", "off",
                "--format", "json")
    d = json.loads(r.stdout)
    # nothing localized, yet a FAIL names where: the failing parameters, as gradient_mismatch
    assert r.returncode == 1 and d["verdict"] == "fail"
    assert {(f["node"], f["cause"]) for f in d["findings"]} == {(p["name"], "gradient_mismatch")
                                                                for p in d["parameters"] if p["status"] == "FAIL"}


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("fault", ["z:overwrite:999", "z:bitflip"])
def test_fingerprints_on_the_gpu_catch_faults(fault):
    report = verify(load_graph(SEED), VerifyOptions(device="cuda", faults=(parse_fault(fault),)))
    assert ("a", "cache_corruption", "error") in {(f.node, f.cause, f.severity) for f in report.findings}
    big = load_graph(EXAMPLES / "faults" / "cached_activations.json")  # device-side Fletcher sums
    report = verify(big, VerifyOptions(device="cuda", faults=(parse_fault("t:bitflip:3"),)))
    assert any(f.cause == "cache_corruption" for f in report.findings)
    assert verify(big, VerifyOptions(device="cuda")).findings == []
