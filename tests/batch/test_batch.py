"""gradcheck-svc batch / batch-merge: sharding, atomic records, the time limit, exit codes, and the
merge's missing/duplicate detection (in-process calls of the real CLI)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from grpc_helpers import slow_graph
from slow_graphs import SLACK, unfinishable_graph
from gradcheck_client import save_graph
from gradcheck_svc.batch.generate import graph_dict, write_graphs
from gradcheck_svc.batch.manifest import load_manifest, shard_of
from gradcheck_svc.store.records import atomic_write
from gradcheck_svc.cli import main

RUN = Path("runs", "default")  # where a run without --run-id (or $GRADCHECK_RUN_ID) writes


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def corpus(tmp_path) -> Path:
    root = tmp_path / "graphs"
    write_graphs(root / "a", 6, size=3, kinds=lambda i: "mismatch" if i == 4 else "ok")
    write_graphs(root / "b", 5, size=3, kinds=lambda i: "invalid" if i == 1 else "ok")
    return root


def test_shards_partition_the_manifest_stably(tmp_path, corpus):
    m = load_manifest(str(corpus))
    assert len(m.graphs) == 11 and m.graphs[0] == "a/gen-00000.json"
    for n in (1, 2, 3, 7):
        shards = [m.shard(i, n) for i in range(n)]
        assert sorted(g for s in shards for g in s) == list(m.graphs)  # each graph in exactly one shard
    # a list file in another order, a glob, and the directory name the same graphs, the same way
    listing = tmp_path / "graphs" / "list.txt"
    listing.write_text("# reversed\n" + "\n".join(reversed(m.graphs)) + "\n")
    for spec in (str(listing), str(corpus / "**" / "*.json")):
        other = load_manifest(spec)
        assert other.graphs == m.graphs and other.root == m.root
        assert [other.shard(i, 3) for i in range(3)] == [m.shard(i, 3) for i in range(3)]
    # the hash is part of the contract: a rerun with a changed hash would redo or lose work
    # (documented: the first 64 bits of sha256 of the relative path, modulo the shard count)
    assert [shard_of("team-0/model-000.json", 4), shard_of("a/gen-00000.json", 7)] == [1, 5]
    assert shard_of("x/y.pb", 5) == int(hashlib.sha256(b"x/y.pb").hexdigest()[:16], 16) % 5


def test_atomic_write_replaces_whole_files(tmp_path):
    target = tmp_path / "r.json"
    atomic_write(target, b'{"v": 1}')
    atomic_write(target, b'{"v": 2}')
    assert json.loads(target.read_text()) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_batch_records_results_and_restart_skips_done(capsys, tmp_path, corpus):
    out = tmp_path / "out"
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out)
    assert code == 0, err
    assert "shard 0/1: 11 graphs, 0 already done, 11 to verify (in-process; run default)" in err
    assert "shard 0/1: finished: 9 pass, 1 fail, 1 invalid" in err
    records = {json.loads(p.read_text())["graph"]: json.loads(p.read_text())
               for p in (out / RUN / "shard-0000" / "results").glob("*.json")}
    assert records["a/gen-00004.json"]["status"] == "fail"
    assert records["b/gen-00001.json"]["error"] == "node 'bogus': unknown op 'no_such_op'"
    ok = records["a/gen-00000.json"]
    assert ok["status"] == "pass" and ok["device"] == "cpu" and ok["dtype"] == "float64"
    assert set(ok["digests"]) == {"W", "b"} and ok["digest_scope"] == "full"
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out)
    assert code == 0 and "11 already done, 0 to verify" in err and "finished: 11 skipped" in err


def test_merge_names_missing_and_duplicated_graphs_exit_4(capsys, tmp_path, corpus):
    out = tmp_path / "out"
    for i in range(3):
        assert run(capsys, "batch", "--manifest", corpus, "--shard-index", i, "--shard-count", 3, "--out", out)[0] == 0
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 1 and "11 graphs: 9 pass, 1 fail, 1 invalid" in err  # complete; one graph failed

    victim = next((out / RUN / "shard-0001" / "results").glob("*.json"))
    lost = json.loads(victim.read_text())["graph"]
    twice = next((out / RUN / "shard-0002" / "results").glob("*.json"))
    doubled = json.loads(twice.read_text())["graph"]
    shutil.copy(twice, out / RUN / "shard-0000" / "results" / twice.name)
    victim.unlink()
    code, _, err = run(capsys, "batch-merge", out, "--json", tmp_path / "m.json")
    assert code == 4
    assert f"1 graph result(s) missing: {lost} (shard 1)" in err
    assert f"1 graph(s) present twice: {doubled} (shard-0000, shard-0002)" in err
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["missing"] == [{"graph": lost, "shard": 1, "why": "its shard finished (exit 0), yet no record "
                                  "answers the graph as it is now: changed or listed since, or its record removed; "
                                  "re-run the shard"}] and merged["exit_code"] == 4
    assert "missing: no result from shard 1" in (out / RUN / "junit.xml").read_text()


def test_all_passing_merge_exits_0(capsys, tmp_path):
    """Also: a local volume may hold a file whose name is not UTF-8 (os hands its bytes over as surrogates, which
    no key, record or report can encode: the shard and the merge ended in an internal error, exit 3, losing
    every graph). It is one graph like any other, named with each such byte written \\xNN."""
    write_graphs(tmp_path / "g", 2, size=2)
    shutil.copy(tmp_path / "g" / "gen-00000.json", tmp_path / "g" / os.fsdecode(b"caf\xe9.json"))  # Latin-1
    out = tmp_path / "out"
    assert run(capsys, "batch", "--manifest", tmp_path / "g", "--shard-index", 0, "--out", out)[0] == 0
    code, _, err = run(capsys, "batch-merge", out, "--manifest", tmp_path / "g")
    assert code == 0 and "3 graphs: 3 pass (exit 0)" in err, err
    merged = json.loads((out / RUN / "merged.json").read_text())
    assert sorted(r["graph"] for r in merged["records"]) == ["caf\\xe9.json", "gen-00000.json", "gen-00001.json"]
    assert "caf\\xe9.json" in (out / RUN / "junit.xml").read_text()


def test_per_graph_time_limit(capsys, tmp_path):
    g = tmp_path / "g"
    g.mkdir()
    save_graph(slow_graph(width=96), g / "slow.json")  # tens of seconds of finite differences
    (g / "quick.json").write_text(json.dumps(graph_dict(0, size=2)))
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", tmp_path / "out",
                       "--fd", "full", "--time-limit", "1")
    assert code == 0, err
    records = [json.loads(p.read_text()) for p in (tmp_path / "out" / RUN / "shard-0000" / "results").glob("*.json")]
    status = {r["graph"]: r for r in records}
    # the status says the limit stopped it; the seconds, that it stopped soon after (generously: a loaded
    # machine took 6 s to wind down once, against tens of seconds for the whole run)
    assert status["slow.json"]["status"] == "timeout" and status["slow.json"]["seconds"] < 15
    assert status["slow.json"]["error"] == "over the per-graph time limit of 1 s (raise it with --time-limit)"
    assert status["quick.json"]["status"] == "pass"  # the shard carried on after the timeout


LIMIT = 2.0  # seconds


def test_max_request_seconds_stops_one_long_call_and_fails_that_graph_only(capsys, tmp_path):
    """--max-request-seconds is the per-graph limit in-process (when lower than --time-limit): a graph inside one
    long C call is stopped at it (its verification runs in a child killed at the limit), recorded `timeout`
    naming the limit and its flag; the shard goes on with its other graphs and exits 0; the merge fails it."""
    import time

    g = tmp_path / "g"
    write_graphs(g, 3, size=2)
    (g / "einsum8.json").write_text(json.dumps(unfinishable_graph()))  # sorts first: the others come after it
    out = tmp_path / "out"
    start = time.monotonic()
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out,
                       "--max-request-seconds", LIMIT)
    seconds = time.monotonic() - start
    assert code == 0, err
    assert seconds < LIMIT + SLACK, err  # unbounded, the einsum alone runs for minutes
    status = {r["graph"]: r for r in _records(out / RUN / "shard-0000")}
    assert status["einsum8.json"]["status"] == "timeout"
    assert status["einsum8.json"]["error"] == "over the per-graph time limit of 2 s (raise it with --max-request-seconds)"
    assert LIMIT <= status["einsum8.json"]["seconds"] < LIMIT + SLACK
    assert sorted((r, s["status"]) for r, s in status.items() if r != "einsum8.json") == [
        ("gen-00000.json", "pass"), ("gen-00001.json", "pass"), ("gen-00002.json", "pass")]
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 1 and "4 graphs: 3 pass, 1 timeout (exit 1)" in err
    assert json.loads((out / RUN / "merged.json").read_text())["failed"] == ["einsum8.json"]
    # a --time-limit below it is the one in force, and named
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", tmp_path / "out2",
                       "--max-request-seconds", 60, "--time-limit", LIMIT)
    assert code == 0, err
    status = {r["graph"]: r for r in _records(tmp_path / "out2" / RUN / "shard-0000")}
    assert status["einsum8.json"]["error"] == "over the per-graph time limit of 2 s (raise it with --time-limit)"
    assert [s["status"] for r, s in sorted(status.items()) if r != "einsum8.json"] == ["pass"] * 3


def test_a_screen_stops_a_graph_at_max_request_seconds(capsys, tmp_path):
    """The screen's suite goes through the same verifier: the unfinishable example is a timeout, the
    generated graph after it passes, the node's screen exits 0."""
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "einsum8.json").write_text(json.dumps(unfinishable_graph()))
    out = tmp_path / "out"
    code, _, err = run(capsys, "screen", "--out", out, "--examples", examples, "--generated", 1, "--size", 2,
                       "--node-name", "node-a", "--max-request-seconds", LIMIT)
    assert code == 0, err
    status = {r["graph"]: (r["status"], r["error"]) for r in _records(out / RUN / "node-node-a")}
    assert status == {"examples/einsum8.json": ("timeout", "over the per-graph time limit of 2 s (raise it with "
                                                           "--max-request-seconds)"),
                      "generated/gen-00000.json": ("pass", None)}


