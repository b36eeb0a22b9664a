"""User-defined ops (`expr`): forward and VJP against torch, the user's
derivative used by the engine and checked against SymPy's, the swish
examples, and hostile formulas -- each rejected at load with one line naming
the node and the offending token, nothing evaluated, under a timeout."""
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import sympy as sp
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it

from gradcheck_svc.alarm import alarm
from gradcheck_svc.backend import cuda_available, get_backend
from gradcheck_svc.cli import main
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.errors import GraphError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops.formula_compile import cuda_source
from gradcheck_svc.verify import verify

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "graphs"


def time_limit(seconds):
    """Fail instead of hanging (SIGALRM interrupts even a long SymPy call). Holding the process's
    interval timer also sends the expr simplify check down its child-process path."""
    return alarm(seconds, TimeoutError)


def expr_graph(x, formula, grad=None, name="act", inputs=None, args=None, extra=()):
    b = GraphBuilder("expr")
    names = inputs or ["x"]
    b.input(names[0], x, requires_grad=True)
    for n, v in extra:
        b.input(n, v, requires_grad=True)
    attrs = {"formula": formula}
    if grad is not None:
        attrs["grad"] = grad
    if args is not None:
        attrs["args"] = args
    y = b.node("expr", *names, name=name, **attrs)
    b.output(b.node("sum", y, name="L"))
    return b.build()


def engine_grad(graph, dtype=np.float64):
    program = Program(graph, dtype)
    backend = get_backend("cpu")
    tape = forward(program, backend, prepare_feeds(program, backend))
    return float(tape.loss), backward(tape)


def test_swish_forward_and_sympy_vjp_match_torch(rng):
    x = rng.uniform(-4, 4, size=(3, 4))
    loss, grads = engine_grad(load_graph(expr_graph(x, "x*sigmoid(x)")))
    t = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.silu(t).sum()
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-14)
    np.testing.assert_allclose(grads["x"], t.grad.numpy(), rtol=1e-13, atol=1e-15)


def test_two_inputs_with_broadcasting_and_args_match_torch(rng):
    a, b_ = rng.uniform(-2, 2, size=(2, 1)), rng.uniform(0.5, 2, size=(3,))
    graph = load_graph(expr_graph(a, "p*exp(-q**2) + log(1 + p**2)/q", inputs=["layer/a", "b:0"],
                                  args=["p", "q"], extra=[("b:0", b_)]))
    loss, grads = engine_grad(graph)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b_, requires_grad=True)
    ref = (ta * torch.exp(-tb**2) + torch.log(1 + ta**2) / tb).sum()
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-13)
    np.testing.assert_allclose(grads["layer/a"], ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grads["b:0"], tb.grad.numpy(), rtol=1e-12)


def test_engine_uses_the_users_derivative_when_given(rng):
    x = np.array([1.0, -2.0, 3.0])
    _, with_user = engine_grad(load_graph(expr_graph(x, "x**2", grad={"x": "3*x"})))
    _, with_sympy = engine_grad(load_graph(expr_graph(x, "x**2")))
    np.testing.assert_array_equal(with_user["x"], 3 * x)
    np.testing.assert_array_equal(with_sympy["x"], 2 * x)


def test_float32_engine(rng):
    x = rng.uniform(-3, 3, size=(5,)).astype(np.float32)
    loss, grads = engine_grad(load_graph(expr_graph(x, "tanh(x)*x + relu(x)")), np.float32)
    assert grads["x"].dtype == np.float32 and np.asarray(loss).dtype != object


def test_swish_examples():
    good = verify(load_graph(EXAMPLES / "swish_custom.json")).to_dict()
    assert good["verdict"] == "pass"
    (c,) = good["custom_ops"]
    assert c["node"] == "act" and c["user_grad_matches"] is True and c["per_input"]["z"]["symbolic"] == "equal"
    bad = verify(load_graph(EXAMPLES / "swish_custom_wrong.json")).to_dict()
    assert bad["verdict"] == "fail"
    (c,) = bad["custom_ops"]
    assert c["node"] == "act" and c["user_grad_matches"] is False and "d/dz" in c["detail"]
    # the engine used the wrong derivative, the oracles did not: FD and SymPy agree, the engine is off
    for p in bad["parameters"]:
        assert not p["passed"] and p["fd_vs_symbolic"]["agree"]


def test_swish_wrong_cli_names_the_node(capsys):
    assert main(["verify", str(EXAMPLES / "swish_custom_wrong.json")]) == 1
    out = capsys.readouterr().out
    assert "FAIL custom op node 'act'" in out


def test_user_derivative_wrong_only_off_the_graphs_points():
    # right for x > 0 (where the graph's values are), wrong for x < 0: found at random points
    x = np.array([0.5, 1.0, 2.0])
    d = verify(load_graph(expr_graph(x, "abs(x)**3", grad={"x": "3*x**2"}))).to_dict()
    (c,) = d["custom_ops"]
    assert c["user_grad_matches"] is False and "random point" in c["detail"]
    assert d["verdict"] == "fail"
    assert all(p["passed"] for p in d["parameters"])  # the gradient itself is right here


def test_expr_program_pickles():
    # normalized attrs travel to worker processes: the compiled program pickles as its trees
    program = load_graph(EXAMPLES / "swish_custom.json").node("act").attrs["program"]
    x = np.array([-1.0, 0.5])
    program.evaluate(np, program.tree, [x])  # fills the compile cache
    clone = pickle.loads(pickle.dumps(program))
    assert clone == program
    np.testing.assert_array_equal(clone.evaluate(np, clone.engine_grad(0), [x]),
                                  program.evaluate(np, program.engine_grad(0), [x]))


