"""Every limit holds in process as it does in the server (issue 35, items 4 and 5).

The time limit: work that one long C call keeps busy (an 8-operand einsum, a folded int64 MatMul, the
planner on a 100,000-node chain) ends at `--max-request-seconds` / `--timeout` with the limit's own
one-line error and exit code, not when the call returns (minutes to hours here). Each case's
unbounded work is far beyond the generous slack the bound allows on a loaded machine, so a limit
that waits for the call cannot pass.

Memory: a tiny model that declares a huge input, or a conv whose im2col matrix is huge, is refused
by name before the memory is taken; the peak RSS of the command and its children stays near an
idle interpreter's (unbounded, each would take hundreds of MB to GBs).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the optional 'onnx' extra is not installed (pip install '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import forked_cli  # noqa: E402
from slow_graphs import SLACK, unfinishable_graph  # noqa: E402

LIMIT = 1.0  # seconds: each case's work runs minutes past it; the bound is what is tested, not its size
OVER_THE_LIMIT = (f"gradcheck-svc: error: verification exceeded the per-request limit of {LIMIT:g} s "
                  "(raise it with --max-request-seconds)")
RSS_BOUND_MB = 200  # an idle `gradcheck-svc verify` of seed.json peaks near 80 MB


def _run(tmp_path, *argv: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    return proc, time.monotonic() - start


def _forked(tmp_path, module: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m module ARGS` forked from this process (tests/forked_cli.py): its own process, exit status
    and pipes, without a fresh interpreter's start-up."""
    start = time.monotonic()
    proc = forked_cli.run(module, *args, cwd=tmp_path, timeout=600)
    return proc, time.monotonic() - start


def _svc(tmp_path, *args: str):
    return _forked(tmp_path, "gradcheck_svc.cli", *args)


def _assert_one_line(stderr: str, expected: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [expected], stderr


def _model(tmp_path, name: str, nodes, inputs, initializers=()) -> str:
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [])
    graph = helper.make_graph(nodes, name, inputs, [y], initializer=list(initializers))
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.fixture(scope="module")
def einsum_graph(tmp_path_factory) -> str:
    """slow_graphs.unfinishable_graph, as a file."""
    path = tmp_path_factory.mktemp("einsum") / "einsum8.json"
    path.write_text(json.dumps(unfinishable_graph()))
    return str(path)


def test_einsum_ends_at_the_limit(tmp_path, einsum_graph):
    proc, seconds = _svc(tmp_path, "verify", einsum_graph, "--max-request-seconds", str(LIMIT))
    assert proc.returncode == 2, proc.stderr  # docs/service.md: over a limit in-process, exit 2
    _assert_one_line(proc.stderr, OVER_THE_LIMIT)
    assert LIMIT <= seconds < LIMIT + SLACK


def test_einsum_ends_at_the_timeout_of_the_ci_command(tmp_path, einsum_graph):
    proc, seconds = _forked(tmp_path, "gradcheck_client.cli", "verify", einsum_graph, "--timeout", str(LIMIT))
    assert proc.returncode == 3, proc.stderr  # docs/ci.md: a deadline is exit 3, with or without a server
    assert "Traceback" not in proc.stderr
    assert f"ERROR: DEADLINE_EXCEEDED: verification exceeded the per-request limit of {LIMIT:g} s (raise it with " \
           "--timeout)" in proc.stdout
    assert LIMIT <= seconds < LIMIT + SLACK


def test_folded_int64_matmul_ends_at_the_limit(tmp_path):
    """Import-time folding of a 5000 x 5000 int64 MatMul (1.25e11 multiply-adds in NumPy's loop
    without BLAS: minutes), in a 300-byte model; within max_elements when it is raised to 6e7."""
    n = 5000
    model = _model(tmp_path, "intmm", [
        helper.make_node("Expand", ["three", "shape"], ["a"]),
        helper.make_node("MatMul", ["a", "a"], ["m"]),
        helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.DOUBLE),
        helper.make_node("ReduceSum", ["mf"], ["s"], keepdims=1),
        helper.make_node("Mul", ["s", "x"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["y"], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1])],
        [numpy_helper.from_array(np.array([3], np.int64), "three"),
         numpy_helper.from_array(np.array([n, n], np.int64), "shape")])
    proc, seconds = _svc(tmp_path, "verify", model, "--params", "inputs", "--max-elements", "60000000",
                         "--max-request-seconds", str(LIMIT))
    assert proc.returncode == 2, proc.stderr
    # Two limits may end it, both refusals in one line: the request's (the MatMul runs past the limit), or, where a
    # loaded machine takes over half of it to fold the 25M-element Expand first, folding's own budget of
    # half the request's limit, checked before the MatMul starts (onnx_import/folding.py)
    if "constant folding" in proc.stderr:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("gradcheck-svc: error: "), proc.stderr
        assert f"constant folding at import time took more than {LIMIT / 2:g} s (half of max_request_seconds)" \
            in lines[0]
        assert LIMIT / 2 <= seconds < LIMIT + SLACK
    else:
        _assert_one_line(proc.stderr, OVER_THE_LIMIT)
        assert LIMIT <= seconds < LIMIT + SLACK