@pytest.mark.parametrize("argv, env, needle", [
    (["--shard-index", "4", "--shard-count", "4"], {}, "--shard-index: 4 is not in 0..3"),
    ([], {}, "--shard-index: not given and $JOB_COMPLETION_INDEX is not set"),
    ([], {"JOB_COMPLETION_INDEX": "x"}, "--shard-index: $JOB_COMPLETION_INDEX 'x' is not an integer"),
    (["--shard-index", "0", "--shard-count", "0"], {}, "--shard-count: must be at least 1"),
    (["--shard-index", "0", "--time-limit", "nan"], {}, "--time-limit: must be positive"),
    (["--shard-index", "0", "--time-limit", "inf"], {}, "--time-limit: must be at most 1000000"),
    (["--shard-index", "0", "--fault", "z:melt"], {}, "fault: unknown fault kind 'melt'"),
    # every option is checked before a graph is read (not an "invalid" record per graph)
    (["--shard-index", "0", "--checkpoint", "every:0"], {}, "--checkpoint: 'every:0': every:K needs a positive"),
    (["--shard-index", "0", "--atol", "-1"], {}, "--atol: -1.0 is not a finite number >= 0"),
    (["--shard-index", "0", "--directions", "99999"], {}, "--directions: 99999 is over the limit of 4096"),
])
def test_bad_usage_exits_2_one_line(capsys, monkeypatch, tmp_path, corpus, argv, env, needle):
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--out", tmp_path / "out", *argv)
    assert code == 2 and err == f"gradcheck-svc: error: {needle}" + err.split(needle, 1)[1]
    assert needle in err and len(err.strip().splitlines()) == 1


