"""The bug zoo (examples/graphs/faults/manifest.json): every planted bug is detected and attributed to
the right node and cause; and clean graphs -- the bundled examples and random graphs, float64 and
float32 -- produce no error findings (false alarms are bugs too)."""
import numpy as np
import pytest

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import VerifyOptions, verify

from conftest import EXAMPLES
from op_cases import SMOOTH_BINARY, SMOOTH_UNARY  # the random graphs' vocabulary

from zoo_cases import CASES, run_case
from zoo_cases import case_param as _case_param


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_planted_bug_is_found_at_its_node_with_its_cause(case):
    ok, text = run_case(case)
    assert ok, f"expected {case['expect']}\n{text}"


def test_zoo_covers_every_cause_and_fault_kind():
    from gradcheck_svc.engine.faults import KINDS
    from gradcheck_svc.verify.findings import CAUSES

    causes = {c["expect"].get("cause") for c in CASES}
    # recompute_mismatch needs a nondeterministic op, which the registry does not have: test_checkpoint.py
    # registers one. fd_unresolved is real central differences' limit (their rounding eps |L| / h), which
    # the default complex steps do not have and no request option selects: test_fd_power.py and
    # test_fd_joint.py reach it with FDOptions(method="central")
    assert set(CAUSES) - causes == {"recompute_mismatch", "fd_unresolved"}
    kinds = {f.split(":")[1] for c in CASES for f in c.get("options", {}).get("faults", [])}
    assert kinds == set(KINDS)


CLEAN = sorted(p for p in EXAMPLES.rglob("*.json") if "faults" not in p.parts and not p.stem.endswith("_wrong"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.stem)
def test_clean_examples_have_no_error_findings(path, dtype):
    report = verify(load_graph(path), VerifyOptions(dtype=dtype))
    assert report.verdict == "pass", report.to_text()
    assert not [f for f in report.findings if f.severity == "error"]


def random_graph(seed: int, dtype: str):
    """Layers of tanh(op(h @ W_i, h)) with random smooth ops, then a weighted sum."""
    rng = np.random.default_rng(seed)
    cast = np.float32 if dtype == "float32" else np.float64
    b = GraphBuilder(f"random{seed}")
    width = int(rng.integers(2, 6))
    h = b.input("x", cast(rng.uniform(-1, 1, (3, width))))
    for i in range(int(rng.integers(3, 7))):
        W = b.input(f"W{i}", cast(rng.uniform(-1, 1, (width, width)) / np.sqrt(width)), requires_grad=True)
        m = b.node("matmul", h, W, name=f"mm{i}")
        m = b.node(str(rng.choice(SMOOTH_BINARY)), m, h, name=f"bin{i}")
        m = b.node(str(rng.choice(SMOOTH_UNARY)), m, name=f"un{i}")
        h = b.node("tanh", m, name=f"h{i}")
    r = b.input("r", cast(rng.uniform(0.5, 1.5, (3, width))))
    b.output(b.node("sum", b.node("mul", h, r, name="weighted"), name="L"))
    return load_graph(b.build())


def test_random_graph_vocabulary_comes_from_the_registry():
    assert {"sin", "exp", "tanh"} <= set(SMOOTH_UNARY) and {"add", "mul", "sub"} <= set(SMOOTH_BINARY)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("seed", range(6))
def test_random_clean_graphs_have_no_error_findings(seed, dtype):
    report = verify(random_graph(seed, dtype), VerifyOptions(dtype=dtype))
    assert not [f for f in report.findings if f.severity == "error"], report.to_text()
    assert report.verdict == "pass", report.to_text()