def test_plan_memory_ends_at_the_limit(tmp_path):
    """plan-memory enters the limit too: a 100,000-node chain with a budget (its planner alone runs
    for minutes)."""
    n = 100_000
    nodes = [{"name": "h0", "op": "tanh", "inputs": ["x"]}]
    nodes += [{"name": f"h{i}", "op": "tanh", "inputs": [f"h{i - 1}"]} for i in range(1, n - 1)]
    nodes.append({"name": "L", "op": "sum", "inputs": [f"h{n - 2}"]})
    graph = {"name": "chain", "nodes": nodes, "output": "L",
             "inputs": [{"name": "x", "value": {"shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}, "requiresGrad": True}]}
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(graph))
    proc, seconds = _svc(tmp_path, "plan-memory", str(path), "--budget", "100000", "--max-request-seconds", str(LIMIT))
    assert proc.returncode == 2, proc.stderr
    _assert_one_line(proc.stderr, OVER_THE_LIMIT)
    assert LIMIT <= seconds < LIMIT + SLACK


def test_within_the_limit_the_child_changes_nothing(tmp_path):
    """The same graph, verified in the child, reports as before, and its shape-only plan is printed."""
    from pathlib import Path

    seed = str(Path(__file__).resolve().parents[2] / "examples" / "graphs" / "seed.json")
    proc, _ = _svc(tmp_path, "verify", seed, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "pass" and report["symbolic"]["status"] == "ok"
    assert [p["name"] for p in report["parameters"]] == ["w", "x"]
    proc, _ = _svc(tmp_path, "plan-memory", seed, "--format", "json", "--shapes-only")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["graph"] == "seed"


# -- memory: refused before it is taken ------------------------------------------------------

_PEAK = """\
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(proc.stderr)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak(tmp_path, *args: str) -> tuple[int, float, str]:
    """(exit code, peak RSS in MB of the command and its children, stderr): measured in a fresh
    process, whose only children are the command's."""
    proc, _ = _run(tmp_path, "-c", _PEAK, sys.executable, "-m", "gradcheck_svc.cli", *args)
    code, kb = proc.stdout.split()
    return int(code), int(kb) / 1024, proc.stderr


def test_huge_declared_input_is_refused_before_it_is_made(tmp_path):
    """A ~90-byte model declaring a float64 input of 6000 x 6000 (288 MB once generated)."""
    model = _model(tmp_path, "bigin", [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)],
                   [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [6000, 6000])])
    code, mb, stderr = _peak(tmp_path, "verify", model, "--params", "inputs")
    assert code == 2
    _assert_one_line(stderr, "gradcheck-svc: error: inputs: input 'x' of shape [6000, 6000] brings the model's "
                             "inputs to 36000000 elements, over the limit of 10000000 (max_elements) (raise it "
                             "with --max-elements)")
    assert mb < RSS_BOUND_MB


def test_conv_im2col_is_counted_before_it_is_made(tmp_path):
    """X (1, 1, 150, 150) and a 60 x 60 kernel: 34,381 elements of values, but an im2col matrix of
    91^2 windows x 3600 = 29.8 M elements (238 MB) -- refused by name."""
    model = _model(tmp_path, "conv", [helper.make_node("Conv", ["x", "w"], ["c"]),
                                      helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
                   [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 1, 150, 150]),
                    helper.make_tensor_value_info("w", TensorProto.DOUBLE, [1, 1, 60, 60])])
    code, mb, stderr = _peak(tmp_path, "verify", model, "--params", "inputs")
    assert code == 2
    _assert_one_line(stderr, "gradcheck-svc: error: node 'c': op 'conv' needs a temporary of 29811600 elements, "
                             "over the limit of 10000000 with the graph's 34381 (raise it with --max-elements)")
    assert mb < RSS_BOUND_MB


@pytest.mark.parametrize("op, w_shape", [("conv", [5, 4, 3, 3]), ("conv_transpose", [4, 5, 3, 3])])
def test_conv_temporary_is_the_one_it_makes(op, w_shape):
    """What validation counts is the im2col matrix the op builds (conv: of its input, in forward and
    weight gradient; conv_transpose: of its output, in backward, and its adjoint in forward); a graph
    at exactly the limit validates and one element less is refused, naming the node."""
    from gradcheck_svc.errors import LimitError
    from gradcheck_svc.graph.decode import load_graph
    from gradcheck_svc.graph.validate import Limits
    from gradcheck_svc.ops.conv import _im2col

    rng = np.random.default_rng(1)

    def tensor(shape):
        return {"shape": shape, "data": rng.uniform(-1, 1, int(np.prod(shape))).tolist()}
    graph = json.dumps({
        "name": "g", "output": "L",
        "inputs": [{"name": "x", "value": tensor([2, 4, 12, 12]), "requiresGrad": True},
                   {"name": "w", "value": tensor(w_shape), "requiresGrad": True}],
        "nodes": [{"name": "c", "op": op, "inputs": ["x", "w"]}, {"name": "L", "op": "sum", "inputs": ["c"]}]})
    loaded = load_graph(graph, fmt="json")
    node, x = loaded.nodes[0], loaded.inputs["x"].value
    y = node.op.forward(np, x, loaded.inputs["w"].value, **node.attrs)
    cols = _im2col(np, x if op == "conv" else y, node.attrs["geo"], node.attrs["group"])
    scratch = node.op.scratch([x.shape, tuple(w_shape)], y.shape, **node.attrs)
    assert scratch == cols.size > y.size
    values = x.size + int(np.prod(w_shape)) + y.size  # the inputs and c, when c is counted
    load_graph(graph, fmt="json", limits=Limits(max_elements=values + scratch))
    with pytest.raises(LimitError, match=f"op '{op}' needs a temporary of {scratch} elements") as exc:
        load_graph(graph, fmt="json", limits=Limits(max_elements=values + scratch - 1))
    assert exc.value.node == "c"


def test_a_request_within_the_limits_stays_within_its_documented_memory(tmp_path):
    """docs/service.md: a request within max_elements (finite differences in full, no projection)
    peaks at the interpreter's own footprint plus at most 2 x 8 bytes x max_elements. Here 2.7 M
    elements of values (a 300 x 1000 input through 9 ops) under --max-elements 3.5 M; the interpreter's
    footprint is that of seed.json's verification, measured the same way."""
    from pathlib import Path

    seed = str(Path(__file__).resolve().parents[2] / "examples" / "graphs" / "seed.json")
    nodes, prev = [helper.make_node("Mul", ["x", "w"], ["t"])], "t"
    for i in range(8):
        nodes.append(helper.make_node("Tanh", [prev], [f"t{i}"]))
        prev = f"t{i}"
    nodes.append(helper.make_node("ReduceSum", [prev], ["y"], keepdims=0))
    model = _model(tmp_path, "chain", nodes, [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [300, 1000]),
                                              helper.make_tensor_value_info("w", TensorProto.DOUBLE, [1000])])
    code, base_mb, stderr = _peak(tmp_path, "verify", seed)
    assert code == 0, stderr
    budget = 3_500_000
    code, mb, stderr = _peak(tmp_path, "verify", model, "--params", "w", "--fd", "full", "--max-elements", str(budget))
    assert code == 0, stderr
    assert mb < base_mb + 2 * 8 * budget / 2**20