def test_missing_manifest_and_merge_dir_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, "batch", "--manifest", tmp_path / "nope", "--shard-index", 0, "--out", tmp_path)
    assert code == 2 and err.startswith("gradcheck-svc: error: --manifest: no such file, directory or matching glob")
    (tmp_path / "empty").mkdir()  # a graphs volume mounted empty (or not yet populated): retried, exit 75
    code, _, err = run(capsys, "batch", "--manifest", tmp_path / "empty", "--shard-index", 0, "--out", tmp_path)
    assert code == 75 and err == (f"gradcheck-svc batch: infrastructure failure, retry (exit 75): no graphs (*.json, "
                                  f"*.pb, *.onnx) in {tmp_path / 'empty'}: an empty volume (not mounted, or not yet "
                                  "populated?)\n")
    code, _, err = run(capsys, "batch", "--manifest", tmp_path / "empty" / "*.json", "--shard-index", 0, "--out",
                       tmp_path)
    assert code == 2 and "--manifest: no graphs (*.json, *.pb, *.onnx) in" in err  # a glob naming nothing
    (tmp_path / "list.txt").write_text("# graphs\nempty/missing.json\n")
    code, _, err = run(capsys, "batch", "--manifest", tmp_path / "list.txt", "--shard-index", 0, "--out", tmp_path)
    assert code == 2 and f"--manifest: list file {tmp_path / 'list.txt'}, line 2: no such graph file: " \
        "empty/missing.json" in err
    code, _, err = run(capsys, "batch-merge", tmp_path / "empty")
    assert code == 2 and "DIR: no batch results in" in err and len(err.splitlines()) == 1


