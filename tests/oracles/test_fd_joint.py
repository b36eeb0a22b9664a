"""Finite differences at scale: the joint screen of all parameters at once (verify/joint_check.py),
the refinement cap that never leaves a silent verdict, and the invariant that a FAIL always says
where."""
import copy
import json
import re

import numpy as np
import pytest

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.fd_joint import LEVEL_RMS, LEVEL_SCALE, LEVELS
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.ops.base import FLOAT, OpDef, Spec
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify import fd_check as fd_check_module

from conftest import EXAMPLES
from plants import tanh_over_small_d
import forked_cli

CHAIN = EXAMPLES / "chain_256.json"
ZOO = json.loads((EXAMPLES / "faults" / "manifest.json").read_text())["cases"]


@pytest.fixture(scope="module")
def chain_doc():
    return json.loads(CHAIN.read_text())


def test_chain_256_is_screened_jointly_and_passes(chain_doc):
    report = verify(load_graph(chain_doc))
    assert report.verdict == "pass" and not report.findings
    by = {}
    for p in report.parameters:
        by.setdefault(p.fd.checked_by, []).append(p.name)
    # all but the cheapest tensors (the last layers: little downstream) are screened jointly
    assert set(by) == {"joint", "full"} and len(by["joint"]) > 400
    assert all(int(n[1:]) >= 200 for n in by["full"])
    row = report.to_dict()["parameters"][0]
    assert row["fd_checked_by"] == row["fd_mode"] == "joint" and row["status"] == "ok"
    # a joint row shows the whole graph's k directional derivatives: FD against the engine's sum; by complex
    # steps k is the fewest in which every element's power meets its goal (joint_check.joint_k): 4 here
    plan = report.to_dict()["fd_plan"]
    assert plan["directions"] == 4 and plan["directions_why"].startswith("the fewest (4 to 16)")
    assert len(row["reference"]) == len(row["engine_projection"]) == 4
    assert np.allclose(row["reference"], row["engine_projection"], rtol=1e-6, atol=1e-7)
    assert (f"finite differences: {len(by['joint'])} parameters screened jointly (4 directions spanning them all), "
            f"0 flagged and checked on their own; {len(by['full'])} full") in report.to_text()


def test_joint_differences_are_the_sum_of_each_blocks_projection():
    rng = np.random.default_rng(3)
    b = GraphBuilder("two_layers")
    h = b.node("tanh", b.node("matmul", b.input("x", rng.uniform(-1, 1, (3, 4))),
                              b.input("W", rng.uniform(-1, 1, (4, 5)), requires_grad=True)))
    h = b.node("add", h, b.input("c", rng.uniform(-1, 1, 5), requires_grad=True))
    b.output(b.node("sum", b.node("sin", h), name="L"))
    graph = load_graph(b.build())
    fd = FiniteDifferences(graph, FDOptions(mode="joint", directions=6))
    assert fd.mode_for("W") == fd.mode_for("c") == "joint"
    dirs = fd.joint_directions(["W", "c"])
    # Gaussian levels, never 0, weighted so that a row of the block is a unit vector on average (rms levels)
    for p, n in (("W", 20), ("c", 5)):
        assert np.all(dirs.block(p) != 0) and np.isclose(dirs.weight[p] * LEVEL_RMS * np.sqrt(n), 1.0)
    full = {p: fd.gradient(p, mode="full").reference.reshape(-1) for p in ("W", "c")}
    assert np.allclose(dirs.project("W", full["W"]), dirs.block("W") @ full["W"], rtol=1e-12, atol=1e-15)
    both = fd.joint(dirs, ["W", "c"]).reference
    only_c = fd.joint(dirs, ["c"], rows=np.array([1, 4])).reference
    expected = dirs.block("W") @ full["W"] + dirs.block("c") @ full["c"]
    # complex steps: the joint values and the full gradients agree to rounding
    assert np.allclose(both, expected, rtol=1e-12, atol=1e-14)
    assert np.allclose(only_c, (dirs.block("c") @ full["c"])[[1, 4]], rtol=1e-12, atol=1e-14)
    # several disjoint groups in one batched evaluation (the bisection's level): each copy perturbs its own
    # group only, so each group's values are its own joint() values
    groups = fd.joint_many(dirs, [(["W"], np.array([0, 2, 5])), (["c"], np.array([1, 4]))])
    assert [g.method for g in groups] == ["complex", "complex"]
    assert np.allclose(groups[0].reference, (dirs.block("W") @ full["W"])[[0, 2, 5]], rtol=1e-12, atol=1e-14)
    assert np.allclose(groups[1].reference, only_c, rtol=1e-12, atol=1e-14)


