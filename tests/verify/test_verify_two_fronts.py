"""`gradcheck-svc verify` and `gradcheck verify` (in-process) take the same paths, outputs, budgets and
limits, and give the same verdicts (issue 27 item 2). Both run in this process here (no server), on the
small example graphs."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from gradcheck_client.cli import main as ci_main
from grpc_helpers import EXAMPLES

from gradcheck_svc.cli import main as svc_main

SEED, WRONG = str(EXAMPLES / "seed.json"), str(EXAMPLES / "swish_custom_wrong.json")


def test_both_commands_verify_several_graphs_into_the_same_outputs(tmp_path, capsys):
    runs = {}
    for name, main, json_flag in (("svc", svc_main, "--format"), ("ci", ci_main, "--json")):
        out = tmp_path / name
        out.mkdir()
        args = [SEED, WRONG, "--junit", str(out / "j.xml"), "--summary-md", str(out / "s.md"),
                "--memory-plot", str(out / "plot.svg"), "--symbolic-timeout", "60"]
        args += ["--format", "json"] if json_flag == "--format" else ["--json"]
        assert main(["verify", *args]) == 1  # one graph fails: the highest exit code
        runs[name] = json.loads(capsys.readouterr().out)
        cases = ET.parse(out / "j.xml").getroot().iter("testcase")
        assert len(list(cases)) == 2
        assert "swish_custom_wrong" in (out / "s.md").read_text()
        for graph in ("seed", "swish_custom_wrong"):  # one plot per graph, named after it
            assert (out / f"plot.{graph}.svg").read_text().lstrip().startswith("<")
    for run in runs.values():
        assert [(r["path"], r["status"]) for r in run] == [(SEED, "pass"), (WRONG, "fail")]
    assert [r["report"]["verdict"] for r in runs["svc"]] == [r["report"]["verdict"] for r in runs["ci"]]


def test_one_graph_keeps_its_report_as_the_output(capsys):
    assert svc_main(["verify", SEED, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "pass"  # the bare report, as before


def test_the_ci_command_applies_the_limits_and_budgets_in_process(capsys):
    assert ci_main(["verify", SEED, "--max-nodes", "2"]) == 2
    assert "graph has 3 nodes, the limit is 2" in capsys.readouterr().out
    assert ci_main(["verify", SEED, "--symbolic-timeout", "-1"]) == 2
    assert "--symbolic-timeout: must be positive" in capsys.readouterr().err


def test_with_a_server_the_in_process_flags_are_refused_not_ignored(capsys):
    assert ci_main(["verify", "--server", "127.0.0.1:1", SEED, "--max-nodes", "5"]) == 2
    assert "--max-nodes: applies in-process only" in capsys.readouterr().err
    assert ci_main(["verify", "--server", "127.0.0.1:1", SEED, "--symbolic-max-partials", "5"]) == 2
    assert "--symbolic-max-partials: applies in-process only" in capsys.readouterr().err
