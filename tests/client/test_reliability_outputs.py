"""Outputs never change the verdict (issue 35 item 2): every writer is bounded, falls back and says so;
the exit code is the verification's; no line we print can be read as a CI workflow command.

- a 200-node chain whose parameter 100 nodes read (Graphviz `dot` took minutes on it; --html used to turn
  its PASS into exit 1 with a traceback): `gradcheck verify --html` and `gradcheck-svc verify --html` exit
  0 with a page that says what was not drawn, a Markdown summary and $GITHUB_STEP_SUMMARY. The cut is by
  size, so the test holds with or without `dot` and on any machine;
- failing, the same chain draws only the failing nodes' neighbourhood, and its Mermaid path is cut;
- a `dot` that never answers (a stand-in on PATH for a slow Graphviz) is given up after its time budget:
  dagre lays the graph out in the page, one warning line on stderr, exit code unchanged;
- the step summary stays within its size budget, whatever the number of graphs and diagrams;
- a graph and a parameter named like workflow commands begin no stdout line.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import forked_cli
from gradcheck_client import Tracer
from gradcheck_core.graphio import load_graph, save_graph
from gradcheck_core.graph_view import MAX_DRAWN, PATH_HEAD
from gradcheck_core.outputs.markdown import MAX_SUMMARY_BYTES, summary_markdown
from gradcheck_core.outputs.outcome import Outcome
from gradcheck_core.report import Report
from grpc_helpers import EXAMPLES, ROOT, _env

CHAIN = 200


def _fan_chain(path, name: str = "fan_chain"):
    """CHAIN nodes in a chain; every other one reads the parameter w (CHAIN // 2 readers)."""
    t = Tracer(name)
    w = t.param("w", np.array([0.3, -0.2, 0.1]))
    h = t.input("x", np.array([0.5, 0.4, -0.6]))
    for i in range(CHAIN):
        h = (h + w).named(f"add{i}") if i % 2 == 0 else t.apply("tanh", h, name=f"tanh{i}")
    g = t.graph(h.sum())
    assert len(g.nodes) + len(g.inputs) > MAX_DRAWN
    save_graph(g, path)
    return path


def _run(cli: str, *args, env: dict | None = None):
    """The command in a fork of this process (tests/forked_cli.py): its `main(argv)`, environment, pipes and exit
    status, without an interpreter's start-up; in-process verification, no gRPC."""
    module = {"gradcheck": "gradcheck_client.cli", "gradcheck-svc": "gradcheck_svc.cli"}[cli]
    return forked_cli.run(module, *args, env=_env(env), cwd=ROOT, timeout=600)


def _page_data(html: str) -> dict:
    start = html.index("<script type='application/json' id='gradcheck-data'>") + len(
        "<script type='application/json' id='gradcheck-data'>")
    return json.loads(html[start:html.index("</script>", start)])


@pytest.mark.parametrize("cli", ["gradcheck", "gradcheck-svc"])
def test_a_large_passing_graph_exits_0_with_a_fallback_page(cli, tmp_path):
    graph = _fan_chain(tmp_path / "fan.json")
    summary = tmp_path / "step_summary.md"
    r = _run(cli, "verify", graph, "--html", tmp_path / "r.html", "--summary-md", tmp_path / "s.md",
             "--symbolic", "off", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "graph fan_chain: PASS" in r.stdout
    html = (tmp_path / "r.html").read_text()
    assert f"over the {MAX_DRAWN} drawn whole, and nothing fails: not drawn" in html
    assert _page_data(html)["graphs"] == []  # nothing for the browser to lay out
    assert "fan.json" in summary.read_text() and (tmp_path / "s.md").read_text() == summary.read_text()


def test_a_large_failing_graph_draws_the_failing_neighbourhood(tmp_path):
    graph = _fan_chain(tmp_path / "fan.json")
    r = _run("gradcheck-svc", "verify", graph, "--html", tmp_path / "r.html", "--summary-md", tmp_path / "s.md",
             "--symbolic", "off", "--fault", "tanh101:scale:3")
    assert r.returncode == 1, r.stderr  # the verification's verdict, not the writers'
    html = (tmp_path / "r.html").read_text()
    [drawn] = _page_data(html)["graphs"]
    names = {n["name"] for n in drawn["view"]["nodes"]}
    assert "tanh101" in names and "x" not in names and len(names) < MAX_DRAWN
    assert f"over the {MAX_DRAWN} drawn whole" in html and "the path to the loss (shortened)" in html
    md = (tmp_path / "s.md").read_text()
    # the path from the fault to the loss, cut after PATH_HEAD values and labelled with what was cut
    cut = CHAIN - 101 + 1 - PATH_HEAD - 2  # tanh101 .. the last chain node, then the sum
    assert f'==>|"{cut} more"|' in md and md.count("```mermaid") == 1


def test_a_dot_that_never_answers_is_given_up(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dot = bin_dir / "dot"
    dot.write_text("#!/bin/sh\nexec sleep 600\n")
    dot.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GRADCHECK_LAYOUT_SECONDS": "1"}
    for cli in ("gradcheck", "gradcheck-svc"):
        r = _run(cli, "verify", EXAMPLES / "seed.json", "--html", tmp_path / f"{cli}.html", env=env)
        assert r.returncode == 0, r.stderr
        warnings = [line for line in r.stderr.splitlines() if "warning" in line]
        assert warnings == ["gradcheck: warning: Graphviz dot ran out of its time budget on graph seed; the page "
                            "lays it out with dagre instead"]
        html = (tmp_path / f"{cli}.html").read_text()
        [drawn] = _page_data(html)["graphs"]
        assert drawn["view"]["layout"] == "dagre" and "dagre" in html.split("id='gradcheck-data'")[1]


def _failing_outcome(tmp_path, capsys):
    from gradcheck_svc.cli import main

    graph = _fan_chain(tmp_path / "fan.json")
    main(["verify", str(graph), "--format", "json", "--symbolic", "off", "--fault", "tanh101:scale:3"])
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "fail"
    return load_graph(graph), report


def test_the_step_summary_stays_within_its_budget(tmp_path, capsys):
    graph, report = _failing_outcome(tmp_path, capsys)
    report = Report(report)  # one for every outcome: the summary only reads it
    one = summary_markdown([Outcome("g.json", report=report, graph=graph)])
    assert "```mermaid" in one and "left out" not in one and "not listed" not in one
    # 1,500 rows of ~185 bytes: past the table's half of the budget; their ~880-byte diagrams, past the rest
    many = summary_markdown([Outcome(f"team/g{k:05d}.json", report=report, graph=graph) for k in range(1500)])
    assert len(many.encode()) <= MAX_SUMMARY_BYTES and "```mermaid" in many
    assert "more failing graphs left out (the step summary's size limit)" in many
    assert "more graphs not listed here (the step summary's size limit)" in many
    # 20,000 rows of ~185 bytes: 14 times what the table's half of the budget holds
    rows = summary_markdown([Outcome(f"team/g{k:06d}.json", report=report) for k in range(20_000)])
    assert len(rows.encode()) <= MAX_SUMMARY_BYTES
    assert "more graphs not listed here (the step summary's size limit)" in rows and "20000 fail" in rows


def test_a_step_summary_that_cannot_be_appended_to_is_a_warning_not_the_outcome(tmp_path, capsys, monkeypatch):
    """$GITHUB_STEP_SUMMARY in a missing directory: the pass stays exit 0 with one warning (it was an internal
    error here, and a traceback with exit 1 from `gradcheck verify`)."""
    from gradcheck_client.cli import main as ci_main
    from gradcheck_svc.cli import main

    missing = tmp_path / "gone" / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(missing))
    warning = f"gradcheck: warning: $GITHUB_STEP_SUMMARY '{missing}': cannot append the summary: No such file or directory"
    assert main(["verify", str(EXAMPLES / "seed.json"), "--symbolic", "off"]) == 0
    assert capsys.readouterr().err.splitlines() == [warning]
    assert ci_main(["verify", str(EXAMPLES / "seed.json"), "--symbolic", "off"]) == 0
    assert capsys.readouterr().err.splitlines() == [warning, "gradcheck: 1 pass"]


def test_names_like_workflow_commands_begin_no_line(tmp_path):
    t = Tracer("::error title=x::pwned")
    w = t.param("::warning::w", np.array([0.5, -1.5]))
    save_graph(t.graph((w * w).sum().named("##[error]L")), tmp_path / "cmd.json")
    for cli in ("gradcheck", "gradcheck-svc"):
        r = _run(cli, "verify", tmp_path / "cmd.json", "--symbolic", "off")
        assert r.returncode == 0, r.stderr
        assert "PASS" in r.stdout
        for line in r.stdout.splitlines():
            assert not line.lstrip().startswith("::") and "##[" not in line, line


def test_the_page_lists_graphs_past_its_size_limit_in_its_index_only(tmp_path, capsys):
    from gradcheck_core.outputs.html_report import RunItem, build_html

    graph, report = _failing_outcome(tmp_path, capsys)
    passing = dict(report, verdict="pass")
    items = [RunItem(f"pass{k}.json", graph, passing) for k in range(3)] + [RunItem("fail.json", graph, report)]
    page = build_html(items, layout="dagre", max_bytes=1)  # past the limit after the first section drawn
    warning = capsys.readouterr().err
    assert warning == ("gradcheck: warning: the HTML page reached its size limit (1 bytes): 3 graphs are listed "
                       "in its index only\n")
    assert page.count("left out: the page reached its size limit") == 3
    [drawn] = _page_data(page)["graphs"]  # the failing graph's section comes first, and is the one kept
    assert drawn["host"] == "graph-3"
    assert all(f"pass{k}.json" in page for k in range(3))  # each still named in the index