def _one_percent_op():
    return OpDef(name="test_grad_one_percent", forward=lambda xp, x: x * 1.0, vjp=lambda xp, g, s: (g * 1.01,),
                 infer=lambda node, specs, attrs: (Spec(specs[0].shape, FLOAT), attrs), arity=1,
                 input_kinds=(FLOAT,), doc="test only: identity whose gradient is 1% too large")


@pytest.fixture(scope="module")
def one_percent_op():
    op = register(_one_percent_op())
    try:
        yield op
    finally:
        del REGISTRY[op.name]


def _planted(doc, target):
    """chain_256 with `target`'s gradient made 1% too large (an identity node whose vjp is off)."""
    doc = copy.deepcopy(doc)
    nodes = doc["nodes"]
    i = next(k for k, n in enumerate(nodes) if target in n["inputs"])
    nodes[i]["inputs"] = [f"{target}_bug" if x == target else x for x in nodes[i]["inputs"]]
    nodes.insert(i, {"name": f"{target}_bug", "op": "test_grad_one_percent", "inputs": [target]})
    return load_graph(doc)


# the first layers, whose gradients vanish (~1e-6: a 1% error is 1e-8, under atol; held to their own
# size, compare.py), a mid-depth bias, weights, the last bias (cheap: checked in full)
@pytest.mark.parametrize("target", ["W0", "b0", "b5", "W7", "b40", "W100", "b255"])
def test_one_percent_error_in_one_of_512_tensors_is_found_and_localized(chain_doc, one_percent_op, target):
    report = verify(_planted(chain_doc, target))
    assert report.verdict == "fail"
    failing = [p.name for p in report.parameters if p.status != "ok"]
    assert failing == [target]
    row = next(p for p in report.parameters if p.name == target)
    assert row.fd.checked_by in ("joint, then full", "full")
    if row.fd.checked_by != "full":  # flagged by the screen (a neighbour in its half may be too, and pass)
        assert re.search(r"\b\d+ flagged and checked on their own", report.to_text())
    errors = [f for f in report.findings if f.severity == "error"]
    assert [(f.node, f.cause, f.parameters) for f in errors] == [(f"{target}_bug", "rule_error", [target])]


def test_fd_joint_option_through_the_cli():
    p = forked_cli.run("gradcheck_svc.cli", "verify", EXAMPLES / "mlp_cross_entropy.json", "--fd", "joint",
                       "--format", "json", timeout=120)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["parameters"]
    assert rows and all(r["fd_checked_by"] == "joint" and r["fd_mode"] == "joint" for r in rows)
    bad = forked_cli.run("gradcheck_svc.cli", "verify", EXAMPLES / "seed.json", "--fd", "jointly", timeout=120)
    assert bad.returncode == 2 and "--fd" in bad.stderr and "Traceback" not in bad.stderr


def test_joint_screen_flags_only_the_wrong_parameter(one_percent_op):
    rng = np.random.default_rng(7)
    b = GraphBuilder("small")
    h = b.input("x", rng.uniform(-1, 1, (4, 6)))
    for i in range(6):
        w = b.input(f"W{i}", rng.uniform(-1, 1, (6, 6)) / 2, requires_grad=True)
        if i == 3:
            w = b.node("test_grad_one_percent", w, name="bug")
        h = b.node("tanh", b.node("matmul", h, w))
    b.output(b.node("sum", h, name="L"))
    report = verify(load_graph(b.build()), VerifyOptions(fd=FDOptions(mode="joint")))
    assert {p.name: p.fd.checked_by for p in report.parameters} == {
        **{f"W{i}": "joint" for i in range(6)}, "W3": "joint, then full"}
    assert report.verdict == "fail"
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [("bug", "rule_error")]


