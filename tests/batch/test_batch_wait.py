"""A merge that always reports (batch-merge --wait): started with the shards, as every deploy variant starts it,
it waits until every shard index has ended its last attempt -- finished, or failed for good as the Job controller
decides it (backoffLimitPerIndex, FailIndex) -- then writes its report: complete, or partial (exit 4) naming what
passed, what failed and what is missing. A SIGTERM (an eviction, or the Job ending) makes it write what it has
at once and exit 143, and the Job's retry of it waits again. The Job controller's part is played here: each
attempt of an index gets the annotation the controller sets (its earlier failures, through the downward API)."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import forked_cli
from grpc_helpers import ROOT, _env
from gradcheck_svc.batch.generate import graph_dict
from gradcheck_svc.batch.manifest import shard_of

# RETRIES: backoffLimitPerIndex, the Job's retries per index; 1 gives an index a try that is not its last and
# one that is, all there is to tell apart (the deploy's 3 adds two more tries like the first)
SHARDS, RETRIES, RUN = 3, 1, "waited"
MERGE_WAIT = 3600  # far beyond the test: the merge ends because the run has settled, never by its deadline
ENDS = 300  # how long a settled merge may take to notice, on a loaded machine (never a measurement)
HEARTBEAT = "0.5"  # seconds: the merge looks every half heartbeat (10 s as deployed: every 5 s)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def corpus(tmp_path) -> Path:
    root = tmp_path / "graphs"
    root.mkdir()
    for i in range(9):
        (root / f"g{i}.json").write_text(json.dumps(graph_dict(i, size=2, kind="mismatch" if i == 7 else "ok")))
    return root


def shard(corpus, out, index: int, failures: int = 0, *extra: str) -> subprocess.CompletedProcess:
    """One attempt of one index, as the Job runs it (index, run ID, the earlier failures of this index): the
    command forked from this process (tests/forked_cli.py); start_unreachable's, which talks gRPC, is a real
    process. The process under test is the merge's, a real one."""
    return forked_cli.run("gradcheck_svc.cli", "batch", "--manifest", corpus, "--shard-count", SHARDS, "--out", out,
                          *extra, env=_attempt_env(index, failures), cwd=ROOT, timeout=300)


def _attempt_env(index: int, failures: int) -> dict:
    """What the Job gives an attempt of an index: its index, the run ID, the index's earlier failures."""
    return _env({"JOB_COMPLETION_INDEX": str(index), "GRADCHECK_RUN_ID": RUN, "GRADCHECK_INDEX_FAILURES": str(failures),
                 "GRADCHECK_INDEX_RETRIES": str(RETRIES), "GRADCHECK_HEARTBEAT_SECONDS": HEARTBEAT})


def start_unreachable(corpus, out, index: int, failures: int) -> subprocess.Popen:
    """An attempt that fails as infrastructure does (exit 75): its server does not answer. A real process (it
    talks gRPC), started and left running -- it spends seconds in the client's retries, asleep -- while the Job's
    other indexes run beside it, as they do in a Job; `failed` waits for it."""
    return subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", "batch", "--manifest", str(corpus),
                             "--shard-count", str(SHARDS), "--out", str(out), "--server",
                             f"127.0.0.1:{_closed_port()}"], env=_attempt_env(index, failures), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def failed(attempt: subprocess.Popen) -> None:
    _, err = attempt.communicate(timeout=300)
    assert attempt.returncode == 75, err


def unreachable(corpus, out, index: int, failures: int) -> None:
    failed(start_unreachable(corpus, out, index, failures))


def start_merge(corpus, out) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", "batch-merge", str(out), f"--run-id={RUN}",
                             f"--shard-count={SHARDS}", f"--manifest={corpus}", f"--wait={MERGE_WAIT}"],
                            env=_env({"GRADCHECK_HEARTBEAT_SECONDS": HEARTBEAT}), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def ended(merge: subprocess.Popen) -> tuple[int, str]:
    _, err = merge.communicate(timeout=ENDS)
    return merge.returncode, err


