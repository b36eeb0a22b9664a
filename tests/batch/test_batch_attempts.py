"""Attempts that cannot mix (gradcheck_svc/batch/attempt.py): real shard processes, run as an Indexed Job's pods
run them (index, run ID, attempt and the index's failure count from the environment), on a local results
directory, and the merge as the merge Job runs it (--attempt, --wait, --manifest).

An earlier launch is built from a copy of the source with one line added: a different gradcheck (its code
version is a digest of its source), as an image rebuilt with a fix is. Its shards are real processes started
from that copy; this build's shards and merges are the same commands forked from this process
(tests/forked_cli.py: argv, environment, signals and exit status as a pod's), but the merge that waits while
the shards run, a real process."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import forked_cli
from grpc_helpers import ROOT, _env
from slow_graphs import unfinishable_graph
from gradcheck_svc.batch.generate import graph_dict
from gradcheck_svc.batch.manifest import shard_of
from gradcheck_svc.store.records import code_version

SHARDS, RETRIES, RUN = 3, 3, "attempts"
HEARTBEAT = "0.5"  # seconds: a SIGKILLed last try is seen after 6 quiet beats (attempt.QUIET_BEATS)
ENDS = 300  # how long a process may take on a loaded machine (never a measurement: a bound on a hang)
GRAPHS = [f"g{i}.json" for i in range(9)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("graphs")
    for i, g in enumerate(GRAPHS):
        (root / g).write_text(json.dumps(graph_dict(i, size=2, kind="mismatch" if i == 7 else "ok")))
    return root


@pytest.fixture(scope="module")
def old_build(tmp_path_factory) -> Path:
    """The source as an earlier image held it: one line different, so another code version."""
    root = tmp_path_factory.mktemp("old-build")
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "gradcheck_svc", root / "gradcheck_svc", ignore=skip)
    for pkg in ("gradcheck", "gradcheck_client"):
        shutil.copytree(ROOT / "clients" / "python" / pkg, root / "clients" / "python" / pkg, ignore=skip)
    with open(root / "gradcheck_svc" / "__init__.py", "a") as fh:
        fh.write("# the build before the fix\n")
    return root


def env(attempt: str | None, index: int | None = None, failures: int = 0, build: Path | None = None,
        **extra) -> dict:
    """A pod's environment; attempt None: no GRADCHECK_ATTEMPT at all (a manifest that sets none)."""
    e = {"GRADCHECK_RUN_ID": RUN, "GRADCHECK_ATTEMPT": attempt, "GRADCHECK_INDEX_FAILURES": str(failures),
         "GRADCHECK_INDEX_RETRIES": str(RETRIES), "GRADCHECK_HEARTBEAT_SECONDS": HEARTBEAT, **extra}
    if index is not None:
        e["JOB_COMPLETION_INDEX"] = str(index)
    e = {k: v for k, v in _env(e).items() if v is not None}
    if build is not None:
        e["PYTHONPATH"] = f"{build}:{build / 'clients' / 'python'}"
    return e


def start_shard(corpus, out, index: int, attempt: str, *extra: str, failures: int = 0, build=None,
                count: int = SHARDS, **kw):
    """One pod of the shards' Job: forked from this process, or, for another build or with a preexec_fn, a real
    process (`python -m` puts its working directory first on the path: the build's)."""
    args = ["batch", f"--manifest={corpus}", f"--shard-count={count}", f"--out={out}", *extra]
    if build is None and not kw:
        return forked_cli.Forked("gradcheck_svc.cli", args, env=env(attempt, index, failures), cwd=ROOT,
                                 timeout=ENDS)
    return subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", *args],
                            env=env(attempt, index, failures, build), cwd=build or ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def shards(corpus, out, attempt: str, indexes=range(SHARDS), build=None) -> None:
    """Shards as the Job starts them: concurrently."""
    procs = [start_shard(corpus, out, i, attempt, build=build) for i in indexes]
    for p in procs:
        _, err = p.communicate(timeout=ENDS)
        assert p.returncode == 0, err