def test_values_past_the_refinement_cap_are_undecided_never_a_silent_fail_nor_a_silent_pass(monkeypatch):
    monkeypatch.setattr(fd_check_module, "REFINE_MAX", 64)
    # real central differences (complex steps decide every value on the first pass: test_fd_complex.py)
    central = VerifyOptions(fd=FDOptions(method="central"), symbolic=SymbolicOptions(enabled=False))
    report = verify(tanh_over_small_d(300), central)
    # values never refined decide nothing either way: the row is undecided and the verdict not a pass
    assert report.verdict == "fail"
    row = report.parameters[0]
    assert row.status == "undecided" and row.failed_by == "fd_unresolved"
    fd = row.fd
    assert len(fd.refined) == 64 and fd.unrefined > 0
    assert len(fd.undecidable) >= fd.unrefined
    # one finding says it all: which values, how many never refined, and that the parameter is undecided
    assert [(f.cause, f.severity, f.parameters) for f in report.findings] == [("fd_unresolved", "error", ["x"])]
    (u,) = report.findings
    assert f"{fd.unrefined} still off on the first pass" in u.detail and "after 64 values" in u.detail
    assert "undecided" in u.detail and u.worst is not None
    # without the cap every value is refined to a decision
    monkeypatch.setattr(fd_check_module, "REFINE_MAX", 2048)
    report = verify(tanh_over_small_d(300), central)
    assert report.verdict == "pass" and not report.findings and len(report.parameters[0].fd.refined) > 64


EXAMPLE_CASES = [pytest.param({"graph": str(p.relative_to(EXAMPLES)), "options": {}}, id=p.stem)
                 for p in sorted(EXAMPLES.glob("*.json")) if p.stem != "chain_256"]
ZOO_CASES = [pytest.param({**c, "graph": "faults/" + c["graph"]},
                          id=f"zoo-{c['graph']}-{','.join(f'{k}={v}' for k, v in c.get('options', {}).items())}")
             for c in ZOO]


@pytest.mark.parametrize("localize", [True, False], ids=["localize", "no-localize"])
@pytest.mark.parametrize("case", EXAMPLE_CASES + ZOO_CASES)
def test_a_fail_verdict_always_names_a_node_or_parameter(case, localize):
    from gradcheck_svc.engine import parse_fault
    from gradcheck_svc.errors import GradcheckError

    options = dict(case["options"], localize=localize and case["options"].get("localize", True))
    options["faults"] = tuple(parse_fault(f) for f in options.get("faults", ()))
    graph = load_graph(EXAMPLES / case["graph"])
    try:
        report = verify(graph, VerifyOptions(**options))
    except GradcheckError:
        return  # refused with a one-line error (the zoo's in-place hazards): no verdict to check
    if localize:  # without it, what only a diagnosis explains (float32 rounding) stays a FAIL -- named
        assert report.verdict == case.get("expect", {}).get("verdict", report.verdict)
    if report.verdict == "fail":
        errors = [f for f in report.findings if f.severity == "error"]
        assert errors, report.to_text()
        names = set(graph.inputs) | {n.name for n in graph.nodes}
        assert all(f.node in names for f in errors), report.to_text()
        failing_rows = {p.name for p in report.parameters if p.status == "FAIL"}
        assert failing_rows <= {p for f in errors for p in f.parameters}, report.to_text()


@pytest.fixture(scope="module")
def grpc_client(tmp_path_factory):
    from grpc_helpers import module_client

    yield from module_client(tmp_path_factory, "--workers", "1")


def test_fd_joint_and_checked_by_over_grpc(grpc_client):
    report = grpc_client.verify(str(EXAMPLES / "mlp_cross_entropy.json"), fd_mode="joint")
    assert report.verdict == "pass"
    assert report.parameters and all(p.data["fd_checked_by"] == "joint" and p.fd_mode == "joint"
                                     for p in report.parameters)
    # the default on the many-tensor example: screened jointly, over the wire as well
    report = grpc_client.verify(str(CHAIN))
    assert report.verdict == "pass"
    assert {p.data["fd_checked_by"] for p in report.parameters} == {"joint", "full"}
    # the absolute term each row was held to comes over the wire too (the rows the screen cleared have none)
    assert all(("absolute" in p.data["tolerance"]) == (p.data["fd_checked_by"] != "joint") for p in report.parameters)
    assert all(p.data["tolerance"]["absolute"] > 0 for p in report.parameters if p.data["fd_checked_by"] == "full")
    # a gradient central differences leave undecided (values past their refinement cap: in process above) is
    # decided by complex steps on the first pass, over the wire as well, and the plan says so
    report = grpc_client.verify(str(EXAMPLES / "faults" / "past_the_refinement_cap.json"))
    assert report.verdict == "pass" and not [f for f in report.findings if f.severity == "error"]
    (row,) = report.parameters
    assert row.status == "ok" and row.data["fd_refined"] == 0 and row.data["fd_undecidable"] == []
    assert report.data["fd_plan"]["method"] == {"x": "complex"}