def test_infrastructure_failures_exit_75(capsys, tmp_path, corpus):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")  # the results volume is unusable (root ignores permissions)
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", blocked)
    assert code == 75 and "infrastructure failure, retry (exit 75)" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", tmp_path / "o",
                       "--server", "127.0.0.1:1")
    assert code == 75 and "server 127.0.0.1:1: UNAVAILABLE" in err


def test_client_balances_dns_targets_round_robin():
    """dns:///gradcheck-headless:50051 must spread calls over the replicas, not pin one connection."""
    from gradcheck_client import Client

    with Client("dns:///127.0.0.1:1") as c:
        assert ("grpc.lb_policy_name", "round_robin") in c._options
    with Client("127.0.0.1:1") as c:
        assert all(k != "grpc.lb_policy_name" for k, _ in c._options)


def test_server_token_refused_is_a_configuration_error(capsys, monkeypatch, tmp_path, corpus):
    """A wrong token is exit 2 (FailIndex: no retry helps), said once, before any graph is recorded."""
    from grpc_helpers import ServerProcess

    monkeypatch.delenv("GRADCHECK_TOKEN", raising=False)
    with ServerProcess("--workers", "1", env={"GRADCHECK_TOKEN": "s3cret"}) as server:
        out = tmp_path / "out"
        code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out,
                           "--server", server.target)
        assert code == 2 and err.startswith("gradcheck-svc: error: --token-file: the server refused the token")
        results = out / RUN / "shard-0000" / "results"
        assert not results.exists() or not any(results.iterdir())
        monkeypatch.setenv("GRADCHECK_TOKEN", "s3cret")
        code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out,
                           "--server", server.target)
        assert code == 0 and "finished: 9 pass, 1 fail, 1 invalid" in err


def test_a_server_with_raised_limits_decides_them(capsys, tmp_path, corpus):
    """--directions over the default cap is refused up front in-process (above), but a server started
    with a higher --max-directions accepts it: the batch leaves limits to the server it talks to."""
    from grpc_helpers import ServerProcess

    with ServerProcess("--workers", "1", "--max-directions", "8192") as server:
        code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", tmp_path / "out",
                           "--server", server.target, "--directions", "5000", "--fd", "projection")
    assert code == 0 and "finished: 9 pass, 1 fail, 1 invalid" in err


def test_unreadable_graph_volume_exits_75_and_the_retry_keeps_what_was_done(capsys, tmp_path, corpus):
    """A real EIO (a link to /proc/self/mem reads as an I/O error): the volume's fault, not the graph's.
    The shard stops with 75 for the Job to retry; what it finished before stays, and the retry skips it."""
    (corpus / "bad.json").symlink_to("/proc/self/mem")  # sorts after a/ and b/: 11 graphs come first
    out = tmp_path / "out"
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out)
    assert code == 75
    assert err.splitlines()[-1].startswith("gradcheck-svc batch: infrastructure failure, retry (exit 75): ")
    assert err.splitlines()[-1].endswith("bad.json: cannot read: Input/output error")
    assert len(list((out / RUN / "shard-0000" / "results").glob("*.json"))) == 11
    (corpus / "bad.json").unlink()  # the volume is back
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out)
    assert code == 0 and "11 already done, 0 to verify" in err