def merge(corpus, out, attempt: str, wait: float, *extra: str) -> tuple[int, str]:
    proc = forked_cli.run("gradcheck_svc.cli", "batch-merge", out, f"--run-id={RUN}", f"--shard-count={SHARDS}",
                          f"--manifest={corpus}", f"--wait={wait}", f"--attempt={attempt}", *extra,
                          env=env(attempt), cwd=ROOT, timeout=ENDS)
    return proc.returncode, proc.stderr


def merged(out) -> dict:
    return json.loads((out / "runs" / RUN / "merged.json").read_text())


def mine(index: int) -> list[str]:
    return [g for g in GRAPHS if shard_of(g, SHARDS) == index]


# --- a resume after an image rebuild --------------------------------------------------------------------

@pytest.fixture(scope="module")
def old_run(tmp_path_factory, corpus, old_build) -> Path:
    """Attempt "a", every shard finished (ended.json final) by the old build."""
    out = tmp_path_factory.mktemp("old-run") / "out"
    shards(corpus, out, "a", build=old_build)
    ended = json.loads((out / "runs" / RUN / "shard-0001" / "ended.json").read_text())
    assert ended["attempt"] == "a" and ended["final"] is True and ended["gradcheck_version"] != code_version()
    return out


def _skew(out: Path, hours: int) -> None:
    """Every time stamp the old launch wrote, as a host whose clock was `hours` off would have written it."""
    def shift(stamp: str) -> str:
        return (datetime.fromisoformat(stamp) + timedelta(hours=hours)).isoformat()

    for f in (out / "runs" / RUN).rglob("*.json"):
        obj = json.loads(f.read_text())
        for key in ("started_at", "at", "finished_at"):
            if key in obj:
                obj[key] = shift(obj[key])
        f.write_text(json.dumps(obj))


@pytest.mark.parametrize("skew", [0, 2, -2])
def test_a_resume_after_a_rebuild_with_shards_pending_merges_nothing_stale(tmp_path, corpus, old_run, skew):
    """Attempt "b" (this build) has run shard 0 only; shards 1 and 2 are still pending. Attempt "a"'s
    ended.json files (final, exit 0) say nothing about "b": the merge does not settle on them (it waits, here
    for 0 s), and "a"'s records (another version) are superseded, never merged: the pending shards' graphs are
    missing, each with why. Clocks 2 h off either way change nothing (no time stamp is compared)."""
    out = tmp_path / "out"
    shutil.copytree(old_run, out)
    _skew(out, skew)
    shards(corpus, out, "b", indexes=[0])
    code, err = merge(corpus, out, "b", 0)
    assert code == 4, err
    assert "waited 0 s and some shards or nodes have not ended" in err
    m = merged(out)
    assert sorted(r["graph"] for r in m["records"]) == sorted(mine(0))
    assert {r["gradcheck_version"] for r in m["records"]} == {code_version()}
    assert {r["attempt"] for r in m["records"]} == {"b"}
    pending = sorted(mine(1) + mine(2))
    assert sorted(i["graph"] for i in m["missing"]) == pending
    assert {i["why"] for i in m["missing"]} == {"not started under attempt b"}
    assert {(u["unit"], u["attempt"]) for u in m["superseded"]["units"]} == {("shard-0001", "a"), ("shard-0002", "a")}
    assert m["other_options"] == [] and m["mixed"] == []
    assert "unit(s) of an earlier launch than attempt b: shard-0001 (attempt a), shard-0002 (attempt a)" in err
    if skew == 0:  # the rest of "b" runs: complete, every answer this build's
        shards(corpus, out, "b", indexes=[1, 2])
        code, err = merge(corpus, out, "b", 3600)
        assert code == 1 and "9 graphs: 8 pass, 1 fail (exit 1)" in err, err
        assert merged(out)["failed"] == ["g7.json"]
        assert {r["gradcheck_version"] for r in merged(out)["records"]} == {code_version()}


