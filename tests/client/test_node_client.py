"""The Node.js client example (clients/node: @grpc/grpc-js and @grpc/proto-loader from the .proto files
alone) against a real server on loopback: attrs sent as a plain object arrive as an empty Struct and
the report's `attributes` shows the defaults the server used (loss 441, a sum over everything);
built with its toStruct() helper they arrive (loss 155, PASS, dL/dx right); an attribute the op does
not have is refused with INVALID_ARGUMENT whose google.rpc.BadRequest (decoded with the vendored
proto/google/rpc/*.proto) names the node. Needs `node` and the example's node_modules (`make test`
installs them with npm when it can: `make node-deps`); skips saying which is missing."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from grpc_helpers import ROOT

NODE_DIR = ROOT / "clients" / "node"


def _node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        log = NODE_DIR / "npm-install.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        said = [ln for ln in lines if ln.startswith("npm error") and "complete log" not in ln] or lines[-1:]
        why = f"npm said: {'; '.join(said[:4])[:300]}" if said else "run `make node-deps` (npm ci in clients/node)"
        pytest.skip(f"clients/node/node_modules is absent ({why})")
    return node


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from grpc_helpers import module_server

    yield from module_server(tmp_path_factory, "--workers", "1")


def test_node_client_example(server):
    node = _node_or_skip()
    # the timeout only ends a hung run (the example's own deadline is 120 s a call); it asserts nothing
    run = subprocess.run([node, "example.js", server.target], cwd=NODE_DIR, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    steps = {s["step"]: s for s in map(json.loads, run.stdout.splitlines())}
    lost, right, refused = steps["plain_object"], steps["struct"], steps["unknown_attribute"]
    assert (lost["loss"], lost["s"]["used"], lost["s"]["defaulted"]) == (441, {"axis": None, "keepdims": False},
                                                                         ["axis", "keepdims"])
    assert (right["loss"], right["verdict"], right["s"]["used"]) == (155, "pass", {"axis": 0, "keepdims": False})
    assert right["gradient"] == [10, 14, 18, 10, 14, 18]
    assert refused["status"]["code"] == 3 and refused["status"]["violations"][0]["field"] == "node 's'"


def test_the_python_client_sees_the_same_attributes(server):
    """The same graph through the Python client: the report's attributes are the server's, Struct and all."""
    import numpy as np

    from gradcheck_client import Client
    from gradcheck_svc.graph.build import GraphBuilder

    b = GraphBuilder("column_sums")
    x = b.input("x", np.arange(1.0, 7.0).reshape(2, 3), requires_grad=True)
    s = b.node("sum", x, name="s", axis=0)
    b.output(b.node("sum", b.node("square", s, name="sq"), name="L"))
    with Client(server.target, timeout=120) as c:
        report = c.verify(b.build(), symbolic=False)
    assert report.data["loss"] == 155
    assert report.data["attributes"] == [  # square has no attributes: no entry
        {"op": "sum", "used": {"axis": 0, "keepdims": False}, "defaulted": ["keepdims"], "nodes": ["s"]},
        {"op": "sum", "used": {"axis": None, "keepdims": False}, "defaulted": ["axis", "keepdims"], "nodes": ["L"]}]


def test_nodes_that_agree_share_one_entry():
    """A chain of one op verified with the same attributes is one entry naming every node, in order."""
    import numpy as np

    from gradcheck_svc.graph import load_graph
    from gradcheck_svc.graph.build import GraphBuilder
    from gradcheck_svc.verify.attributes import attributes_used

    b = GraphBuilder("chain")
    h = b.input("x", np.ones((2, 3)), requires_grad=True)
    for i in range(4):
        h = b.node("softmax", h, name=f"p{i}", **({"axis": 0} if i == 2 else {}))
    b.output(b.node("sum", h, name="L"))
    got = attributes_used(load_graph(b.build()))
    assert [(e["op"], e["used"], e["defaulted"], e["nodes"]) for e in got] == [
        ("softmax", {"axis": -1}, ["axis"], ["p0", "p1", "p3"]), ("softmax", {"axis": 0}, [], ["p2"]),
        ("sum", {"axis": None, "keepdims": False}, ["axis", "keepdims"], ["L"])]
