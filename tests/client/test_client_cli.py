"""`gradcheck verify`: exit codes, JUnit, Markdown summary, JSON, in-process fallback."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

import pytest

import forked_cli
from gradcheck_client import save_graph
from grpc_helpers import FAULT_ON_Z, ROOT, ServerProcess, _env, seed_graph, unsaved_z_graph


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--workers", "2")
    yield s
    assert s.stop() == 0


def gradcheck(*args, env=None, without_service=False):
    """The command's result: a real process with `--server` (gRPC) or `without_service`, a fork of this process
    (tests/forked_cli.py: the same main, environment, pipes and exit status) otherwise."""
    if not without_service:
        return forked_cli.run("gradcheck_client.cli", *args, env=_env(env), cwd=ROOT, timeout=120)
    # run as if gradcheck-svc were not installed (None in sys.modules blocks the import): a fresh interpreter
    code = ("import sys; sys.modules['gradcheck_svc'] = None; "
            "from gradcheck_client.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, env=_env(env), cwd=ROOT, timeout=120)


@pytest.fixture
def graphs(tmp_path):
    """A directory with a passing, a failing (under FAULT_ON_Z), an invalid and an undecodable graph."""
    d = tmp_path / "graphs"
    (d / "nested").mkdir(parents=True)
    save_graph(seed_graph(), d / "seed.json")  # fails under the fault
    save_graph(unsaved_z_graph(), d / "nested" / "unsaved_z.pb")  # passes under the fault
    bad = seed_graph()
    bad.nodes[0].op = "mull"
    save_graph(bad, d / "unknown_op.json")
    (d / "garbage.json").write_text("{not json")
    (d / "notes.txt").write_text("ignored: not a graph")
    return d


def test_all_verified_exits_0(server):
    r = gradcheck("verify", ROOT / "examples" / "graphs" / "seed.json", "--server", server.target)
    assert r.returncode == 0, r.stderr
    assert "seed: PASS" in r.stdout


def test_mismatch_exits_1(server, graphs):
    r = gradcheck("verify", graphs / "seed.json", graphs / "nested", "--server", server.target, "--fault", FAULT_ON_Z)
    assert r.returncode == 1, r.stderr
    assert "seed: FAIL" in r.stdout and "unsaved_z: PASS" in r.stdout


def test_junit_and_summary_match_the_verdicts(server, graphs, tmp_path):
    junit, md, gh = tmp_path / "junit.xml", tmp_path / "summary.md", tmp_path / "gh_summary.md"
    gh.write_text("earlier step\n")
    r = gradcheck("verify", graphs, "--server", server.target, "--fault", FAULT_ON_Z, "--junit", junit,
                  "--summary-md", md, env={"GITHUB_STEP_SUMMARY": str(gh)})
    assert r.returncode == 2, r.stderr  # invalid input outranks a mismatch
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "4"
    (suite,) = root.findall("testsuite")
    assert suite.get("tests") == "4"
    assert suite.get("failures") == "1" and suite.get("errors") == "2"
    cases = {c.get("name").rsplit("/", 1)[1]: c for c in suite.iter("testcase")}
    assert set(cases) == {"seed.json", "unsaved_z.pb", "unknown_op.json", "garbage.json"}
    assert cases["unsaved_z.pb"].find("failure") is None and cases["unsaved_z.pb"].find("error") is None
    assert cases["seed.json"].find("failure") is not None
    assert "unknown op 'mull'" in cases["unknown_op.json"].find("error").get("message")
    assert cases["garbage.json"].find("error").get("type") == "invalid"
    table = md.read_text()
    assert "| Graph | Verdict | Findings |" in table
    rows = {line.split("|")[1].strip(" `").rsplit("/", 1)[1]: line for line in table.splitlines()
            if line.startswith("| `")}
    assert "fail" in rows["seed.json"] and "`x` wrong" in rows["seed.json"]
    assert "pass" in rows["unsaved_z.pb"]
    assert gh.read_text() == "earlier step\n" + table


def test_json_output(server, graphs):
    r = gradcheck("verify", graphs / "seed.json", graphs / "unknown_op.json", "--server", server.target, "--json")
    assert r.returncode == 2
    docs = {d["path"].rsplit("/", 1)[1]: d for d in json.loads(r.stdout)}
    assert docs["seed.json"]["status"] == "pass"
    assert docs["seed.json"]["report"]["parameters"][0]["gradient"] == [6.0]
    assert docs["unknown_op.json"]["status"] == "invalid" and docs["unknown_op.json"]["report"] is None


def test_unreachable_server_exits_3(graphs):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = gradcheck("verify", graphs / "seed.json", "--server", f"127.0.0.1:{port}", "--timeout", "5")
    assert r.returncode == 3
    assert "UNAVAILABLE" in r.stdout and "Traceback" not in r.stderr


def _in_process(capsys, *args) -> tuple[int, str]:
    """(exit code, stderr) of the command's main in this process: usage errors end before any process matters."""
    from gradcheck_client.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    return code, capsys.readouterr().err