def test_a_job_launched_without_an_attempt_settles_on_its_own_markers(tmp_path, corpus, old_run):
    """A Job whose manifest sets no GRADCHECK_ATTEMPT (one's own; the shipped ones always set it, and refuse it
    empty): its pods take the Job's uid as their attempt (job-UID, the downward API's controller-uid), and the
    merge given none, started after a shard claimed the run, settles on the attempt holding it -- never on
    time stamps. Attempt "a"'s ended.json files (final, exit 0, written by a clock 2 h ahead: newer than
    anything of the new Job's) do not settle it while the new Job's shards 1 and 2 are pending; "a"'s records
    (another version) are superseded. (Skew the other way: the test above; both settle by attempt alone.)"""
    out = tmp_path / "out"
    shutil.copytree(old_run, out)
    _skew(out, 2)
    job = env(None, 0, GRADCHECK_JOB_UID="0f9e-uid-b")
    p = forked_cli.run("gradcheck_svc.cli", "batch", f"--manifest={corpus}", f"--shard-count={SHARDS}",
                       f"--out={out}", env=job, cwd=ROOT, timeout=ENDS)
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "runs" / RUN / "attempt.json").read_text())["attempt"] == "job-0f9e-uid-b"
    r = forked_cli.run("gradcheck_svc.cli", "batch-merge", out, f"--run-id={RUN}", f"--shard-count={SHARDS}",
                       f"--manifest={corpus}", "--wait=0", env=env(None), cwd=ROOT, timeout=ENDS)
    assert r.returncode == 4, r.stderr
    assert "waited 0 s and some shards or nodes have not ended" in r.stderr
    m = merged(out)
    assert m["attempt"] == "job-0f9e-uid-b"
    assert sorted(rec["graph"] for rec in m["records"]) == sorted(mine(0))
    assert {rec["attempt"] for rec in m["records"]} == {"job-0f9e-uid-b"}
    assert sorted(i["graph"] for i in m["missing"]) == sorted(mine(1) + mine(2))
    assert {i["why"] for i in m["missing"]} == {"not started under attempt job-0f9e-uid-b"}


# --- two launches under one run ID ----------------------------------------------------------------------

def _slow_corpus(tmp_path) -> Path:
    """One graph per shard that no time limit here lets finish: the shards run until stopped."""
    root = tmp_path / "slow"
    root.mkdir()
    for i in range(SHARDS):
        name = next(f"slow-{k}.json" for k in range(1000) if shard_of(f"slow-{k}.json", SHARDS) == i)
        (root / name).write_text(json.dumps(unfinishable_graph()))
    return root


def _beating(out, index: int, proc) -> dict:
    """The shard's heartbeat, once it has written its plan and beaten twice (it is running)."""
    alive = out / "runs" / RUN / f"shard-{index:04d}" / "alive.json"
    for _ in range(ENDS * 10):
        if proc.poll() is not None:
            raise AssertionError(f"the shard ended (exit {proc.returncode}): {proc.communicate()[1]}")
        if alive.is_file() and (alive.parent / "unit.json").is_file():  # verifying its graphs
            beat = json.loads(alive.read_text())
            if beat["beat"] >= 2:
                return beat
        time.sleep(0.1)
    raise AssertionError("no heartbeat")


def _files(out) -> dict[str, bytes]:
    """Every file under out and its bytes, but the running shard's heartbeat (alive.json and its temporary)."""
    return {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()
            and not f.name.startswith((".alive.json", "alive.json"))}


