"""Every malformed graph gives one GraphError naming the node or field, and
the CLI turns it into one line on stderr and exit code 2."""
import json

import pytest

from gradcheck_svc.errors import GraphError
from gradcheck_svc.graph import load_graph
import forked_cli


def graph(nodes, inputs=None, output="L", **extra):
    g = {
        "inputs": inputs if inputs is not None else [
            {"name": "w", "value": {"data": [3.0]}, "requiresGrad": True},
            {"name": "v", "value": {"shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}, "requiresGrad": True},
        ],
        "nodes": nodes,
        "output": output,
    }
    g.update(extra)
    return g


CASES = {
    "cycle": (graph([{"name": "a", "op": "neg", "inputs": ["b"]}, {"name": "b", "op": "neg", "inputs": ["a"]},
                     {"name": "L", "op": "sum", "inputs": ["a"]}]), "b", "cycle: b -> a -> b"),
    "self_loop": (graph([{"name": "L", "op": "add", "inputs": ["w", "L"]}]), "L", "cycle: L -> L"),
    "unknown_op": (graph([{"name": "L", "op": "mull", "inputs": ["w", "w"]}]), "L",
                   "unknown op 'mull' (did you mean 'mul'?)"),
    "unknown_input": (graph([{"name": "L", "op": "mul", "inputs": ["w", "q"]}]), "L", "unknown input 'q'"),
    "duplicate_node": (graph([{"name": "a", "op": "neg", "inputs": ["w"]}, {"name": "a", "op": "neg", "inputs": ["w"]},
                              {"name": "L", "op": "neg", "inputs": ["a"]}]), "a", "duplicate name 'a'"),
    "node_shadows_input": (graph([{"name": "w", "op": "neg", "inputs": ["w"]}], output="w"), "w", "duplicate name"),
    "duplicate_input": (graph([{"name": "L", "op": "neg", "inputs": ["w"]}],
                              inputs=[{"name": "w", "value": {"data": [1]}}, {"name": "w", "value": {"data": [2]}}]),
                        "input 'w'", "duplicate input name"),
    "missing_output": (graph([{"name": "L", "op": "neg", "inputs": ["w"]}], output=""), "output", "no output"),
    "output_unknown": (graph([{"name": "L", "op": "neg", "inputs": ["w"]}], output="M"), "output", "'M'"),
    "arity": (graph([{"name": "L", "op": "mul", "inputs": ["w"]}]), "L", "takes 2 input(s), got 1"),
    "unknown_attr": (graph([{"name": "L", "op": "sum", "inputs": ["v"], "attrs": {"axes": 0}}]), "L",
                     "unknown attribute 'axes'"),
    "attr_type": (graph([{"name": "L", "op": "sum", "inputs": ["v"], "attrs": {"keepdims": 1}}]), "L",
                  "'keepdims' must be true or false"),
    "attr_missing": (graph([{"name": "r", "op": "reshape", "inputs": ["v"]}, {"name": "L", "op": "sum", "inputs": ["r"]}]),
                     "r", "missing required attribute 'shape'"),
    "attr_choice": (graph([{"name": "g", "op": "gelu", "inputs": ["v"], "attrs": {"approximate": "erf"}},
                           {"name": "L", "op": "sum", "inputs": ["g"]}]), "g", "'approximate' must be one of"),
    "axis_range": (graph([{"name": "L", "op": "sum", "inputs": ["v"], "attrs": {"axis": 2}}]), "L",
                   "axis 2 is out of range for rank 2"),
    "broadcast": (graph([{"name": "a", "op": "add", "inputs": ["v", "u"]}, {"name": "L", "op": "sum", "inputs": ["a"]}],
                        inputs=[{"name": "v", "value": {"shape": [2, 3], "data": [0] * 6}, "requiresGrad": True},
                                {"name": "u", "value": {"shape": [2], "data": [0, 0]}}]),
                  "a", "cannot broadcast shapes [2, 3], [2]"),
    "matmul_inner": (graph([{"name": "m", "op": "matmul", "inputs": ["v", "v"]}, {"name": "L", "op": "sum", "inputs": ["m"]}]),
                     "m", "inner dimensions differ"),
    "reshape_size": (graph([{"name": "r", "op": "reshape", "inputs": ["v"], "attrs": {"shape": [4]}},
                            {"name": "L", "op": "sum", "inputs": ["r"]}]), "r", "cannot reshape [2, 3] to [4]"),
    "non_scalar_output": (graph([{"name": "L", "op": "neg", "inputs": ["v"]}]), "output", "must be a float scalar"),
    "int_into_float": (graph([{"name": "L", "op": "neg", "inputs": ["i"]}],
                             inputs=[{"name": "w", "value": {"data": [1.0]}, "requiresGrad": True},
                                     {"name": "i", "value": {"dtype": "int64", "data": [1]}}]), "L", "must be float"),
    # nothing checked is not a pass: a graph without a parameter is invalid input
    "no_parameters": (graph([{"name": "L", "op": "sum", "inputs": ["v"]}],
                            inputs=[{"name": "v", "value": {"shape": [2], "data": [1, 2]}}]),
                      "inputs", "no parameters: nothing to check"),
    "data_length": (graph([{"name": "L", "op": "sum", "inputs": ["v"]}],
                          inputs=[{"name": "v", "value": {"shape": [2, 3], "data": [1, 2]}}]),
                    "input 'v'", "data has 2 values, shape [2, 3] needs 6"),
    "bad_dtype": (graph([{"name": "L", "op": "sum", "inputs": ["v"]}],
                        inputs=[{"name": "v", "value": {"dtype": "float16", "data": [1]}}]), "input 'v'",
                  "unknown dtype 'float16'"),
    "grad_on_int": (graph([{"name": "L", "op": "sum", "inputs": ["v"]}],
                          inputs=[{"name": "v", "value": {"dtype": "int64", "data": [1]}, "requiresGrad": True}]),
                    "input 'v'", "requires_grad needs a float dtype"),
    "int_not_integer": (graph([{"name": "L", "op": "sum", "inputs": ["w"]}],
                              inputs=[{"name": "w", "value": {"data": [1.0]}},
                                      {"name": "i", "value": {"dtype": "int64", "data": [1.5]}}]),
                        "input 'i'", "int64 data must hold integers"),
    "opset": (graph([{"name": "L", "op": "neg", "inputs": ["w"]}], opsetVersion=99), "opset_version", "newer"),
    "opset_negative": (graph([{"name": "L", "op": "neg", "inputs": ["w"]}], opsetVersion=-1), "opset_version",
                       "is negative"),
    "no_name": (graph([{"op": "neg", "inputs": ["w"]}]), "nodes[0]", "node has no name"),
    # shapes NumPy cannot make are refused before any array is (they were internal errors, exit 3)
    "rank_over_32": (graph([{"name": "L", "op": "sum", "inputs": ["v"]}],
                           inputs=[{"name": "v", "value": {"shape": [1] * 33, "data": [1]}, "requiresGrad": True}]),
                     "input 'v'", "shape has 33 dimensions, the most NumPy supports is 32"),
    "node_rank_over_32": (graph([{"name": "r", "op": "reshape", "inputs": ["w"], "attrs": {"shape": [1] * 33}},
                                 {"name": "L", "op": "sum", "inputs": ["r"]}]), "r", "shape has 33 dimensions"),
    "empty_shape_overflows": (graph([{"name": "L", "op": "sum", "inputs": ["v"]}],
                                    inputs=[{"name": "v", "value": {"shape": [2**31 - 1] * 3 + [0]},
                                             "requiresGrad": True}]), "input 'v'", "too large for an array"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_graph_is_one_clear_error(case):
    g, where, needle = CASES[case]
    with pytest.raises(GraphError) as exc:
        load_graph(g)
    msg = exc.value.message
    assert needle in msg, msg
    assert where in msg, msg
    assert "\n" not in msg


def test_take_index_out_of_range_names_node():
    from gradcheck_svc.verify import verify

    g = graph([{"name": "t", "op": "take", "inputs": ["v", "idx"], "attrs": {"axis": 1}},
               {"name": "L", "op": "sum", "inputs": ["t"]}],
              inputs=[{"name": "v", "value": {"shape": [2, 3], "data": [0] * 6}, "requiresGrad": True},
                      {"name": "idx", "value": {"dtype": "int64", "shape": [1], "data": [7]}}])
    with pytest.raises(GraphError) as exc:
        verify(load_graph(g))
    assert exc.value.node == "t" and "out of bounds" in exc.value.message


@pytest.mark.parametrize("payload, needle", [
    (b'{"nodes": [', "invalid graph JSON"),
    (b'{"nodes": [{"nme": "a"}]}', "invalid graph JSON"),
    (b"\x0a\xff\xff\xff\xff\x0f", "not a valid gradcheck.v1.Graph protobuf"),
])
def test_undecodable_input(payload, needle):
    with pytest.raises(GraphError) as exc:
        load_graph(payload)
    assert needle in exc.value.message


@pytest.mark.parametrize("case", ["cycle", "unknown_op", "broadcast", "data_length", "no_parameters"])
def test_cli_exit_2_one_line(tmp_path, case):
    g, where, needle = CASES[case]
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g))
    p = forked_cli.run("gradcheck_svc.cli", "verify", path, timeout=60)
    assert p.returncode == 2
    assert needle in p.stderr and where in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_binary_and_json_encodings_are_interchangeable(tmp_path):
    from conftest import EXAMPLES

    from gradcheck_svc.graph.decode import parse_graph
    from gradcheck_svc.verify import verify

    msg = parse_graph(EXAMPLES / "mlp_cross_entropy.json")
    pb = tmp_path / "mlp.pb"
    pb.write_bytes(msg.SerializeToString())
    a, b = verify(load_graph(EXAMPLES / "mlp_cross_entropy.json")), verify(load_graph(pb))
    assert a.loss == b.loss
    for pa, pb_ in zip(a.parameters, b.parameters):
        assert (pa.gradient == pb_.gradient).all()
