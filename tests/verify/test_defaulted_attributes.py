"""Attributes lost on the wire are said in every report format (issue 44): a node whose op has structural
attributes (axis, keepdims, perm...) and arrives with an empty attrs Struct -- what a Node.js client's
binary encoder sends for a plain object -- is verified with every one defaulted; the check passes for a
function nobody wrote. The text report, the JUnit XML and the HTML page each carry a warning line naming
the node and the defaulted names; a node given its attributes, or an op without structural ones, gets none.
Through the real client CLI against a real server on loopback, with a binary graph (.pb)."""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from gradcheck_core.graphio import set_attrs
from gradcheck_svc.graph.build import GraphBuilder

from grpc_helpers import ROOT, _env, module_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def _graph(path):
    """x (2, 3) -> sum 'over_axis' (sent with an empty Struct) -> ...; 'rows' sum(axis=1) given; tanh (no
    structural attributes) sent with an empty Struct too."""
    b = GraphBuilder("lost_attrs")
    x = b.input("x", np.arange(6.0).reshape(2, 3) / 7, requires_grad=True)
    t = b.node("tanh", x, name="t")
    rows = b.node("sum", t, name="rows", axis=1)
    b.output(b.node("sum", rows, name="over_axis"))
    msg = b.msg
    for node in msg.nodes:
        if node.name in ("over_axis", "t"):
            node.attrs.SetInParent()  # present, no fields: the wire's empty Struct
    assert msg.nodes[2].HasField("attrs") and not msg.nodes[2].attrs.fields
    path.write_bytes(msg.SerializeToString())
    return path


def test_an_empty_attrs_struct_is_a_warning_in_text_junit_and_html(server, tmp_path):
    graph = _graph(tmp_path / "lost_attrs.pb")
    junit, html = tmp_path / "junit.xml", tmp_path / "report.html"
    code = "from gradcheck_client.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "verify", "--server", server.target, str(graph),
                        "--junit", str(junit), "--html", str(html)],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr  # the graph is right as verified: a warning, not a failure
    lines = [line for line in r.stdout.splitlines() if "empty attrs Struct" in line]
    assert len(lines) == 1, r.stdout
    (line,) = lines
    assert "warning:" in line and "'over_axis' (sum)" in line and "(axis, keepdims)" in line
    assert "'rows'" not in line and "'t'" not in line  # given its axis; tanh has nothing to lose
    system_out = [e.text for e in ET.parse(junit).getroot().iter("system-out")]
    assert any(line.strip() in (t or "") for t in system_out), system_out
    page = html.read_text()
    assert "empty attrs Struct" in page and "&#x27;over_axis&#x27; (sum)" in page.replace("&#39;", "&#x27;")
    assert "(axis, keepdims)" in page


def test_a_graph_with_its_attributes_given_has_no_such_warning(server, tmp_path):
    b = GraphBuilder("given_attrs")
    x = b.input("x", np.ones((2, 3)), requires_grad=True)
    b.output(b.node("sum", b.node("sum", x, name="rows", axis=1), name="all"))
    msg = b.msg
    set_attrs(msg.nodes[1], {"keepdims": False})
    (tmp_path / "g.pb").write_bytes(msg.SerializeToString())
    code = "from gradcheck_client.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "verify", "--server", server.target, str(tmp_path / "g.pb")],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "graph given_attrs: PASS" in r.stdout and "empty attrs Struct" not in r.stdout