def test_a_second_launch_under_one_run_id_is_refused_while_the_first_runs(tmp_path):
    corpus, out = _slow_corpus(tmp_path), tmp_path / "out"
    first = start_shard(corpus, out, 0, "a", "--time-limit=3600", failures=RETRIES)  # its index's last try
    try:
        _beating(out, 0, first)
        before = _files(out)
        for index in (0, 1):  # its own unit, and one the first launch has not started: both refused
            second = start_shard(corpus, out, index, "b", "--time-limit=3600")
            _, err = second.communicate(timeout=ENDS)
            assert second.returncode == 2, err
            assert ("is being written right now by another launch (shard-0000 (attempt a): its heartbeat "
                    "advances): a second run under one run ID; attempt b refused, nothing written (exit 2)") in err
            # nothing of the first launch overwritten; beside it only the refusal, under the second's own name
            after = _files(out)
            assert {k: after[k] for k in before} == before and set(after) - set(before) == {
                f"runs/{RUN}/refused-b-shard-{i:04d}.json" for i in range(index + 1)}
        assert json.loads((out / "runs" / RUN / "attempt.json").read_text())["attempt"] == "a"
        # the second launch's merge, waiting up to an hour as deployed, refuses at once and writes nothing
        code, err = merge(corpus, out, "b", 3600)
        assert code == 2 and "attempt b refused, nothing written: this merge writes nothing (exit 2)" in err, err
        assert not (out / "runs" / RUN / "merged.json").exists()
    finally:
        first.send_signal(signal.SIGTERM)  # the first launch's Job deleted: its pod ends, saying so
        _, err = first.communicate(timeout=ENDS)
    assert first.returncode == 143 and "terminated (SIGTERM)" in err, err
    ended = json.loads((out / "runs" / RUN / "shard-0000" / "ended.json").read_text())
    assert ended["attempt"] == "a" and ended["exit"] == 143 and ended["final"] is True  # its last try: the end
    assert ended["error"] == "terminated (SIGTERM): the records written so far stay (exit 143)"
    # now a resume (a fresh attempt) takes the run over at once: the first launch has ended
    resumed = start_shard(corpus, out, 1, "b", "--time-limit=1")
    _, err = resumed.communicate(timeout=ENDS)
    assert resumed.returncode == 0, err
    assert json.loads((out / "runs" / RUN / "attempt.json").read_text())["attempt"] == "b"


# --- every way a shard ends, ends its index -------------------------------------------------------------

def test_a_sigkilled_last_try_and_a_usage_error_end_their_indexes(tmp_path, corpus):
    """Index 0 is refused by argparse (a mistyped flag: exit 2, FailIndex); index 1's last try is SIGKILLed
    mid-graph (the OOM killer: no word from it); index 2 finishes. The merge, started first and waiting up to
    an hour, ends once index 1's heartbeat has stopped, with a partial report naming each missing graph and
    why."""
    slow = _slow_corpus(tmp_path)
    for g in GRAPHS:  # the ordinary graphs beside one unfinishable graph per shard
        shutil.copy(corpus / g, slow / g)
    out = tmp_path / "out"
    waiting = subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", "batch-merge", str(out),
                                f"--run-id={RUN}", f"--shard-count={SHARDS}", f"--manifest={slow}", "--wait=3600",
                                "--attempt=c"], env=env("c"), cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    refused = start_shard(slow, out, 0, "c", "--time-limt=5")
    _, err = refused.communicate(timeout=ENDS)
    assert refused.returncode == 2 and "unrecognized arguments: --time-limt=5" in err
    killed = start_shard(slow, out, 1, "c", "--time-limit=3600", failures=RETRIES)
    _beating(out, 1, killed)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=ENDS)
    finished = start_shard(slow, out, 2, "c", "--time-limit=1")
    _, err = finished.communicate(timeout=ENDS)
    assert finished.returncode == 0, err
    _, err = waiting.communicate(timeout=ENDS)
    assert waiting.returncode == 4, err
    assert "some shards or nodes have not ended" not in err  # settled: nothing left to wait for
    m = merged(out)
    why = {i["graph"]: i["why"] for i in m["missing"]}
    answered = {r["graph"] for r in m["records"]}
    names = sorted(p.name for p in slow.iterdir())
    assert sorted(answered | set(why)) == names and not answered & set(why)
    assert {why.get(g) for g in names if shard_of(g, SHARDS) == 0} == {
        "its last try ended with exit 2: unrecognized arguments: --time-limt=5 (did you mean --time-limit?)"}
    killed_slow = next(g for g in names if g.startswith("slow-") and shard_of(g, SHARDS) == 1)
    assert {why[g] for g in why if shard_of(g, SHARDS) == 1} == {
        "its last try stopped without an ending (SIGKILL: out of memory, or its node lost)"} and killed_slow in why
    assert all(g in answered for g in names if shard_of(g, SHARDS) == 2)
    assert "why missing: shard 0 (" in err and "partial report: " in err


