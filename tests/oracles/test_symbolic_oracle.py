"""The symbolic oracle: exact gradients, independence from the engine's VJPs,
torch agreement, the three-way report, and its budget."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_svc.cli import main
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.oracles.finite_diff import FDOptions
from gradcheck_svc.oracles.symbolic import SymbolicOptions, symbolic_gradients
from gradcheck_svc.verify import VerifyOptions, verify

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"


def mlp_graph(rng, n=4, d=5, h=6, c=3):
    b = GraphBuilder("mlp")
    x = b.input("x", rng.standard_normal((n, d)))
    w1 = b.input("w1", rng.standard_normal((d, h)) * 0.5, requires_grad=True)
    b1 = b.input("b1", rng.standard_normal(h) * 0.1, requires_grad=True)
    w2 = b.input("w2", rng.standard_normal((h, c)) * 0.5, requires_grad=True)
    y = b.input("y", rng.integers(0, c, size=n))
    z = b.node("tanh", b.node("add", b.node("matmul", x, w1), b1))
    logits = b.node("matmul", z, w2)
    ce = b.node("cross_entropy", logits, y)
    reg = b.node("mul", b.node("sum", b.node("square", w2)), b.input("lam", 0.01))
    b.output(b.node("add", ce, reg, name="loss"))
    return load_graph(b.build())


def test_seed_symbolic_gradients_are_exactly_6_and_9():
    r = symbolic_gradients(load_graph(EXAMPLES / "seed.json"))
    assert r.status == "ok"
    assert r.gradients["w"] == 6.0 and r.gradients["x"] == 9.0
    assert r.loss == 9.0
    report = verify(load_graph(EXAMPLES / "seed.json")).to_dict()
    assert [p["symbolic"]["gradient"] for p in report["parameters"]] == [[6.0], [9.0]]
    assert all(p["verdict_reference"] == "symbolic" for p in report["parameters"])


def test_mlp_matches_torch_autograd(rng):
    graph = mlp_graph(rng)
    r = symbolic_gradients(graph)
    assert r.status == "ok", r.reason
    t = {k: torch.tensor(v.value, requires_grad=v.requires_grad) for k, v in graph.inputs.items()}
    z = torch.tanh(t["x"] @ t["w1"] + t["b1"])
    loss = torch.nn.functional.cross_entropy(z @ t["w2"], t["y"]) + (t["w2"] ** 2).sum() * t["lam"]
    loss.backward()
    assert r.loss == pytest.approx(loss.item(), rel=1e-14)
    for p in graph.parameters:
        np.testing.assert_allclose(r.gradients[p], t[p].grad.numpy(), rtol=1e-12, atol=1e-14)


def test_symbolic_oracle_never_calls_a_vjp(monkeypatch, rng):
    def forbidden(*a, **k):
        raise AssertionError("the symbolic oracle called a vjp")

    expected = symbolic_gradients(mlp_graph(np.random.default_rng(7))).gradients
    for name, op in list(REGISTRY.items()):
        monkeypatch.setitem(REGISTRY, name, dataclasses.replace(op, vjp=forbidden))
    r = symbolic_gradients(mlp_graph(np.random.default_rng(7)))  # graph loaded with the patched ops
    assert r.status == "ok", r.reason
    for p, g in expected.items():
        np.testing.assert_array_equal(r.gradients[p], g)


def test_report_three_way_fields(rng):
    d = verify(mlp_graph(rng)).to_dict()
    assert d["verdict"] == "pass" and d["symbolic"]["status"] == "ok"
    for p in d["parameters"]:
        assert p["symbolic"]["passed"] and p["symbolic"]["max_abs_error"] < 1e-12
        assert p["fd_vs_symbolic"]["agree"] and 0 < p["fd_vs_symbolic"]["max_abs_error"] < 1e-7
        assert len(p["symbolic"]["gradient"]) == np.prod(p["shape"])


def test_verdict_follows_symbolic_when_fd_is_wrong():
    # relu exactly at its kink, by ordinary differences (frozen branches off): FD's central difference is
    # 1/2, the one-sided ones 0 and 1 -- its bound reaches them, so FD cannot decide the value; the engine
    # and SymPy's Piecewise both give 0 (frozen branches, the default, take relu's piece: 0, decided)
    b = GraphBuilder("kink")
    x = b.input("x", np.array([0.0, 1.5, -2.0]), requires_grad=True)
    b.output(b.node("sum", b.node("relu", x)))
    assert verify(load_graph(b.build())).to_dict()["parameters"][0]["reference"][0] == 0.0
    d = verify(load_graph(b.build()), VerifyOptions(fd=FDOptions(frozen_branches=False))).to_dict()
    p = d["parameters"][0]
    assert p["symbolic"]["gradient"] == [0.0, 1.0, 0.0]
    assert p["reference"][0] == pytest.approx(0.5) and p["fd_error"][0] >= 0.5 and p["fd_undecidable"] == [0]
    assert p["verdict_reference"] == "symbolic" and p["passed"] and d["verdict"] == "pass"


def test_budget_elements_skips_and_report_still_produced(rng):
    graph = mlp_graph(rng)
    r = symbolic_gradients(graph, SymbolicOptions(max_elements=20))
    assert r.status == "skipped" and "budget is 20" in r.reason and r.elements > 20
    report = verify(graph, VerifyOptions(symbolic=SymbolicOptions(max_elements=20))).to_dict()
    assert report["symbolic"]["status"] == "skipped" and report["symbolic"]["elements"] == r.elements
    assert report["verdict"] == "pass"
    assert all(p["symbolic"] is None and p["verdict_reference"] == "finite_differences"
               for p in report["parameters"])
    assert any("symbolic oracle skipped" in w for w in report["warnings"])


def test_budget_partials_and_wall_clock(rng):
    graph = mlp_graph(rng)
    r = symbolic_gradients(graph, SymbolicOptions(max_edges=10))
    assert r.status == "skipped" and "non-zero local partial" in r.reason and r.edges > 10
    r = symbolic_gradients(graph, SymbolicOptions(timeout_s=0.0))
    assert r.status == "skipped" and "wall-clock" in r.reason


def test_large_graph_is_skipped_without_work():
    # 1,000,000 elements: the size check comes before any SymPy object is built
    b = GraphBuilder("big")
    x = b.input("x", np.zeros((1000, 1000)), requires_grad=True)
    b.output(b.node("sum", b.node("tanh", x)))
    r = symbolic_gradients(load_graph(b.build()))
    assert r.status == "skipped" and r.elements == 2_000_001
    # no work: not one local partial built (r.seconds is not even measured on this path)
    assert r.edges == 0 and r.reason == "graph has 2000001 scalar elements, budget is 5000 (raise it with " \
                                     "symbolic_budget / --symbolic-budget)"


def test_cli_symbolic_options(tmp_path, capsys):
    assert main(["verify", str(EXAMPLES / "seed.json"), "--format", "json", "--symbolic", "off"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["symbolic"]["status"] == "off" and d["parameters"][0]["symbolic"] is None
    assert main(["verify", str(EXAMPLES / "seed.json"), "--format", "json", "--symbolic-max-elements", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["symbolic"]["status"] == "skipped" and d["symbolic"]["elements"] == 6
    assert main(["verify", str(EXAMPLES / "seed.json"), "--symbolic-timeout", "-1"]) == 2
    assert "--symbolic-timeout" in capsys.readouterr().err
    assert main(["verify", str(EXAMPLES / "seed.json")]) == 0
    assert "symbolic oracle: ok" in capsys.readouterr().out


def _wide_softmax(n: int):
    b = GraphBuilder("wide")
    x = b.input("x", np.random.default_rng(0).standard_normal(n), requires_grad=True)
    b.output(b.node("sum", b.node("mul", b.node("softmax", x), b.input("r", np.linspace(0, 1, n)))))
    return load_graph(b.build())


def test_dense_softmax_row_stops_inside_its_form_at_the_deadline():
    # every output of a 2,000-wide softmax depends on every input: SymPy's form of that one node takes
    # seconds (~4 s here: each element divided by a 2,000-term sum) before the next tick between steps;
    # where the interval timer is free (here, the commands' child, a worker's main thread) the alarm stops it
    # inside the node, and the reason names it. The deadline counts from the oracle's start: where a loaded
    # machine spent it on the set-up (the inputs' 40-digit values) before the form began, the same graph
    # is asked again with twice the time -- a stop anywhere but the set-up or the form fails at once
    from gradcheck_svc.oracles import local_jacobian  # noqa: F401 -- SymPy's import not in the budget

    n = 2000
    graph = _wide_softmax(n)
    for timeout in (0.5, 1.0, 2.0, 4.0):
        r = symbolic_gradients(graph, SymbolicOptions(timeout_s=timeout, max_elements=4 * n + 1))
        assert r.status == "skipped" and r.edges == 0 and r.elements == 4 * n + 1
        if "in the oracle's set-up" not in r.reason:
            break
    assert r.reason.startswith("over budget: wall-clock limit reached in node 'softmax_1' (softmax): its "
                               f"symbolic form (timeout {timeout:g} s"), r.reason


def test_a_deadline_whose_alarm_lands_in_a_finalizer_is_named_where_it_fired(monkeypatch):
    # the alarm's raise inside a __del__ the garbage collector runs (an earlier test's gRPC channel) is printed
    # and dropped by Python, and the node's form runs on; the next tick stops the oracle, and the reason names
    # where the time ran out (the form), not where it was noticed (the partials) -- a full `make test` hit it
    import sys
    import time

    from gradcheck_svc.alarm import alarm
    from gradcheck_svc.oracles.local_jacobian import Budget, OverBudget
    from gradcheck_svc.oracles.symbolic import _OutOfTime

    class Finalized:
        def __del__(self):  # pure Python until the alarm has fired here (its raise is then dropped)
            waited = time.monotonic() + 60
            while not budget.expired_at and time.monotonic() < waited:
                pass

    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    budget = Budget(time.monotonic() + 0.01, max_edges=10)
    budget.node, budget.phase = "'softmax_1' (softmax)", "its symbolic form"
    with alarm(0.01, _OutOfTime, fired=budget.expire):
        Finalized()  # collected at once: its __del__ runs, the alarm fires inside it
        budget.phase = "its partials"
        with pytest.raises(OverBudget) as stopped:
            budget.tick()
    assert dropped == [_OutOfTime]  # the raise was the finalizer's, dropped
    assert str(stopped.value) == "wall-clock limit reached in node 'softmax_1' (softmax): its symbolic form"


def test_dense_softmax_row_stops_between_steps_without_the_timer():
    # the interval timer taken (another caller's): the ticks between steps stop it (600 wide: 360k
    # partials, over the 250k budget), not grinding through it; the caller's own timer is left running
    import signal

    def hang(*_):
        raise TimeoutError("symbolic oracle did not honour its budget")

    old = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, 60)
    try:
        r = symbolic_gradients(_wide_softmax(600), SymbolicOptions(timeout_s=0.5))
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert r.status == "skipped" and r.reason.startswith("over budget") and r.elements == 4 * 600 + 1