def merged(out) -> dict:
    return json.loads((out / "runs" / RUN / "merged.json").read_text())


def test_the_merge_waits_for_every_shard_then_reports(tmp_path, corpus):
    out = tmp_path / "out"
    merge = start_merge(corpus, out)
    lost = 1
    attempt = start_unreachable(corpus, out, lost, failures=0)
    for i in range(SHARDS):
        if i != lost:
            assert shard(corpus, out, i).returncode == 0
    failed(attempt)  # retried: the merge must not stop here, every other index done
    assert shard(corpus, out, lost, failures=1).returncode == 0
    code, err = ended(merge)
    assert code == 1, err  # complete: one graph fails
    assert "9 graphs: 8 pass, 1 fail (exit 1)" in err and "some shards or nodes have not ended" not in err
    assert merged(out)["failed"] == ["g7.json"] and merged(out)["missing"] == []


def test_a_shard_failed_for_good_gives_a_partial_report(tmp_path, corpus):
    """One index runs out of retries (its 2nd failure: backoffLimitPerIndex 1): the merge does not wait for it
    and reports what passed, what failed and what is missing (exit 4)."""
    out = tmp_path / "out"
    merge = start_merge(corpus, out)
    lost = shard_of("g7.json", SHARDS)
    attempt = start_unreachable(corpus, out, lost, failures=0)
    for i in range(SHARDS):
        if i != lost:
            assert shard(corpus, out, i).returncode == 0
    failed(attempt)
    for failures in range(1, RETRIES + 1):
        unreachable(corpus, out, lost, failures)
    code, err = ended(merge)
    assert code == 4, err
    gone = sorted(f"g{i}.json" for i in range(9) if shard_of(f"g{i}.json", SHARDS) == lost)
    m = merged(out)
    assert [i["graph"] for i in m["missing"]] == gone and m["verdict"] == "incomplete"
    assert sorted(m["passed"]) == sorted(f"g{i}.json" for i in range(9) if f"g{i}.json" not in gone)
    assert f"partial report: {9 - len(gone)} passed (" in err and f"; {len(gone)} missing (" in err
    assert f"{len(gone)} graph result(s) missing: " in err


def test_an_index_refused_for_good_settles_at_once(tmp_path, corpus):
    """Exit 2 (FailIndex: no retry) is the index's last attempt whatever its failure count."""
    out = tmp_path / "out"
    merge = start_merge(corpus, out)
    for i in range(1, SHARDS):
        assert shard(corpus, out, i).returncode == 0
    refused = shard(corpus, out, 0, 0, "--atol", "-1")
    assert refused.returncode == 2, refused.stderr
    code, err = ended(merge)
    assert code == 4 and all(i["shard"] == 0 for i in merged(out)["missing"]), err


def test_an_evicted_merge_writes_what_it_has_and_its_retry_completes(tmp_path, corpus):
    out = tmp_path / "out"
    assert shard(corpus, out, 0).returncode == 0
    merge = start_merge(corpus, out)
    assert "waiting up to 3600 s for every shard (or node) of the run to end" in merge.stderr.readline()
    merge.send_signal(signal.SIGTERM)  # evicted (DisruptionTarget): the Job retries it without counting
    code, err = ended(merge)
    assert code == 143, err
    assert "terminated while waiting (SIGTERM): merging what is there now" in err
    assert merged(out)["verdict"] == "incomplete" and merged(out)["missing"]
    retry = start_merge(corpus, out)
    for i in range(1, SHARDS):
        assert shard(corpus, out, i).returncode == 0
    code, err = ended(retry)
    assert code == 1 and merged(out)["missing"] == [], err


def test_wait_usage(capsys, tmp_path):
    from gradcheck_svc.cli import main

    assert main(["batch-merge", str(tmp_path), "--wait", "-1"]) == 2
    assert "--wait: must be 0 or more" in capsys.readouterr().err
    # nothing written and no time to wait: nothing to merge (exit 2), not a hang
    assert main(["batch-merge", str(tmp_path), "--wait", "0"]) == 2