def test_cuda_source_is_built_from_the_tree():
    graph = load_graph(expr_graph(np.zeros(2), "x*sigmoid(x)", inputs=["secret_name"], args=["x"]))
    program = graph.node("act").attrs["program"]
    src = cuda_source(program.tree, program.symbols)
    assert "in0" in src and "exp(" in src and "x" not in src.replace("exp", "")


def test_cuda_source_writes_non_finite_constants_as_c_can_read_them():
    x = sp.Symbol("x")
    for value, text in ((sp.oo, "((T)(1.0 / 0.0))"), (-sp.oo, "((T)(-1.0 / 0.0))"), (sp.nan, "((T)(0.0 / 0.0))")):
        src = cuda_source(sp.Piecewise((value, x > 0), (x, True)), [x])
        assert text in src and "inf)" not in src and "nan)" not in src, src
    assert "((T)0.5)" in cuda_source(x + sp.Rational(1, 2), [x])


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_expr_on_cupy_matches_numpy(rng):
    x = rng.uniform(-3, 3, size=(4, 5))
    graph = load_graph(expr_graph(x, "x*sigmoid(x)", grad={"x": "sigmoid(x)*(1 + x*(1 - sigmoid(x)))"}))
    cpu = engine_grad(graph)[1]["x"]
    program = Program(graph, np.float64)
    backend = get_backend("cuda")
    g = backward(forward(program, backend, prepare_feeds(program, backend)))["x"]
    np.testing.assert_allclose(backend.to_host(g), cpu, rtol=1e-12)


# --- hostile and malformed formulas --------------------------------------------------

BAD = [
    ("__import__('os').system('touch {marker}')", "'__import__'"),
    ("x.__class__", "'.'"),
    ("lambda: 1", "'lambda'"),
    ("[x for x in ()]", "'['"),
    ("9**9**9**9", "'**'"),
    ("(" * 10_000 + "x" + ")" * 10_000, "nested deeper"),
    ("-" * 10_000 + "x", "nested deeper"),
    ("exp(" * 10_000 + "x" + ")" * 10_000, "nested deeper"),
    ("x + y", "'y'"),
    ("frobnicate(x)", "'frobnicate'"),
    ("open('/etc/passwd')", "'open'"),
    ("x; x", "';'"),
    ("(10**64)**64", "too large"),
    ("2" + "*2" * 5000, "too large"),
    ("x/0", "divides by zero"),
    ("", "empty"),
    ("x +", "end of formula"),
]


@pytest.mark.parametrize("formula,token", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_formula_rejected_at_load(formula, token, tmp_path):
    marker = tmp_path / "pwned"
    formula = formula.format(marker=marker) if "{marker}" in formula else formula
    with time_limit(10):
        with pytest.raises(GraphError) as exc:
            load_graph(expr_graph(np.ones(2), formula, name="custom1"))
    msg = exc.value.message
    assert msg.startswith("node 'custom1': attribute 'formula'") and token in msg and "\n" not in msg
    assert not marker.exists()


@pytest.mark.parametrize("attrs,needle", [
    ({"formula": "x", "grad": {"y": "1"}}, "'y', which is not an input"),
    ({"formula": "x", "grad": "2*x"}, "must be an object"),
    ({"formula": "x", "grad": {"x": "x.real"}}, "attribute 'grad.x'"),
    ({"formula": "x", "args": ["a", "b"]}, "names 2 inputs"),
    ({"formula": "x", "args": ["not an id"]}, "not an identifier"),
    ({"formula": 3}, "must be a string"),
])
def test_bad_attrs(attrs, needle):
    b = GraphBuilder("g")
    b.input("x", np.ones(2), requires_grad=True)
    b.output(b.node("sum", b.node("expr", "x", name="e", **attrs)))
    with time_limit(10):
        with pytest.raises(GraphError) as exc:
            load_graph(b.build())
    assert exc.value.message.startswith("node 'e'") and needle in exc.value.message


def test_non_identifier_input_names_need_args():
    with pytest.raises(GraphError, match="set attribute 'args'"):
        load_graph(expr_graph(np.ones(2), "x", inputs=["layer/out"]))


def test_cli_rejects_hostile_formula_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "g.json"
    msg = expr_graph(np.ones(2), f"__import__('os').system('touch {marker}')", name="evil")
    from google.protobuf import json_format
    path.write_text(json_format.MessageToJson(msg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]))
    done = subprocess.run([sys.executable, "-m", "gradcheck_svc.cli", "verify", str(path)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "node 'evil'" in done.stderr and "'__import__'" in done.stderr
    assert "Traceback" not in done.stderr and not marker.exists()
    json.dumps(done.stdout)  # nothing else printed
    assert done.stdout == ""


def test_simplification_time_limit_gives_inconclusive():
    from gradcheck_svc.oracles.symbolic import SymbolicOptions
    from gradcheck_svc.verify import VerifyOptions

    options = VerifyOptions(symbolic=SymbolicOptions(simplify_timeout_s=0.001))  # the child cannot even start
    with time_limit(30):
        d = verify(load_graph(EXAMPLES / "swish_custom.json"), options).to_dict()
    (c,) = d["custom_ops"]
    assert c["user_grad_matches"] is None and c["per_input"]["z"]["symbolic"] == "timed out"
    assert c["per_input"]["z"]["counterexample"] is None
    assert d["verdict"] == "pass"