# --- a full results disk ---------------------------------------------------------------------------------

def _small_disk(path: Path, size: str) -> bool:
    """A tmpfs of `size` at path, where this process may mount one (root in a container with the capability);
    False otherwise (the caller then limits the shard's file size instead: RLIMIT_FSIZE, EFBIG)."""
    path.mkdir()
    if not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _file_size_limit(limit: int):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_results_disk_ends_with_a_partial_report_naming_the_path(tmp_path, corpus):
    """The shard's last try meets a full results volume (a 16 KiB tmpfs where one can be mounted, else a file
    size limit): exit 75 naming the file it could not write, its ending still recorded; the merge settles at
    once and its partial report says why each graph is missing, naming that file. On a disk still full the
    merge's own report cannot be written: exit 75 (retried), naming merged.json; once space is freed, the
    retry writes it."""
    disk = tmp_path / "disk"
    mounted = _small_disk(disk, "16k")
    try:
        out = disk / "out"
        kw = {} if mounted else {"preexec_fn": _file_size_limit(2048)}
        shard = start_shard(corpus, out, 0, "d", failures=RETRIES, count=1, **kw)
        _, err = shard.communicate(timeout=ENDS)
        reason = "No space left on device" if mounted else "File too large"
        assert shard.returncode == 75, err
        line = next(ln for ln in err.splitlines() if "infrastructure failure" in ln)
        path = line.split("(exit 75): ", 1)[1].rsplit(": ", 1)[0]
        assert line.endswith(f": {reason}") and path.startswith(str(out / "runs" / RUN / "shard-0000")), line
        if mounted:
            code, err = merge(corpus, out, "d", 3600, "--shard-count=1")
            assert code == 75 and f"cannot write {out / 'runs' / RUN / 'merged.json'} (--json): {reason}" in err, err
            subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)  # space freed
        code, err = merge(corpus, out, "d", 3600, "--shard-count=1")
        assert code == 4, err
        assert "some shards or nodes have not ended" not in err
        m = merged(out)
        missing = {i["why"] for i in m["missing"]}
        assert missing == {f"its last try ended with exit 75: infrastructure failure, retry (exit 75): {path}: "
                           f"{reason}"}
        assert sorted([r["graph"] for r in m["records"]] + [i["graph"] for i in m["missing"]]) == GRAPHS
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=False)


def test_an_ending_lands_on_a_disk_with_no_block_left(tmp_path):
    """Full to the last block (a filler file took what the records left), the volume cannot take a new
    ended.json; the heartbeat's alive.json holds 1 KiB reserved for it, renamed and rewritten in place: the
    merge still reads how the attempt ended. (A tmpfs is needed to fill a volume for real.)"""
    from gradcheck_svc.batch.attempt import Heartbeat
    from gradcheck_svc.store.schema import parse
    from gradcheck_svc.store.records import write_ended

    disk = tmp_path / "disk"
    if not _small_disk(disk, "64k"):
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        unit = disk / "runs" / RUN / "shard-0000"
        beat = Heartbeat(unit, "e", last_try=True).start()
        beat.stop()
        with open(disk / "filler", "wb", buffering=0) as fh:
            with pytest.raises(OSError, match="No space left on device"):
                while True:
                    fh.write(b"\0" * 4096)
        with pytest.raises(OSError, match="No space left on device"):
            (unit / "probe").write_bytes(b"x" * 4096)
        write_ended(unit, 75, True, "2026-12-07T00:00:00+00:00", "e", "v", "disk full: /results/x.json")
        ended = parse((unit / "ended.json").read_bytes())
        assert ended["exit"] == 75 and ended["final"] is True and ended["attempt"] == "e"
        assert ended["error"] == "disk full: /results/x.json" and not (unit / "alive.json").exists()
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# --- endings before any plan ------------------------------------------------------------------------------