def _batch_under_memory_limit(tmp_path, manifest, out, limit_bytes):
    import resource
    import subprocess
    import sys

    from grpc_helpers import ROOT, _env

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    code = ("import sys; from gradcheck_svc.cli import main; rc = main(sys.argv[1:]); "
            "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmPeak')][0]); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, "batch", "--manifest", str(manifest), "--shard-index", "0",
                           "--out", str(out)], preexec_fn=cap if limit_bytes else None, capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=_env({"OPENBLAS_NUM_THREADS": "1"}))


def test_out_of_memory_exits_75_after_keeping_what_was_done(tmp_path):
    """A process memory cap (RLIMIT_AS, as a container's limit) hit inside a verification: exit 75 for the
    Job to retry (on a bigger node, or after raising the limit), with the graphs before it recorded."""
    g = tmp_path / "g"
    g.mkdir()
    (g / "a-small.json").write_text(json.dumps(graph_dict(0, size=2)))
    baseline = _batch_under_memory_limit(tmp_path, g, tmp_path / "probe", 0)  # the run's own peak, no cap
    assert baseline.returncode == 0, baseline.stderr
    peak = int(baseline.stdout.split()[-1]) * 1024
    big = {"name": "big", "opsetVersion": 1, "inputs": [{"name": "w", "value": {"data": [0.5]}, "requiresGrad": True}],
           "nodes": [{"name": "b", "op": "broadcast_to", "inputs": ["w"], "attrs": {"shape": [2200, 2200]}},
                     {"name": "t", "op": "tanh", "inputs": ["b"]}, {"name": "L", "op": "sum", "inputs": ["t"]}],
           "output": "L"}  # 4.8 million elements: each of its tensors is 39 MB
    (g / "b-big.json").write_text(json.dumps(big))
    out = tmp_path / "out"
    run_ = _batch_under_memory_limit(tmp_path, g, out, peak + 100 * 2**20)
    assert run_.returncode == 75, run_.stderr
    assert run_.stderr.splitlines()[-1] == "gradcheck-svc batch: infrastructure failure, retry (exit 75): out of memory"
    records = [json.loads(p.read_text()) for p in (out / RUN / "shard-0000" / "results").glob("*.json")]
    assert [(r["graph"], r["status"]) for r in records] == [("a-small.json", "pass")]


def test_in_process_batch_honours_allow_nonfinite(capsys, tmp_path):
    """The shard verifies through the server's own request path: NaN input data is refused as
    invalid unless --allow-nonfinite, which then names the input as the origin (a fail)."""
    g = tmp_path / "g"
    g.mkdir()
    data = graph_dict(0, size=2)
    first = data["inputs"][0]
    first["value"]["data"] = [float("nan")] * len(first["value"]["data"])
    (g / "nan.json").write_text(json.dumps(data).replace("NaN", '"NaN"'))
    status = {}
    for flag in ((), ("--allow-nonfinite",)):
        out = tmp_path / f"out{len(flag)}"
        assert run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out, *flag)[0] == 0
        [record] = [json.loads(p.read_text()) for p in (out / RUN / "shard-0000" / "results").glob("*.json")]
        status[bool(flag)] = record["status"]
    assert status == {False: "invalid", True: "fail"}


# --- results that cannot be stale: content, options and version key every record; runs are apart -------

def _records(unit_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (unit_dir / "results").glob("*.json")]


def test_a_replaced_graph_is_verified_again_not_reported_from_its_old_record(capsys, tmp_path, corpus):
    out = tmp_path / "out"
    assert run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out)[0] == 0
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 1 and "11 graphs: 9 pass, 1 fail, 1 invalid" in err
    # the author replaces a passing graph by one whose derivative is wrong, under the same name
    (corpus / "a" / "gen-00000.json").write_text(json.dumps(graph_dict(0, size=3, kind="mismatch")))
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out)
    assert code == 0 and "11 graphs, 10 already done, 1 to verify" in err
    assert "[1/1] fail    a/gen-00000.json" in err
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 1 and "11 graphs: 8 pass, 2 fail, 1 invalid" in err
    merged = json.loads((out / RUN / "merged.json").read_text())
    assert "a/gen-00000.json" in merged["failed"] and merged["stale_records"] == 1  # the old answer, left out
    new = hashlib.sha256((corpus / "a" / "gen-00000.json").read_bytes()).hexdigest()
    assert next(r for r in merged["records"] if r["graph"] == "a/gen-00000.json")["graph_sha256"] == new