# -- the child's ends, one at a time ----------------------------------------------------------

def _memory_error_unwinding_past_the_limit():
    try:
        raise MemoryError
    finally:  # cleanup that is still running when the limit passes
        time.sleep(120)


def _escaping_base_exception():
    class _PrivateAlarm(BaseException):
        pass
    raise _PrivateAlarm("went off")


def _user_error():
    from gradcheck_svc.errors import LimitError

    raise LimitError("too many", node="n", limit="max_elements")


def _mark():
    import os

    return os.environ.get("GRADCHECK_BOUNDED_MARK")


@pytest.fixture
def child():
    """bounded_call's child in this process, ended after the test (none is left behind)."""
    from gradcheck_svc import bounded

    yield bounded.bounded_call
    assert not bounded._live  # each call reaped its own child


def test_the_limit_fires_while_a_memory_error_unwinds(child):
    """The limit's own error, not the MemoryError nor a traceback: the child is killed mid-unwind."""
    from gradcheck_svc.errors import TimeLimitError

    start = time.monotonic()
    with pytest.raises(TimeLimitError, match=r"^verification exceeded the per-request limit of 1 s \(raise it "
                                             r"with --max-request-seconds\)$"):
        child(1.0, "max_request_seconds", _memory_error_unwinding_past_the_limit)
    assert time.monotonic() - start < 1.0 + SLACK