def _in_process(capsys, *argv: str) -> tuple[int, str]:
    """The command in this process (main(argv), argparse's exit as its code): what it exits with and says."""
    from gradcheck_svc.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_a_launch_whose_every_shard_ended_before_its_plan_is_reported_not_waited_for(tmp_path, corpus, capsys,
                                                                                    monkeypatch):
    """A flag mistyped in the Job's template is mistyped in every pod: each index is refused by argparse (exit
    2, FailIndex) before it writes a unit.json, and only its ended.json says so. The merge still finds the run
    and settles at once (its --wait=0 would say what it had not seen end), naming every graph missing and why
    -- not waiting out --wait for a run it cannot see, then exiting 2 (FailJob, no report)."""
    out = tmp_path / "out"
    for k, v in {"GRADCHECK_RUN_ID": RUN, "GRADCHECK_ATTEMPT": "u"}.items():
        monkeypatch.setenv(k, v)
    for i in range(SHARDS):
        code, err = _in_process(capsys, "batch", f"--manifest={corpus}", f"--shard-count={SHARDS}",
                                f"--shard-index={i}", f"--out={out}", "--time-limt=5")
        assert code == 2 and "unrecognized arguments: --time-limt=5" in err
    assert not list(out.rglob("unit.json"))
    code, err = _in_process(capsys, "batch-merge", str(out), f"--run-id={RUN}", f"--shard-count={SHARDS}",
                            f"--manifest={corpus}", "--wait=0", "--attempt=u")
    assert code == 4, err
    assert "some shards or nodes have not ended" not in err
    m = merged(out)
    assert m["records"] == [] and sorted(i["graph"] for i in m["missing"]) == GRAPHS
    assert {i["why"] for i in m["missing"]} == {
        "its last try ended with exit 2: unrecognized arguments: --time-limt=5 (did you mean --time-limit?)"}


def test_a_try_that_ends_while_claiming_the_run_records_its_ending(tmp_path, corpus, capsys, monkeypatch):
    """The claim (attempt.json) can take a minute -- it watches an earlier launch's heartbeats -- and its write can
    fail (a store refusing the PUT; here attempt.json is a directory): the try ends 75 and, on its last try,
    its ended.json says so, as every later ending does (a SIGTERM there too: 143). Without it the merge would
    wait out --wait for an index that will never run again."""
    out = tmp_path / "out"
    (out / "runs" / RUN / "attempt.json").mkdir(parents=True)
    for k, v in {"GRADCHECK_RUN_ID": RUN, "GRADCHECK_ATTEMPT": "w", "GRADCHECK_INDEX_FAILURES": str(RETRIES),
                 "GRADCHECK_INDEX_RETRIES": str(RETRIES)}.items():
        monkeypatch.setenv(k, v)
    code, err = _in_process(capsys, "batch", f"--manifest={corpus}", "--shard-count=1", "--shard-index=0",
                            f"--out={out}")
    assert code == 75, err
    line = f"infrastructure failure, retry (exit 75): {out / 'runs' / RUN / 'attempt.json'}: Is a directory"
    assert line in err
    ended = json.loads((out / "runs" / RUN / "shard-0000" / "ended.json").read_text())
    assert (ended["attempt"], ended["exit"], ended["final"], ended["error"]) == ("w", 75, True, line)


