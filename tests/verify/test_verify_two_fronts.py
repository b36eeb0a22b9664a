"""`gradcheck-svc verify` and `gradcheck verify` (in-process) take the same paths, outputs, budgets and
limits, and give the same verdicts (issue 27 item 2). Both run in this process here (no server), on the
small example graphs."""
from __future__ import annotations

import json
import os
import signal
import sys
import xml.etree.ElementTree as ET

import pytest

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



ARMED: list = []  # (the test's pid, the path): _cancel_on_open's one shot; the hook itself stays installed


def _cancel_on_open(event: str, args: tuple) -> None:
    """An audit hook (Python's own, not ours): the verifying child, opening ARMED's path, SIGTERMs the test's
    process -- as a CI runner's cancel comes while a graph is verified."""
    if event == "open" and ARMED and os.getpid() != ARMED[0][0] and str(args[0]) == ARMED[0][1]:
        os.kill(ARMED.pop()[0], signal.SIGTERM)


def _unhandled(signum, frame):
    pytest.fail("SIGTERM reached the handler the command found: it did not handle it")


def test_sigterm_prints_the_graphs_verified_before_it_and_writes_no_file(tmp_path, capsys):
    """A CI runner's cancel (SIGTERM) killed `gradcheck-svc verify G G` at once, losing the finished reports:
    now it ends as Ctrl-C does, exit 143. The signal is sent by the child verifying the second graph as it
    opens it, so it comes while that graph is verified, never after (no timing)."""
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text((EXAMPLES / "seed.json").read_text())
    if _cancel_on_open not in HOOKED:
        sys.addaudithook(_cancel_on_open)
        HOOKED.append(_cancel_on_open)
    ARMED[:] = [(os.getpid(), str(tmp_path / "b.json"))]
    junit = tmp_path / "junit.xml"
    previous = signal.signal(signal.SIGTERM, _unhandled)  # unfixed, the command left it to kill pytest
    try:
        code = svc_main(["verify", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--symbolic", "off",
                         "--junit", str(junit)])
        assert signal.getsignal(signal.SIGTERM) is _unhandled  # restored: after the run, SIGTERM is as it was
    finally:
        ARMED.clear()
        signal.signal(signal.SIGTERM, previous)
    out, err = capsys.readouterr()
    assert code == 143 and not junit.exists()
    assert "a.json\ngraph seed: PASS" in out and "b.json" not in out
    assert err.strip() == ("gradcheck-svc: terminated (SIGTERM): 1 of 2 graphs verified (above); the others were "
                           "not, and no --junit, --html or --summary-md file was written")


HOOKED: list = []  # an audit hook cannot be removed: added once per process
