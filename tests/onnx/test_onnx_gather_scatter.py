"""GatherND (constant indices, batch_dims too) and ScatterElements at computed indices (put_along_axis): the
values ONNX defines, PASS, and bad indices refused in one line naming the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from gradcheck_svc.errors import GraphError  # noqa: E402
from gradcheck_svc.graph import load_graph  # noqa: E402
from gradcheck_svc.graph.build import GraphBuilder  # noqa: E402
from gradcheck_svc.onnx_import import import_onnx  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.engine_run import run_engine  # noqa: E402
from onnx_helpers import engine_values  # noqa: E402


def _gather_nd_model(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> bytes:
    node = helper.make_node("GatherND", ["w", "idx"], ["y"], name="pool", batch_dims=batch_dims)
    out = indices.shape[:-1] + data.shape[batch_dims + indices.shape[-1]:]
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.DOUBLE, out)],
                              [numpy_helper.from_array(data, "w"), numpy_helper.from_array(indices, "idx")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def _reference_gather_nd(data, indices, b):
    """ONNX's definition, looped: out[batch..., i...] = data[batch..., *indices[batch..., i...]]."""
    out = np.empty(indices.shape[:-1] + data.shape[b + indices.shape[-1]:])
    for pos in np.ndindex(indices.shape[:-1]):
        out[pos] = data[tuple(pos[:b]) + tuple(indices[pos])]
    return out


@pytest.mark.parametrize(("shape", "indices", "b"), [
    ((3, 4, 2), np.array([[0, 3], [2, -1], [1, 0]]), 0),
    ((2, 4, 3), np.array([[1], [3]]), 1),  # CLIP's form: each row's own position
    ((2, 3), np.array([[1], [0], [1]]), 0),
])
def test_gather_nd_takes_what_onnx_defines_and_verifies(shape, indices, b):
    data = np.random.default_rng(0).standard_normal(shape)
    msg = import_onnx(_gather_nd_model(data, indices, b))
    np.testing.assert_array_equal(engine_values(msg)["y"], _reference_gather_nd(data, indices, b))
    assert verify(load_graph(msg), VerifyOptions()).verdict == "pass"


def test_gather_nd_out_of_range_is_refused_naming_the_node():
    with pytest.raises(GraphError, match=r"GatherND node 'pool': an index is out of range for data \[3, 4\]"):
        import_onnx(_gather_nd_model(np.ones((3, 4)), np.array([[0, 4]]), 0))


def _put_graph(indices: np.ndarray, reduction: str = "none"):
    rng = np.random.default_rng(1)
    b = GraphBuilder("put")
    data = b.input("data", rng.standard_normal((2, 4)), requires_grad=True)
    upd = b.input("upd", rng.standard_normal(indices.shape), requires_grad=True)
    idx = b.input("idx", indices, requires_grad=False, dtype="int64")
    y = b.node("put_along_axis", data, idx, upd, name="put", axis=1, reduction=reduction)
    b.output(b.node("sum", b.node("square", y, name="sq"), name="L"))
    return load_graph(b.build())


def test_put_along_axis_writes_at_the_indices_and_its_gradient_reaches_data_and_updates_only():
    graph = _put_graph(np.array([[3, 0], [1, 2]]))
    assert verify(graph, VerifyOptions()).verdict == "pass"
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    data, upd = graph.inputs["data"].value, graph.inputs["upd"].value
    y = data.copy()
    np.put_along_axis(y, np.array([[3, 0], [1, 2]]), upd, axis=1)
    want_data = 2 * y
    np.put_along_axis(want_data, np.array([[3, 0], [1, 2]]), 0.0, axis=1)  # overwritten: no gradient
    np.testing.assert_allclose(engine.gradients["data"], want_data, rtol=1e-12)
    np.testing.assert_allclose(engine.gradients["upd"], 2 * upd, rtol=1e-12)
    assert "idx" not in engine.gradients


def test_put_along_axis_refuses_two_updates_aimed_at_one_element_without_a_reduction():
    with pytest.raises(GraphError, match=r"put_along_axis.*two updates aimed at one element"):
        run_engine(_put_graph(np.array([[1, 1], [0, 2]])), VerifyOptions(dtype="float64"), "float64")
    # with reduction add they accumulate
    assert verify(_put_graph(np.array([[1, 1], [0, 2]]), "add"), VerifyOptions()).verdict == "pass"


def _loop_model(trip: int, cond_from_input: bool) -> bytes:
    """y = sum over iterations of w (a Loop whose body adds w to its carried value)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["acc_in", "w"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TensorProto.DOUBLE, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.DOUBLE, [3])])
    loop = helper.make_node("Loop", ["M", "c" if cond_from_input else "cond", "zero"], ["y"], name="bags", body=body)
    inits = [numpy_helper.from_array(np.array(trip, np.int64), "M"), numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.zeros(3), "zero"), numpy_helper.from_array(np.array([1.0, -2.0, 0.5]), "w")]
    inputs = [helper.make_tensor_value_info("c", TensorProto.DOUBLE, [])] if cond_from_input else []
    nodes = ([helper.make_node("Greater", ["c", "zc"], ["cb"])] if cond_from_input else []) + [loop]
    if cond_from_input:
        loop.input[1] = "cb"
        inits.append(numpy_helper.from_array(np.array(0.0), "zc"))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def test_a_loop_of_known_length_is_unrolled_and_its_gradient_sums_every_iteration():
    graph = load_graph(import_onnx(_loop_model(3, False)))
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    assert engine.loss == 3 * (1.0 - 2.0 + 0.5)  # sum(y), y = w + w + w: exact in binary
    np.testing.assert_array_equal(engine.gradients["w"], [3.0, 3.0, 3.0])
    assert verify(graph, VerifyOptions()).verdict == "pass"


def test_a_loop_whose_condition_is_computed_or_too_long_is_refused_naming_it():
    with pytest.raises(GraphError, match=r"Loop or If whose condition is computed .* \(first: node 'bags'\)"):
        import_onnx(_loop_model(3, True))
    with pytest.raises(GraphError, match=r"Loop of 5000 iterations \(unrolled: 1 to 1024\) x1 \(first: node 'bags'\)"):
        import_onnx(_loop_model(5000, False))