@pytest.mark.parametrize("name, value, needle", [
    ("GRADCHECK_HEARTBEAT_SECONDS", "10s", "'10s' is not a positive number of seconds"),
    ("GRADCHECK_HEARTBEAT_SECONDS", "0", "'0' is not a positive number of seconds"),
    ("GRADCHECK_INDEX_RETRIES", "three", "'three' is not a count (0 or more)"),
    ("GRADCHECK_INDEX_FAILURES", "-1", "'-1' is not a count (0 or more)"),
    ("GRADCHECK_ATTEMPT", "a b", "'a b' is not an attempt ID"),
    # settings.yaml's `attempt: ""`: the merge, started before any shard of the launch, settled at once on the
    # previous launch's endings and reported its results as this launch's
    ("GRADCHECK_ATTEMPT", "", "empty: name this launch (settings.yaml `attempt`, fresh per apply)")])
def test_a_garbage_setting_is_refused_naming_it_before_anything_is_written(tmp_path, corpus, capsys, monkeypatch,
                                                                            name, value, needle):
    """Each fell back to its default (a heartbeat of 10 s, an index never out of retries) or was named as
    --attempt, a flag nobody gave: now exit 2, one line naming the variable, from every batch command. An empty
    GRADCHECK_INDEX_FAILURES (the downward API's value for an annotation not there yet) stays unknown."""
    out = tmp_path / "out"
    monkeypatch.setenv("GRADCHECK_INDEX_FAILURES", "")
    monkeypatch.setenv(name, value)
    for argv in (["batch", f"--manifest={corpus}", "--shard-count=1", "--shard-index=0", f"--out={out}"],
                 ["batch-merge", str(out), f"--run-id={RUN}", "--shard-count=1", "--wait=0"]):
        code, err = _in_process(capsys, *argv)
        assert code == 2 and len(err.splitlines()) == 1, (argv, err)
        assert err.startswith(f"gradcheck-svc: error: {name}: {needle}"), (argv, err)
    assert not out.exists()


def test_two_launches_claiming_at_once_one_is_refused(tmp_path):
    """Reading the claim and writing it are two steps: two launches starting at the same moment both found the run
    free and both wrote it (2 of 4 tries, probed with real processes). Here launch "y" claims in the very gap of
    launch "x"'s claim -- after x decided the run was free, before x's claim names it -- as a pod started at the
    same instant does: exactly one of them gets the run, the other is refused with its line, having written
    nothing."""
    from gradcheck_svc.batch.attempt import claim

    rdir = tmp_path / "runs" / RUN
    rdir.mkdir(parents=True)
    (rdir / "attempt.json").write_text('{"attempt":"w","job_uid":null,"previous":null}\n')  # an earlier launch's
    seen = {}

    def y_claims_now():
        before = sorted(p.name for p in rdir.iterdir())
        seen["y"] = claim(rdir, "y", None)
        seen["y wrote"] = sorted(set(p.name for p in rdir.iterdir()) - set(before))

    assert claim(rdir, "x", None, announce=y_claims_now) is None
    assert seen["y"] == ("run attempts is being claimed right now by another launch (attempt x): a second run under "
                         "one run ID; attempt y refused, nothing written") and seen["y wrote"] == []
    assert json.loads((rdir / "attempt.json").read_text()) == {"attempt": "x", "job_uid": None, "previous": "w"}
    assert claim(rdir, "x", None) is None  # x's other pods go on
    # two Jobs reusing one attempt, at once: the second Job's pod loses the claim to the first's, and is refused
    (rdir / "attempt.json").unlink()  # a run no launch holds yet
    seen.clear()
    assert claim(rdir, "v", "uid-1", announce=lambda: seen.update(v=claim(rdir, "v", "uid-2"))) is None
    assert seen["v"].startswith("attempt v of run attempts was launched before by Job uid uid-1: give each launch")