def test_changed_options_are_verified_again_and_mixed_options_refused(capsys, tmp_path, corpus):
    out = tmp_path / "out"
    for i in range(3):
        assert run(capsys, "batch", "--manifest", corpus, "--shard-index", i, "--shard-count", 3, "--out", out)[0] == 0
    n1 = len(_records(out / RUN / "shard-0001"))
    loose = ("--atol", "1e6", "--rtol", "1e6", "--symbolic", "off")
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 1, "--shard-count", 3, "--out", out,
                       *loose)
    assert code == 0 and f"{n1} graphs, 0 already done, {n1} to verify" in err  # nothing reused across options
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 4
    (line,) = [ln for ln in err.splitlines() if "different options" in ln]
    assert "refused (--allow-mixed merges them): shard-0000, shard-0002: options " in line
    assert "; shard-0001: options " in line and line.endswith("(they differ in: atol, rtol, symbolic)")
    merged = json.loads((out / RUN / "merged.json").read_text())
    assert [g["units"] for g in merged["mixed"]] == [["shard-0000", "shard-0002"], ["shard-0001"]]
    assert merged["mixed"][1]["keyed_options"] == {"atol": 1e6, "rtol": 1e6, "symbolic": False, "time_limit": 300.0}
    assert merged["options"] is None  # no single set of options describes these results
    code, _, err = run(capsys, "batch-merge", out, "--allow-mixed")
    assert code in (0, 1) and "merged anyway (--allow-mixed)" in err and "(exit 4)" not in err
    # back to the batch's options: the earlier answers still hold (their key is theirs), nothing re-verified
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 1, "--shard-count", 3, "--out", out)
    assert code == 0 and f"{n1} already done, 0 to verify" in err
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 1 and "11 graphs: 9 pass, 1 fail, 1 invalid (exit 1)" in err


def test_a_killed_rerun_under_new_options_leaves_old_answers_unused(capsys, tmp_path, corpus):
    """The shard re-runs with other options and dies part-way (its last records never written): the graphs
    answered only under the old options are refused, named, until --allow-mixed or a finished re-run."""
    out = tmp_path / "out"
    assert run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out)[0] == 0
    assert run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out, "--seed", "7")[0] == 0
    unit = out / RUN / "shard-0000"
    newer = sorted(_records(unit), key=lambda r: r["finished_at"])[-2:]  # the re-run's last two: never written
    from gradcheck_svc.store.records import key_of

    for r in newer:
        (unit / "results" / f"{key_of(r)}.json").unlink()
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 4
    lost = sorted(r["graph"] for r in newer)
    assert (f"2 graph(s) answered only under other options or another version (re-run their shard, or "
            f"--allow-mixed): {lost[0]} (shard-0000), {lost[1]} (shard-0000)") in err
    code, _, err = run(capsys, "batch-merge", out, "--allow-mixed")
    assert code == 1 and "11 graphs: 9 pass, 1 fail, 1 invalid (exit 1)" in err
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--out", out, "--seed", "7")
    assert code == 0 and "9 already done, 2 to verify" in err
    assert run(capsys, "batch-merge", out)[0] == 1


def test_a_new_gradcheck_version_is_verified_again_and_not_mixed(capsys, monkeypatch, tmp_path, corpus):
    import gradcheck_svc

    out = tmp_path / "out"
    for i in range(2):
        assert run(capsys, "batch", "--manifest", corpus, "--shard-index", i, "--shard-count", 2, "--out", out)[0] == 0
    plan = json.loads((out / RUN / "shard-0000" / "unit.json").read_text())
    assert plan["gradcheck_version"].startswith(gradcheck_svc.__version__ + "+src.")
    monkeypatch.setattr(gradcheck_svc, "__version__", "9.9.9")  # the upgraded image's release
    code, _, err = run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--shard-count", 2, "--out", out)
    assert code == 0 and ", 0 already done, " in err
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 4 and "(they differ in: gradcheck version)" in err and "gradcheck 9.9.9+src." in err


