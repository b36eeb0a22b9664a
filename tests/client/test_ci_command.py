"""`gradcheck verify` as a CI step (issue 13 item 4): directory scans with globs, files that are
clearly not graphs skipped with a note, JUnit read by a JUnit consumer (junitparser), progress
on a terminal only. In-process (no server): the CLI's own behaviour is what is under test."""
from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys

import pytest

import forked_cli
from grpc_helpers import ROOT, _env
from junitparser import Error, Failure, JUnitXml, Properties

FAULTS = ROOT / "examples" / "graphs" / "faults"
CODE = "import sys; from gradcheck_client.cli import main; sys.exit(main(sys.argv[1:]))"


def gradcheck(*args):
    """The command with its stdout and stderr on pipes, in a fork of this process (tests/forked_cli.py: its main,
    environment, pipes and exit status; the terminal's case below is a real process)."""
    return forked_cli.run("gradcheck_client.cli", *args, env=_env(None), cwd=ROOT, timeout=120)


def _faults_copy(tmp_path):
    d = tmp_path / "faults"
    d.mkdir()
    for name in ("float32_cancellation.json", "log_zero.json", "relu_at_zero.json", "manifest.json"):
        shutil.copy(FAULTS / name, d / name)
    (d / "sub").mkdir()
    shutil.copy(ROOT / "examples" / "graphs" / "seed.json", d / "sub" / "seed.json")
    (d / "sub" / "list.json").write_text("[1, 2, 3]\n")  # JSON, but clearly not a graph
    return d


def test_manifest_and_non_graph_json_are_skipped_with_a_note(tmp_path):
    d = _faults_copy(tmp_path)
    r = gradcheck("verify", d, "--json")
    assert r.returncode == 1, r.stderr  # log_zero fails; nothing is "invalid"
    notes = [line for line in r.stderr.splitlines() if "skipped, not a graph" in line]
    assert len(notes) == 2 and any("manifest.json" in n and "about, cases" in n for n in notes)
    assert any("list.json" in n and "a JSON list" in n for n in notes)
    import json

    statuses = {doc["path"].rsplit("/", 1)[1]: doc["status"] for doc in json.loads(r.stdout)}
    assert statuses == {"float32_cancellation.json": "pass", "log_zero.json": "fail",
                        "relu_at_zero.json": "pass", "seed.json": "pass"}


