"""TopK's indices in ONNX models: at ties they are ONNX's (the lower index first, as ONNX's reference
evaluator gives them), and a shape op the importer cannot carry through them is refused in one line
naming it, not left to fail later."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402
from onnx_helpers import engine_values  # noqa: E402

from gradcheck_svc.errors import GraphError  # noqa: E402
from gradcheck_svc.onnx_import.importer import ImportOptions, import_model  # noqa: E402


def _model(extra_nodes, largest=1):
    k = helper.make_tensor("k", TensorProto.INT64, [1], [3])
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)] + extra_nodes
    graph = helper.make_graph(nodes, "topk", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], initializer=[k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("largest", [1, 0])
def test_indices_at_ties_are_onnx_s(largest):
    from onnx.reference import ReferenceEvaluator

    x = np.array([[1.0, 3.0, 3.0, 0.5, 3.0, 2.0], [2.0, 2.0, 1.0, 1.0, 2.0, 1.0]])
    # y = x gathered at TopK's indices (a MoE's gather), times the values: both outputs used
    model = _model([helper.make_node("GatherElements", ["x", "i"], ["g"], axis=1),
                    helper.make_node("Mul", ["g", "v"], ["y"])], largest)
    msg = import_model(model, ImportOptions(inputs={"x": x}, params="x"))
    got = engine_values(msg)
    want_v, want_i = ReferenceEvaluator(model).run(["v", "i"], {"x": x})
    np.testing.assert_array_equal(got["i"], want_i)
    np.testing.assert_array_equal(got["v"], want_v)


def test_a_reshape_of_the_indices_is_refused_naming_it():
    model = _model([helper.make_node("Reshape", ["i", "s"], ["r"]),
                    helper.make_node("Gather", ["x", "r"], ["g"], axis=1),
                    helper.make_node("ReduceSum", ["g"], ["y"])])
    model.graph.initializer.append(helper.make_tensor("s", TensorProto.INT64, [1], [6]))
    with pytest.raises(GraphError, match="reshape of a computed int64 value") as err:
        import_model(model, ImportOptions(params="x"))
    assert "\n" not in str(err.value)