def test_runs_are_kept_apart_and_latest_is_explicit(capsys, monkeypatch, tmp_path):
    write_graphs(tmp_path / "g", 3, size=2)
    out = tmp_path / "out"
    monkeypatch.delenv("GRADCHECK_RUN_ID", raising=False)
    assert run(capsys, "batch", "--manifest", tmp_path / "g", "--shard-index", 0, "--out", out,
               "--run-id", "nightly-1")[0] == 0
    monkeypatch.setenv("GRADCHECK_RUN_ID", "nightly-2")  # as the Job sets it from its name (downward API)
    code, _, err = run(capsys, "batch", "--manifest", tmp_path / "g", "--shard-index", 0, "--out", out)
    assert code == 0 and "0 already done, 3 to verify (in-process; run nightly-2)" in err
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["nightly-1", "nightly-2"]
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 2 and err.strip() == (f"gradcheck-svc: error: --run-id: {out} holds 2 runs (nightly-1, "
                                         "nightly-2): name one, or 'latest'")
    code, _, err = run(capsys, "batch-merge", out, "--run-id", "latest")
    assert code == 0 and "run nightly-2: 1 unit(s)" in err
    assert json.loads((out / "runs" / "nightly-2" / "merged.json").read_text())["run_id"] == "nightly-2"
    assert not (out / "runs" / "nightly-1" / "merged.json").exists()
    code, _, err = run(capsys, "batch-merge", out, "--run-id", "nightly-1")
    assert code == 0 and (out / "runs" / "nightly-1" / "merged.json").is_file()
    code, _, err = run(capsys, "batch-merge", out, "--run-id", "nightly-3")
    assert code == 2 and "--run-id: no run 'nightly-3' in" in err
    # a run ID names the Job: a DNS label, short enough for every name made from it (<run>-shards-0-<index>)
    for bad in ("../up", "latest", "", "a/b", "Nightly", "a_b", "a.b", "-a", "a-", "x" * 47):
        code, _, err = run(capsys, "batch", "--manifest", tmp_path / "g", "--shard-index", 0, "--out", out,
                           f"--run-id={bad}")
        assert code == 2 and f"--run-id: '{bad}' is not a run ID: it names the Job, so a DNS label" in err
    assert run(capsys, "batch", "--manifest", tmp_path / "g", "--shard-index", 0, "--out", out,
               "--run-id", "x" * 46)[0] == 0


def test_exit_zero_reports_the_verdict_without_failing(capsys, tmp_path, corpus):
    """The merge Job's mode: it succeeds once the report is written; the verdict is in the log, merged.json
    and the verdict file (the pod's termination message)."""
    out = tmp_path / "out"
    assert run(capsys, "batch", "--manifest", corpus, "--shard-index", 0, "--shard-count", 2, "--out", out)[0] == 0
    verdict = tmp_path / "termination-log"
    code, _, err = run(capsys, "batch-merge", out, "--exit-zero", "--verdict-file", verdict)
    assert code == 0 and err.splitlines()[-1].endswith("(exit 4)")  # shard 1 never ran
    assert verdict.read_text().startswith("incomplete: run default: 11 graphs: ")
    assert json.loads((out / RUN / "merged.json").read_text())["verdict"] == "incomplete"
    assert run(capsys, "batch", "--manifest", corpus, "--shard-index", 1, "--shard-count", 2, "--out", out)[0] == 0
    code, _, _ = run(capsys, "batch-merge", out, "--exit-zero", "--verdict-file", verdict)
    assert code == 0 and verdict.read_text() == "fail: run default: 11 graphs: 9 pass, 1 fail, 1 invalid\n"
    code, _, err = run(capsys, "batch-merge", tmp_path / "nowhere", "--exit-zero")
    assert code == 2 and "DIR: not a directory" in err  # nothing written: not a success


# --- ONNX models in a manifest; the limit flags of `verify` ------------------------------------------