def test_include_and_exclude_globs(tmp_path):
    d = _faults_copy(tmp_path)
    r = gradcheck("verify", d, "--include", "sub/*", "--exclude", "list.json", "--json")
    import json

    assert r.returncode == 0, r.stderr
    assert [doc["path"].rsplit("/", 1)[1] for doc in json.loads(r.stdout)] == ["seed.json"]
    r = gradcheck("verify", d, "--exclude", "log_*", "--exclude", "sub/*", "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(doc["path"].rsplit("/", 1)[1] for doc in json.loads(r.stdout)) == \
        ["float32_cancellation.json", "relu_at_zero.json"]
    # a file named on the command line is always taken (and a broken one reported)
    r = gradcheck("verify", d / "manifest.json")
    assert r.returncode == 2 and "manifest.json" in r.stdout


def test_junit_has_testsuites_times_and_finding_properties(tmp_path):
    d = _faults_copy(tmp_path)
    (d / "broken.json").write_text("{not json")
    junit = tmp_path / "junit.xml"
    r = gradcheck("verify", d, "--junit", junit)
    assert r.returncode == 2, r.stderr  # the broken file is invalid input
    xml = JUnitXml.fromfile(str(junit))
    assert xml._elem.tag == "testsuites"
    (suite,) = list(xml)
    cases = {c.name.rsplit("/", 1)[1]: c for c in suite}
    assert set(cases) == {"float32_cancellation.json", "log_zero.json", "relu_at_zero.json", "seed.json",
                          "broken.json"}
    assert suite.tests == 5 and suite.failures == 1 and suite.errors == 1
    for name, case in cases.items():
        assert case.time is not None and case.time >= 0, name
    assert all(cases[n].time > 0 for n in ("float32_cancellation.json", "log_zero.json", "seed.json"))
    assert abs(suite.time - sum(c.time for c in cases.values())) < 1e-3

    def props(case):
        return [(p.name, p.value) for p in (case.child(Properties) or [])]
    log_zero = cases["log_zero.json"]
    assert isinstance(log_zero.result[0], Failure)
    assert ("verdict", "fail") in props(log_zero) and ("cause", "nonfinite") in props(log_zero)
    assert ("node", "logp") in props(log_zero)
    f32 = cases["float32_cancellation.json"]
    assert f32.is_passed and ("cause", "precision") in props(f32) and ("verdict", "pass") in props(f32)
    assert ("cause", "nondifferentiable_point") in props(cases["relu_at_zero.json"])
    assert isinstance(cases["broken.json"].result[0], Error)


def _run_on_a_terminal(args) -> tuple[int, str]:
    """Run the command with stderr on a pseudo-terminal; returns (exit code, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CODE, *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=slave, env=_env(None), cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_progress_on_a_terminal_per_graph_and_phase_quiet_otherwise(tmp_path):
    d = _faults_copy(tmp_path)
    # the progress is the point, not the oracle: without the symbolic one (SymPy's import, its expansions)
    # each run is ~1 s cheaper, every phase below still shown and the verdicts the same
    code, screen = _run_on_a_terminal(["verify", d, "--exclude", "sub/*", "--symbolic", "off"])
    assert code == 1
    assert "1/3" in screen and "3/3" in screen  # per graph
    for phase in ("engine", "finite differences", "diagnosis"):  # within a graph, per phase
        assert f"log_zero.json: {phase}" in screen, screen
    r = gradcheck("verify", d, "--exclude", "sub/*", "--symbolic", "off")  # stderr is a pipe: no progress at all
    assert "\r" not in r.stderr and "finite differences" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == "gradcheck: 2 pass, 1 fail"


def test_a_graph_in_a_directory_that_is_no_regular_file_is_refused_not_skipped(tmp_path):
    """A broken link or a FIFO named like a graph was left out silently: the run passed on the others."""
    from gradcheck_core.scan import graph_paths

    shutil.copy(ROOT / "examples" / "graphs" / "seed.json", tmp_path / "seed.json")
    (tmp_path / "model.json").symlink_to(tmp_path / "build" / "model.json")  # not built yet
    with pytest.raises(FileNotFoundError, match=r"not a regular file: .*model\.json \(a broken link, a FIFO or a "
                                                r"device: fix it, or leave it out with --exclude\)"):
        graph_paths([tmp_path], (), (), "gradcheck")
    assert graph_paths([tmp_path], (), ("model.json",), "gradcheck") == [str(tmp_path / "seed.json")]
    os.mkfifo(tmp_path / "pipe.pb")  # reading it would wait for a writer for ever
    with pytest.raises(FileNotFoundError, match=r"not a regular file: .*pipe\.pb"):
        graph_paths([tmp_path], (), ("model.json",), "gradcheck")


def test_an_output_over_a_file_the_run_reads_is_refused(tmp_path, capsys):
    """`--html graph.json` overwrote the graph being verified with the page (exit 0): the user's input lost."""
    from gradcheck_client.cli import main as ci_main
    from gradcheck_svc.cli import main

    graph = tmp_path / "g.json"
    shutil.copy(ROOT / "examples" / "graphs" / "seed.json", graph)
    for command, prog in ((main, "gradcheck-svc"), (ci_main, "gradcheck")):
        assert command(["verify", str(tmp_path), "--junit", str(graph)]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (f"{prog}: error: --junit: '{graph}' is a file this run "
                                                            "reads: writing it would destroy it (write elsewhere)")
    assert graph.read_text() == (ROOT / "examples" / "graphs" / "seed.json").read_text()