def test_after_a_confirmed_mismatch_unrefined_values_are_unconfirmed_not_shown_with_a_rounding_bound(one_percent_op):
    """Every element of W is 1% off: the first refined batch confirms the mismatch and refining stops.
    The rest, off on the first pass alone, are counted as unconfirmed and left out of the comparison,
    so the worst element shown is a refined one, with a bound that covers truncation too."""
    rng = np.random.default_rng(11)
    b = GraphBuilder("all_off")
    w = b.node("test_grad_one_percent", b.input("W", rng.uniform(-1, 1, (10, 10)), requires_grad=True), name="bug")
    h = b.node("tanh", b.node("matmul", b.input("x", rng.uniform(-1, 1, (3, 10))), w))
    b.output(b.node("sum", b.node("sin", h), name="L"))
    report = verify(load_graph(b.build()), VerifyOptions(symbolic=SymbolicOptions(enabled=False)))
    assert report.verdict == "fail"
    (row,) = report.parameters
    refined, unconfirmed = set(row.fd.refined.tolist()), set(row.fd.unconfirmed.tolist())
    assert len(refined) == fd_check_module.REFINE_BATCH and len(unconfirmed) == 100 - len(refined)
    assert not refined & unconfirmed
    worst = int(np.ravel_multi_index(row.fd.comparison.worst_index, row.shape))
    assert worst in refined
    assert f"{len(unconfirmed)} more off on the first pass, not refined" in report.to_text()
    data = report.to_dict()["parameters"][0]
    assert sorted(data["fd_unconfirmed"]) == sorted(unconfirmed)
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [("bug", "rule_error")]


@pytest.mark.parametrize("planted", [False, True], ids=["right", "one-percent-off"])
def test_a_vanishing_gradient_is_held_to_its_own_size(one_percent_op, planted):
    """Gradients of ~1e-7 (the loss scaled by 1e-6): a 1% error is 1e-9, far under atol 1e-7, and fails
    all the same (against SymPy and against finite differences); the right gradient passes against
    both. The row says the absolute term it was held to, and so does the finding."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("vanishing")
    w = b.input("W", rng.uniform(-1, 1, (4, 3)), requires_grad=True)
    if planted:
        w = b.node("test_grad_one_percent", w, name="bug")
    h = b.node("tanh", b.node("matmul", b.input("x", rng.uniform(-1, 1, (2, 4))), w))
    b.output(b.node("mul", b.node("sum", h), b.input("tiny", np.array(1e-6)), name="L"))
    graph = load_graph(b.build())
    for symbolic in (True, False):
        report = verify(graph, VerifyOptions(symbolic=SymbolicOptions(enabled=symbolic), localize=False))
        (row,) = report.parameters
        assert 1e-8 < float(np.abs(row.gradient).max()) < 1e-6
        assert row.verdict_reference == ("symbolic" if symbolic else "finite_differences")
        absolute = row.to_dict()["tolerance"]["absolute"]
        assert 0 < absolute < 1e-3 * float(np.abs(row.gradient).max()) * 1.01 and absolute < row.tolerance.atol
        assert report.verdict == ("fail" if planted else "pass"), report.to_text()
        if planted:
            (f,) = [f for f in report.findings if f.severity == "error"]
            assert f.cause == "gradient_mismatch" and f.parameters == ["W"]
            assert f"absolute term {absolute:.3g}" in f.detail


def test_joint_levels_are_scipys_normal_quantiles():
    """The direction levels (written out: no SciPy nor statistics import at start-up) must be the very int8
    levels scipy.special.ndtri and the standard library's inverse normal CDF give, so no direction changes."""
    from scipy.special import ndtri

    from gradcheck_svc.oracles.fd_joint import LEVEL_SCALE, LEVELS

    from statistics import NormalDist

    for q in (ndtri((np.arange(256) + 0.5) / 256) * LEVEL_SCALE,  # written out in fd_joint.py: derived again
              np.array([NormalDist().inv_cdf((b + 0.5) / 256) for b in range(256)]) * LEVEL_SCALE):
        expected = (np.sign(q) * np.maximum(1.0, np.rint(np.abs(q)))).astype(np.int8)
        assert np.abs(np.abs(q) - np.floor(np.abs(q)) - 0.5).min() > 1e-6  # no level near a rounding boundary
        assert LEVELS.tobytes() == expected.tobytes()