def _tiny_onnx(path: Path) -> None:
    onnx = pytest.importorskip("onnx", reason="the optional 'onnx' extra is not installed")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
                              "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_onnx_models_in_a_manifest_are_imported_with_the_batch_flags(capsys, tmp_path):
    g = tmp_path / "g"
    g.mkdir()
    _tiny_onnx(g / "tiny.onnx")
    (g / "graph.json").write_text(json.dumps(graph_dict(0, size=2)))
    (g / "broken.onnx").write_bytes(b"not a model")
    out = tmp_path / "out"
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out)
    assert code == 0 and "3 graphs, 0 already done, 3 to verify" in err
    records = {r["graph"]: r for r in _records(out / RUN / "shard-0000")}
    assert records["tiny.onnx"]["status"] == "pass" and set(records["tiny.onnx"]["digests"]) == {"W"}
    assert records["broken.onnx"]["status"] == "invalid" and records["graph.json"]["status"] == "pass"
    # how a model is imported shapes its answer: other import flags, verified again
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out, "--params", "inputs")
    assert code == 0 and "3 graphs, 0 already done, 3 to verify" in err
    tiny = [r for r in _records(out / RUN / "shard-0000") if r["graph"] == "tiny.onnx"]
    assert sorted(sorted(r["digests"]) for r in tiny) == [["W"], ["x"]]


def test_batch_takes_the_limit_flags_of_verify(capsys, tmp_path):
    g = tmp_path / "g"
    g.mkdir()
    (g / "graph.json").write_text(json.dumps(graph_dict(0, size=2)))  # 5 nodes
    out = tmp_path / "out"
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out, "--max-nodes", "3")
    assert code == 0
    [record] = _records(out / RUN / "shard-0000")
    assert record["status"] == "invalid" and record["error"] == "nodes: graph has 5 nodes, the limit is 3"
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out, "--max-message-bytes", "64")
    assert code == 0 and "0 already done, 1 to verify" in err  # a limit is part of the question
    [record] = [r for r in _records(out / RUN / "shard-0000") if r["options_sha256"] != record["options_sha256"]]
    assert record["status"] == "invalid" and record["error"].endswith(
        "over the limit of 64 (raise it with --max-message-bytes)")
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out, "--max-nodes", "0")
    assert code == 2 and "--max-nodes: must be positive" in err
    code, _, err = run(capsys, "batch", "--manifest", g, "--shard-index", 0, "--out", out, "--max-nodes", "3",
                       "--server", "127.0.0.1:1")
    assert code == 2 and err.strip() == ("gradcheck-svc: error: --max-nodes: applies in-process only: with --server, "
                                         "the server's own limits apply")
    code, _, err = run(capsys, "screen", "--out", out, "--examples", "none", "--generated", "1", "--size", "2",
                       "--max-nodes", "3")
    assert code == 0
    [record] = _records(out / RUN / f"node-{__import__('socket').gethostname()}")
    assert record["status"] == "invalid" and record["error"] == "nodes: graph has 5 nodes, the limit is 3"


def test_a_screen_node_rerun_under_new_options_is_named_for_that_node_only(capsys, tmp_path):
    out = tmp_path / "out"
    suite = ("--examples", "none", "--generated", "3", "--size", "2")
    for node in ("node-a", "node-b"):
        assert run(capsys, "screen", "--out", out, *suite, "--node-name", node)[0] == 0
    assert run(capsys, "screen", "--out", out, *suite, "--node-name", "node-a", "--seed", "7")[0] == 0
    unit = out / RUN / "node-node-a"
    from gradcheck_svc.store.records import key_of

    last = sorted(_records(unit), key=lambda r: r["finished_at"])[-1]  # as if killed before writing it
    (unit / "results" / f"{key_of(last)}.json").unlink()
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 4 and "graph result(s) missing" not in err  # node-b has every graph; node-a is waiting
    assert (f"1 graph(s) answered only under other options or another version (re-run their shard, or "
            f"--allow-mixed): {last['graph']} (node-node-a)") in err
    assert "differ in: seed" in err  # and the two nodes ran under different options
    code, _, err = run(capsys, "batch-merge", out, "--allow-mixed")
    assert code == 0 and "3 graphs on each of 2 node(s): node-a: 3 pass; node-b: 3 pass (exit 0)" in err  # per node
