"""A corpus of bad inputs (malformed bytes, wrong-type JSON, every graph-validation error, every limit,
injection and look-alike formulas, huge names, control characters, bad options, non-finite data).

Each case is a graph file the CLI reads (.json or .pb) with the options given as CLI flags and as
VerifyOptions fields, and the error kind both front ends must give: "invalid" (INVALID_ARGUMENT,
exit 2), "limit" (RESOURCE_EXHAUSTED, exit 2) or "unavailable" (FAILED_PRECONDITION, exit 2).
The limits in LIMIT_FLAGS are small so that each limit is cheap to cross; the server and the CLI
run with the same ones.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
from google.protobuf import json_format

from gradcheck.v1 import graph_pb2, service_pb2
from gradcheck_svc.graph.build import GraphBuilder

LIMIT_FLAGS = {"max_nodes": 40, "max_elements": 20_000, "max_name_length": 64, "max_attribute_values": 50,
               "max_formula_chars": 400, "max_formula_depth": 8, "max_symbolic_budget": 100,
               "max_directions": 64, "max_faults": 4, "max_message_bytes": 200_000}


@dataclass
class Case:
    name: str
    data: bytes  # the graph file's bytes
    suffix: str  # ".json" | ".pb"
    kind: str  # invalid | limit | unavailable
    options: dict = field(default_factory=dict)  # VerifyOptions fields
    flags: list = field(default_factory=list)  # the same options as CLI flags
    same_message: bool = True  # the CLI's message is the server's (no options: one validation)

    def request(self) -> bytes | None:
        """The VerifyRequest bytes for gRPC, or None where the file has no protobuf form (bad JSON)."""
        try:
            if self.suffix == ".pb":
                graph = graph_pb2.Graph.FromString(self.data)
            else:
                graph = json_format.Parse(self.data.decode("utf-8"), graph_pb2.Graph())
        except Exception:  # noqa: BLE001 - malformed on purpose: covered by the raw-bytes cases
            return None
        return service_pb2.VerifyRequest(id=self.name, graph=graph,
                                         options=service_pb2.VerifyOptions(**self.options)).SerializeToString()


def seed() -> dict:
    return {"name": "seed", "opsetVersion": 1,
            "inputs": [{"name": "w", "value": {"data": [3.0]}, "requiresGrad": True},
                       {"name": "x", "value": {"data": [2.0]}, "requiresGrad": True},
                       {"name": "four", "value": {"data": [4.0]}}],
            "nodes": [{"name": "z", "op": "mul", "inputs": ["w", "x"]},
                      {"name": "a", "op": "square", "inputs": ["z"]},
                      {"name": "L", "op": "div", "inputs": ["a", "four"]}],
            "output": "L"}


def _json(name, graph, kind, **kw) -> Case:
    data = graph if isinstance(graph, bytes) else json.dumps(graph).encode()
    return Case(name, data, ".json", kind, **kw)


def _pb(name, msg_or_bytes, kind, **kw) -> Case:
    data = msg_or_bytes if isinstance(msg_or_bytes, bytes) else msg_or_bytes.SerializeToString()
    return Case(name, data, ".pb", kind, **kw)


def _edit(fn) -> dict:
    g = seed()
    fn(g)
    return g


def _expr(formula, grad=None) -> dict:
    attrs = {"formula": formula, **({"grad": grad} if grad else {})}
    return {"name": "expr", "opsetVersion": 1, "inputs": [{"name": "x", "value": {"shape": [2], "data": [0.5, 1.5]},
                                                           "requiresGrad": True}],
            "nodes": [{"name": "f", "op": "expr", "inputs": ["x"], "attrs": attrs},
                      {"name": "L", "op": "sum", "inputs": ["f"]}], "output": "L"}


def _renamed(name: str) -> dict:
    def fn(g):
        g["nodes"][0]["name"] = name
        g["nodes"][1]["inputs"] = [name]
    return _edit(fn)


def _chain(n: int) -> dict:
    nodes = [{"name": f"n{i}", "op": "mul", "inputs": [f"n{i - 1}" if i else "w", "x"]} for i in range(n)]
    return {"name": "chain", "inputs": seed()["inputs"][:2], "nodes": nodes, "output": f"n{n - 1}"}


def cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    # -- malformed bytes and wrong-type JSON -----------------------------------------------------
    for i, data in enumerate([b"", b"\x00", b"\xff" * 16, b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05abc",
                              bytes(range(256)), b"\x1a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"]):
        add(_pb(f"pb_garbage_{i}", data, "invalid"))
    for i, text in enumerate([b"{", b"[]", b"null", b"42", b'"graph"', b"{}", b'{"name": 3}', b'{"nodes": 5}',
                              b'{"inputs": "x"}', b'{"nodes": [{"op": 1}]}', b'{"output": []}',
                              b'{"inputs": [{"name": "w", "value": {"data": ["a"]}}]}',
                              b'{"inputs": [{"name": "w", "value": {"shape": ["x"]}}]}',
                              b'{"inputs": [{"name": "w", "value": {"data": [1e999]}}]}',
                              b'{"unknownField": 1}', b"\xff\xfe{}", b'{"name": "a\\ud800"}',
                              b'{"nodes": [{"name": "z", "attrs": 5}]}']):
        # "[]": json_format makes it an empty Graph (what the server is sent here), the CLI's reader refuses
        # a document that is not an object: both invalid, in their own words
        add(_json(f"json_bad_{i}", text, "invalid", same_message=text != b"[]"))
    # -- graph validation ------------------------------------------------------------------------
    edits = {
        "unknown_op": lambda g: g["nodes"][0].update(op="mull"),
        "unknown_input": lambda g: g["nodes"][0].update(inputs=["w", "nope"]),
        "duplicate_node": lambda g: g["nodes"][1].update(name="z"),
        "duplicate_input": lambda g: g["inputs"][1].update(name="w"),
        "node_named_like_input": lambda g: g["nodes"][0].update(name="w"),
        "empty_node_name": lambda g: g["nodes"][0].update(name=""),
        "empty_input_name": lambda g: g["inputs"][0].update(name=""),
        "no_output": lambda g: g.pop("output"),
        "unknown_output": lambda g: g.update(output="nope"),
        "cycle": lambda g: g["nodes"][0].update(inputs=["L", "x"]),
        "self_loop": lambda g: g["nodes"][1].update(inputs=["a"]),
        "arity_low": lambda g: g["nodes"][0].update(inputs=["w"]),
        "arity_high": lambda g: g["nodes"][1].update(inputs=["z", "z"]),
        "no_inputs_variadic": lambda g: g["nodes"].append({"name": "s", "op": "add_n", "inputs": []}),
        "unknown_attr": lambda g: g["nodes"][1].update(attrs={"axis": 0}),
        "bad_attr_type": lambda g: g["nodes"].insert(2, {"name": "s", "op": "sum", "inputs": ["a"],
                                                         "attrs": {"axis": "zero"}}),
        "bad_axis": lambda g: g["nodes"].insert(2, {"name": "s", "op": "sum", "inputs": ["a"],
                                                    "attrs": {"axis": 7}}),
        "shape_mismatch": lambda g: g["inputs"][1]["value"].update(shape=[2], data=[1.0, 2.0]),
        "non_scalar_loss": lambda g: g["inputs"][0]["value"].update(shape=[3], data=[1.0, 2.0, 3.0]),
        "loss_is_int": lambda g: (g["inputs"].append({"name": "k", "value": {"dtype": "int64", "data": [1]}}),
                                  g.update(output="k")),
        "requires_grad_int": lambda g: g["inputs"][0]["value"].update(dtype="int64"),
        "unknown_dtype": lambda g: g["inputs"][2]["value"].update(dtype="float16"),
        "negative_dim": lambda g: g["inputs"][2]["value"].update(shape=[-1]),
        "data_shape_mismatch": lambda g: g["inputs"][2]["value"].update(shape=[2]),
        "int_not_integer": lambda g: g["inputs"].append({"name": "k", "value": {"dtype": "int64", "data": [1.5]}}),
        "bool_not_01": lambda g: g["inputs"].append({"name": "k", "value": {"dtype": "bool", "data": [2]}}),
        "raw_and_data": lambda g: g["inputs"][2]["value"].update(raw="AAAAAAAAEEA="),
        "raw_wrong_size": lambda g: g["inputs"][2].update(value={"raw": "AAAA"}),
        "opset_too_new": lambda g: g.update(opsetVersion=999),
        "float_input_to_int_slot": lambda g: g["nodes"].insert(2, {"name": "t", "op": "take_along_axis",
                                                                   "inputs": ["a", "a"]}),
        "nan_in_data": lambda g: g["inputs"][0]["value"].update(data=["NaN"]),
        "inf_in_data": lambda g: g["inputs"][1]["value"].update(data=["Infinity"]),
        "neg_inf_in_constant": lambda g: g["inputs"][2]["value"].update(data=["-Infinity"]),
    }
    for name, fn in edits.items():
        add(_json(name, _edit(fn), "invalid"))
    # -- names: huge, non-ASCII, control characters (all valid names below the limit are fine) ----
    add(_json("name_2000_ascii", _renamed("n" * 2000), "limit"))
    add(_json("name_1000_e_acute", _renamed("é" * 1000), "limit"))
    add(_json("graph_name_huge", _edit(lambda g: g.update(name="g" * 5000)), "limit"))
    add(_json("input_name_huge", _edit(lambda g: (g["inputs"][2].update(name="f" * 300),
                                                   g["nodes"][2].update(inputs=["a", "f" * 300]))), "limit"))
    for i, bad in enumerate(["line\nTraceback (most recent call last):", "esc\x1b[31mred", "nul\x00byte",
                             "sep\u2028line", "bidi\u202eevil", "tab\tand\rcr", "<svg onload=x>&amp;"]):
        add(_json(f"control_name_{i}", _edit(lambda g, bad=bad: g["nodes"][0].update(op=bad)), "invalid"))
        add(_json(f"control_ref_{i}", _edit(lambda g, bad=bad: g["nodes"][0].update(inputs=["w", bad])),
                  "invalid"))
    # -- limits ------------------------------------------------------------------------------------
    add(_json("too_many_nodes", _chain(45), "limit"))
    add(_json("too_many_elements", _edit(lambda g: g["inputs"][2]["value"].update(
        shape=[21_000], data=[1.0] * 21_000)), "limit"))
    add(_json("too_many_attr_values", _edit(lambda g: g["nodes"].insert(2, {
        "name": "s", "op": "sum", "inputs": ["a"], "attrs": {"axis": list(range(60))}})), "limit"))
    add(_json("formula_too_long", _expr("x" + "+x" * 300), "limit"))
    add(_json("formula_too_deep", _expr("(" * 12 + "x" + ")" * 12), "limit"))
    add(_json("grad_formula_too_long", _expr("x*x", {"x": "2*x" + "+0*x" * 200}), "limit"))
    big = GraphBuilder("big")
    big.output(big.node("sum", big.input("x", np.ones(30_000), requires_grad=True), name="L"))
    # 240 kB of raw doubles, over 200 kB (the CLI names the file, the server the request)
    add(_pb("message_too_large", big.build(), "limit", same_message=False))
    add(_json("directions_over", seed(), "limit", options={"directions": 65, "fd_mode": "projection"},
              flags=["--directions", "65", "--fd", "projection"]))
    add(_json("symbolic_budget_over", seed(), "limit", options={"symbolic_budget": 101},
              flags=["--symbolic-max-elements", "101"]))
    faults = [f"z:scale:{k}" for k in range(2, 7)]
    add(_json("too_many_faults", seed(), "limit", options={"faults": faults},
              flags=[a for f in faults for a in ("--fault", f)]))
    # -- formulas: injection and look-alikes -------------------------------------------------------
    for i, formula in enumerate(["__import__('os').system('true')", "x.__class__", "lambda: x", "eval('x')",
                                 "open('/etc/passwd')", "x; x", "x if x else x", "[x]", "x[0]", "x @ x",
                                 "exp(x", "x +", "", "9**9**9**9", "x/0", "frobnicate(x)", "x*٣", "x*３",
                                 "х*x", "x**(1/0)", "1e99999*x", "'x'", "x == x", "x\nx"]):
        add(_json(f"formula_{i}", _expr(formula), "invalid"))
    add(_json("grad_for_unknown_input", _expr("x*x", {"y": "2*x"}), "invalid"))
    add(_json("grad_not_a_dict", _expr("x*x", "2*x"), "invalid"))
    # -- options -------------------------------------------------------------------------------------
    opt_cases = [
        ("negative_seed", {"seed": -1, "fd_mode": "projection"}, ["--seed", "-1", "--fd", "projection"]),
        ("unknown_fd_mode", {"fd_mode": "fast"}, None),
        ("negative_directions", {"directions": -3}, ["--directions", "-3"]),
        ("bad_fault_kind", {"faults": ["z:melt"]}, ["--fault", "z:melt"]),
        ("fault_unknown_node", {"faults": ["nope:zero"]}, ["--fault", "nope:zero"]),
        ("fault_bad_value", {"faults": ["z:overwrite:abc"]}, ["--fault", "z:overwrite:abc"]),
        ("bad_checkpoint", {"checkpoint": "every:0"}, ["--checkpoint", "every:0"]),
        ("checkpoint_unknown_node", {"checkpoint": "nope"}, ["--checkpoint", "nope"]),
        ("bad_dtype", {"dtype": "float16"}, None),
        ("nan_rtol", {"rtol": float("nan")}, ["--rtol", "nan"]),
        ("negative_atol", {"atol": -1.0}, ["--atol", "-1"]),
        ("bad_integrity", {"integrity": "maybe"}, None),
    ]
    for name, options, flags in opt_cases:
        if flags is None:  # argparse refuses these itself (choices): exit 2 too
            flags = {"fd_mode": ["--fd", "fast"], "dtype": ["--dtype", "float16"],
                     "integrity": ["--integrity", "maybe"]}[next(iter(options))]
        add(_json(f"option_{name}", seed(), "invalid", options=options, flags=flags))
    from gradcheck_svc.backend import cuda_available

    if not cuda_available():  # on a GPU machine this request is valid
        add(_json("device_cuda_without_gpu", seed(), "unavailable", options={"device": "cuda"},
                  flags=["--device", "cuda"]))
    return out