@pytest.mark.parametrize("n", [1, 7, 8, 13, 4097])
def test_joint_direction_bytes_are_the_generators_bytes(n):
    """fd_joint.random_bytes reads the bit generator's raw words: the very bytes Generator.bytes gives for the
    same seed, so the directions of every graph are what they were."""
    from gradcheck_svc.oracles.fd_joint import random_bytes

    assert random_bytes(np.random.default_rng(11), n).tobytes() == np.random.default_rng(11).bytes(n)


@pytest.mark.parametrize("graph", ["mlp", "cnn"])
def test_joint_copies_carried_as_imaginary_parts_equal_whole_complex_copies(graph):
    """At the base point a joint copy travels as its imaginary part (executor.Pair); the same directional
    derivatives as whole complex copies (the path a probe's moved base point takes), bit for bit."""
    import plants

    g = plants.mlp(width=6, depth=2) if graph == "mlp" else plants.cnn(2, 3, 2, 8)
    fd = FiniteDifferences(g)
    params = list(fd.program.params)
    dirs, rows = fd.joint_directions(params, 4), np.arange(4)
    as_pairs = fd._joint_derivatives(dirs, params, rows, {p: fd.flat(p) for p in params})
    whole = fd._joint_derivatives(dirs, params, rows, {p: fd.flat(p).copy() for p in params})
    assert np.array_equal(as_pairs, whole) and np.all(as_pairs != 0)


def test_joint_directions_drawn_in_pieces_are_the_levels_of_the_seeds_bytes():
    """JointDirections.random draws its bytes piece by piece (fd_joint.LOOKUP_BYTES): the levels of
    rng.bytes(k x total) for the seed, row after row, over more than one piece."""
    from gradcheck_svc.oracles.fd_joint import LOOKUP_BYTES, JointDirections

    values = {"a": np.ones((300, 233)), "b": np.ones(7)}
    total = 300 * 233 + 7
    assert 4 * total > LOOKUP_BYTES
    dirs = JointDirections.random(values, 4, 1234)
    want = LEVELS[np.frombuffer(np.random.default_rng(1234).bytes(4 * total), np.uint8)].reshape(4, total)
    assert np.array_equal(dirs.signs["a"], want[:, :300 * 233]) and np.array_equal(dirs.signs["b"], want[:, -7:])


def test_directions_drawn_again_when_asked_for_are_the_ones_held(monkeypatch):
    """Over fd_joint.LAZY_BYTES the directions are not held but drawn again from the seed's stream (LazyLevels):
    every block, every row and the screen's values along them are those of the held directions."""
    import plants
    from gradcheck_svc.oracles import fd_joint

    fd = FiniteDifferences(plants.mlp(width=40, depth=2))
    params = list(fd.program.params)
    held = fd.joint_directions(params, 5)
    monkeypatch.setattr(fd_joint, "LAZY_BYTES", 0)
    lazy = fd.joint_directions(params, 5)
    assert isinstance(lazy.signs, fd_joint.LazyLevels) and not isinstance(held.signs, fd_joint.LazyLevels)
    assert lazy.k == held.k == 5 and lazy.weight == held.weight and lazy.step == held.step
    for p in params:
        assert np.array_equal(lazy.signs[p], held.signs[p]) and np.array_equal(lazy.row(p, 3), held.signs[p][3])
    assert np.array_equal(fd.joint(lazy, params).reference, fd.joint(held, params).reference)
    h = 2.0 ** -60
    for p in params:
        a, b = np.empty((2, lazy.signs.spans[p][1])), np.empty((2, lazy.signs.spans[p][1]))
        assert np.array_equal(lazy.perturbed_imag(p, h, np.array([4, 1]), a),
                              held.perturbed_imag(p, h, np.array([4, 1]), b))