def test_bad_token_file_and_usage_exit_2(graphs, tmp_path, capsys):
    code, err = _in_process(capsys, "verify", graphs / "seed.json", "--server", "127.0.0.1:1", "--token-file",
                            tmp_path / "missing")
    assert code == 2 and "cannot read token file" in err
    assert _in_process(capsys, "verify", tmp_path / "nothing-here")[0] == 2
    assert _in_process(capsys, "verify")[0] == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = _in_process(capsys, "verify", empty)
    assert code == 2 and "no *.json or *.pb graphs" in err
    # a token no request header can carry (two lines): one line naming the file, on every door that reads one
    # (it was every call failing, gRPC's multi-line log, exit 3; a server refusing every request)
    two = tmp_path / "token"
    two.write_text("first\nsecond\n")
    from gradcheck_svc.config import read_token
    from gradcheck_svc.errors import OptionError

    code, err = _in_process(capsys, "verify", graphs / "seed.json", "--server", "127.0.0.1:1", "--token-file", two)
    needle = "--token-file: the token holds '\\n', which a request header cannot carry"
    assert code == 2 and err.splitlines() == [f"gradcheck: error: {needle} (one line of printable ASCII)"]
    with pytest.raises(OptionError, match=re.escape(needle)):
        read_token(str(two))


def test_in_process_without_a_server(graphs):
    r = gradcheck("verify", graphs / "seed.json", graphs / "nested")
    assert r.returncode == 0, r.stderr
    r = gradcheck("verify", graphs / "seed.json", "--fault", FAULT_ON_Z)
    assert r.returncode == 1 and "seed: FAIL" in r.stdout
    r = gradcheck("verify", graphs / "unknown_op.json")
    assert r.returncode == 2 and "unknown op 'mull'" in r.stdout


def test_without_server_or_service_says_how_to_point_at_one(graphs):
    r = gradcheck("verify", graphs / "seed.json", without_service=True)
    assert r.returncode == 2
    assert "--server HOST:PORT" in r.stderr and "gradcheck-svc is not installed" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--junit", "/nonexistent/dir/junit.xml"], "cannot write --junit /nonexistent/dir/junit.xml"),
    (["--summary-md", "/nonexistent/dir/summary.md"], "cannot write --summary-md /nonexistent/dir/summary.md"),
    (["--tls", "--ca-file", "/nonexistent/ca.pem", "--server", "127.0.0.1:1"], "cannot read --ca-file"),
    (["--timeout", "-1"], "--timeout: must be positive"),
    (["--timeout", "1e300"], "--timeout: must be at most 1000000"),
])
def test_unusable_files_and_bad_numbers_exit_2_one_line(graphs, args, needle):
    r = gradcheck("verify", graphs / "seed.json", *args)
    assert r.returncode == 2 and needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


class _StoppedWhenTheSecondGraphStarts:
    """A terminal (so the progress line is drawn) whose user presses Ctrl-C, or whose CI runner cancels the job
    (SIGTERM, to the main thread: the one that draws), as b.json's first phase shows."""

    def __init__(self, how: str):
        self.text, self.how = "", how

    def isatty(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def write(self, text: str) -> int:
        if "b.json:" in text:
            if self.how == "ctrl-c":
                raise KeyboardInterrupt
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        self.text += text
        return len(text)


def _unhandled(signum, frame):
    pytest.fail("SIGTERM reached the handler the command found: it did not handle it")


@pytest.mark.parametrize("how, code, said", [("ctrl-c", 130, "interrupted"),
                                             ("sigterm", 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_prints_the_graphs_verified_before_it_and_writes_no_file(tmp_path, capsys, monkeypatch,
                                                                                    how, code, said):
    """What finished is not lost (it was: exit 130 and nothing printed; SIGTERM, a CI runner's cancel, killed it
    at once); no JUnit file reads as a complete run."""
    from gradcheck_client.cli import main

    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text((ROOT / "examples" / "graphs" / "seed.json").read_text())
    terminal = _StoppedWhenTheSecondGraphStarts(how)
    monkeypatch.setattr(sys, "stderr", terminal)
    junit = tmp_path / "junit.xml"
    previous = signal.signal(signal.SIGTERM, _unhandled)  # unfixed, the command left SIGTERM to kill pytest
    try:
        got = main(["verify", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--symbolic", "off", "--junit",
                    str(junit)])
        assert signal.getsignal(signal.SIGTERM) is _unhandled  # restored after the run
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = capsys.readouterr().out
    assert got == code and not junit.exists()
    assert "a.json\ngraph seed: PASS" in out and "b.json" not in out
    assert terminal.text.splitlines()[-1] == (f"gradcheck: {said}: 1 of 2 graphs verified (above); the others "
                                              "were not, and no --junit, --html or --summary-md file was written")
