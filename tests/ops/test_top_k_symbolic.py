"""top_k in the symbolic oracle: its forward (a sort) runs over SymPy arrays as a network of binary
Min/Max, differentiated without a vjp; the network is built as bare nodes (SymPy's own constructors
sort their arguments by a key over the whole tree, exponential in the network's depth), and a sort
too large to differentiate in about a second is skipped with its size, the verdict left to finite
differences, rather than hanging."""
from __future__ import annotations

import numpy as np

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.symbolic import SymbolicOptions, symbolic_gradients
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.run import run_engine


def _graph(rows, n, k):
    rng = np.random.default_rng(0)
    b = GraphBuilder("top_k")
    x = b.input("x", rng.permutation(rows * n).reshape(rows, n) * 0.1 - 1.0, requires_grad=True)
    r = b.input("r", rng.uniform(0.5, 1.5, (rows, k)))
    b.output(b.node("sum", b.node("mul", b.node("top_k", x, name="y", k=k), r, name="m"), name="L"))
    return load_graph(b.build())


def test_symbolic_top_k_of_rows_of_32_equals_the_selection():
    graph = _graph(2, 32, 4)
    sym = symbolic_gradients(graph, SymbolicOptions(timeout_s=60.0))
    assert sym.ran, sym.reason
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    np.testing.assert_array_equal(np.asarray(sym.gradients["x"], dtype=np.float64), engine.gradients["x"])
    assert np.count_nonzero(engine.gradients["x"]) == 2 * 4  # only the selected elements


def test_a_sort_too_large_is_skipped_by_size_and_fd_decides():
    graph = _graph(4, 64, 2)
    sym = symbolic_gradients(graph, SymbolicOptions(timeout_s=60.0))
    assert sym.status == "skipped" and "4 rows of 64 elements" in sym.reason
    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass" and any("symbolic oracle skipped" in w for w in report.warnings)