def test_what_the_child_raises_comes_back_whole(child, monkeypatch):
    from gradcheck_svc.errors import LimitError

    with pytest.raises(LimitError) as exc:
        child(30, None, _user_error)
    assert (exc.value.message, exc.value.limit) == ("node 'n': too many", "max_elements")
    # a BaseException of the child's own is an internal fault, said in one line (never re-raised as
    # itself, which no `except Exception` of the command would catch)
    with pytest.raises(RuntimeError, match="^_PrivateAlarm: went off$"):
        child(30, None, _escaping_base_exception)
    import os

    assert child(30, None, os.getpid) != os.getpid()  # a child, not this process
    # forked for each call, so it sees this process as it is at the call: a change made after an earlier
    # call (an op registered, a module patched) is not lost on a child kept from before it
    assert child(30, None, _mark) is None
    monkeypatch.setenv("GRADCHECK_BOUNDED_MARK", "set after the first child")
    assert child(30, None, _mark) == "set after the first child"


def test_einsum_contracts_a_chain_pairwise():
    """The issue's 8-operand chain 'ab,bc,...,hi->ai' (5e11 products as one loop) is contracted in
    pairwise order: the chained matrix product, forward and each operand's gradient (torch's)."""
    torch = pytest.importorskip("torch")
    from gradcheck_svc.ops import REGISTRY

    rng = np.random.default_rng(2)
    xs = [rng.uniform(-1, 1, (20, 20)) for _ in range(8)]
    equation = ",".join("abcdefghi"[i:i + 2] for i in range(8)) + "->ai"
    op = REGISTRY["einsum"]
    y = op.forward(np, *xs, equation=equation)
    np.testing.assert_allclose(y, np.linalg.multi_dot(xs), rtol=1e-12, atol=1e-12)
    g = rng.uniform(-1, 1, y.shape)
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    torch.linalg.multi_dot(ts).backward(torch.tensor(g))
    for got, t in zip(op.vjp(np, g, xs, equation=equation), ts):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ["max_pool", "avg_pool"])
def test_pool_temporary_is_the_one_it_makes(op):
    """Pooling copies every window (_flat_windows): that copy is what validation counts."""
    from gradcheck_svc.errors import LimitError
    from gradcheck_svc.graph.decode import load_graph
    from gradcheck_svc.graph.validate import Limits
    from gradcheck_svc.ops.pool import _flat_windows

    x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 10, 10))
    graph = json.dumps({
        "name": "g", "output": "L",
        "inputs": [{"name": "x", "value": {"shape": list(x.shape), "data": x.ravel().tolist()}, "requiresGrad": True}],
        "nodes": [{"name": "p", "op": op, "inputs": ["x"], "attrs": {"kernel_shape": [3, 3], "strides": [1, 1]}},
                  {"name": "L", "op": "sum", "inputs": ["p"]}]})
    node = load_graph(graph, fmt="json").nodes[0]
    scratch = node.op.scratch([x.shape], node.spec.shape, **node.attrs)
    assert scratch == _flat_windows(np, x, node.attrs["geo"], 0.0).size > node.spec.size
    values = x.size + node.spec.size
    load_graph(graph, fmt="json", limits=Limits(max_elements=values + scratch))
    with pytest.raises(LimitError, match=f"op '{op}' needs a temporary of {scratch} elements"):
        load_graph(graph, fmt="json", limits=Limits(max_elements=values + scratch - 1))


def _python_loop_forever():
    while True:
        pass


def test_without_fork_the_work_runs_here_under_the_signal_limit(monkeypatch):
    """Where there is no fork (Windows), bounded_call runs the work in this process under
    limits.request_time_limit, which stops Python code at the limit with the same error."""
    from gradcheck_svc import bounded
    from gradcheck_svc.errors import TimeLimitError

    monkeypatch.delattr(bounded.os, "fork")
    start = time.monotonic()
    with pytest.raises(TimeLimitError, match=r"^verification exceeded the per-request limit of 0.5 s \(raise it "
                                             r"with --timeout\)$"):
        bounded.bounded_call(0.5, "timeout", _python_loop_forever)
    assert time.monotonic() - start < 0.5 + SLACK
    assert not bounded._live  # nothing was forked
    assert bounded.bounded_call(5, "timeout", sorted, [2, 1]) == [1, 2]
