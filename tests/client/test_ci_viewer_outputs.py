"""CI outputs as viewers read them (issue 27 item 6): JUnit with each graph's `file` and its report once (a
failure's body is not repeated in <system-out>, which GitLab would show twice); the Markdown summary's Mermaid
diagram names the failing parameters and the injected fault's source node."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import forked_cli
from grpc_helpers import EXAMPLES, ROOT, _env


def _verify(tmp_path, *args):
    """`gradcheck verify` in-process, in a fork of this process (tests/forked_cli.py: its main, environment,
    pipes and exit status)."""
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    r = forked_cli.run("gradcheck_client.cli", "verify", *args, "--junit", junit, "--summary-md", md, env=_env(),
                       cwd=ROOT, timeout=300)
    return r, junit, md


def test_junit_names_the_file_and_says_each_report_once(tmp_path):
    passing, wrong = EXAMPLES / "seed.json", EXAMPLES / "swish_custom_wrong.json"
    r, junit, _ = _verify(tmp_path, passing, wrong)
    assert r.returncode == 1, r.stderr
    root = ET.parse(junit).getroot()
    cases = {c.get("file"): c for c in root.iter("testcase")}
    assert set(cases) == {str(passing), str(wrong)}
    assert all(c.get("name") == path for path, c in cases.items())
    failing, ok = cases[str(wrong)], cases[str(passing)]
    body = failing.find("failure").text
    assert "FAIL" in body and failing.find("system-out") is None
    assert sum(e.text == body for e in root.iter()) == 1  # the report once
    assert ok.find("failure") is None and ok.find("system-out").text.startswith("graph seed: PASS")


def test_mermaid_summary_names_failing_parameters_and_the_fault_source(tmp_path):
    r, _, md = _verify(tmp_path, EXAMPLES / "seed.json", "--fault", "z:scale:2")
    assert r.returncode == 1, r.stderr
    text = md.read_text()
    assert "failing parameters: `w`, `x`; fault `z:scale:2` injected at `z`" in text
    [diagram] = re.findall(r"^```mermaid\n(.*?)^```$", text, flags=re.S | re.M)
    ids = dict((name, i) for i, name in re.findall(r'^ +(m\d+)\["([^<]*)<br/>', diagram, flags=re.M))
    assert f'{ids["z"]}["z<br/>mul<br/>fault z#58;scale#58;2"]' in diagram  # the cause, labelled as the fault
    assert f"class {ids['a']} error" in diagram  # the effect: the node whose saved input changed
    assert f"class {ids['z']} fault" in diagram
    box = re.search(r'  subgraph failing\["failing parameters"\]\n(.*?)\n  end', diagram, flags=re.S).group(1)
    assert re.findall(r'\["([^<]*)<br/>parameter"\]', box) == ["w", "x"]
    assert f"class {ids['w']},{ids['x']} param" in diagram


def test_a_fault_off_the_faulty_nodes_inputs_is_joined_by_a_dotted_arrow():
    from gradcheck_client import load_graph
    from gradcheck_core.outputs.mermaid import neighbourhood_mermaid

    graph = load_graph(EXAMPLES / "seed.json")
    report = {"findings": [{"node": "L", "severity": "error"}], "faults": [{"fault": "w:scale:2"}],
              "parameters": [{"name": "w", "status": "FAIL"}, {"name": "x", "status": "ok"}]}
    diagram = neighbourhood_mermaid(graph, report)
    ids = dict((name, i) for i, name in re.findall(r'^ +(m\d+)\["([^<]*)<br/>', diagram, flags=re.M))
    assert f'{ids["w"]} -. "fault" .-> {ids["L"]}' in diagram
    assert "x<br/>" not in diagram  # a parameter that verified is not drawn
