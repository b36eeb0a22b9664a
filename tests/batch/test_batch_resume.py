"""Resumes that converge (batch-merge's current plan): a graph removed or renamed, or the shard count changed,
and the run resumed under its ID -- the merge ends complete, each graph counted once, and says what it set
aside (in-process calls of the real CLI on a local results directory; tests/batch/test_batch_s3.py does the same
in a bucket)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcheck_svc.batch.generate import graph_dict, write_graphs
from gradcheck_svc.batch.manifest import shard_of
from gradcheck_svc.cli import main

RUN = Path("runs", "default")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def shards(capsys, corpus, out, count: int, indexes=None) -> str:
    err = ""
    for i in range(count) if indexes is None else indexes:
        code, _, e = run(capsys, "batch", "--manifest", corpus, "--shard-index", i, "--shard-count", count,
                         "--out", out)
        assert code == 0, e
        err += e
    return err


def merged(out: Path) -> dict:
    return json.loads((out / RUN / "merged.json").read_text())


@pytest.fixture
def corpus(tmp_path) -> Path:
    root = tmp_path / "graphs"
    write_graphs(root, 8, size=2)
    return root


@pytest.mark.parametrize("with_manifest", [False, True])
def test_a_removed_graph_is_set_aside_and_the_resume_converges(capsys, tmp_path, corpus, with_manifest):
    out = tmp_path / "out"
    shards(capsys, corpus, out, 2)
    gone = "gen-00003.json"
    (corpus / gone).unlink()
    extra = ("--manifest", corpus) if with_manifest else ()
    if with_manifest:  # the merge reads the graph set itself: the removal shows before any shard re-ran
        code, _, err = run(capsys, "batch-merge", out, *extra)
        assert code == 0 and "7 graphs: 7 pass (exit 0)" in err
    shards(capsys, corpus, out, 2)  # resumed under the same run ID: nothing to verify
    code, _, err = run(capsys, "batch-merge", out, *extra)
    assert code == 0, err
    assert "7 graphs: 7 pass (exit 0)" in err
    assert f"set aside (superseded): records of 1 graph(s) no longer in the manifest: {gone}; " in err
    m = merged(out)
    assert m["superseded"] == {"graphs": [gone], "records": 1, "units": []}
    assert m["graphs"] == 7 and len(m["records"]) == 7 and gone not in {r["graph"] for r in m["records"]}
    assert m["unexpected"] == [] and m["missing"] == [] and m["exit_code"] == 0
    assert sorted(m["passed"]) == sorted(p.name for p in corpus.iterdir())


def test_a_renamed_graph_is_verified_under_its_new_name(capsys, tmp_path, corpus):
    out = tmp_path / "out"
    shards(capsys, corpus, out, 2)
    (corpus / "gen-00001.json").rename(corpus / "renamed.json")
    code, _, err = run(capsys, "batch-merge", out, "--manifest", corpus)
    assert code == 4 and "1 graph result(s) missing: renamed.json (shard " in err  # not yet verified: named
    err = shards(capsys, corpus, out, 2)
    assert "[1/1] pass    renamed.json" in err  # the only graph verified again
    code, _, err = run(capsys, "batch-merge", out, "--manifest", corpus)
    assert code == 0 and "8 graphs: 8 pass (exit 0)" in err and "no longer in the manifest: gen-00001.json" in err


@pytest.mark.parametrize("before, after", [(4, 2), (2, 4), (3, 1)])
def test_a_changed_shard_count_resumes_cleanly(capsys, tmp_path, corpus, before, after):
    """Resumed with another shard count (settings.yaml's `shards` changed, same run ID): the old units and
    the new are in one run; the merge counts every graph once, sets the old count's units aside and names
    them -- never "8 graphs: 16 pass", never a stale unit keeping the run incomplete."""
    out = tmp_path / "out"
    shards(capsys, corpus, out, before)
    shards(capsys, corpus, out, after)
    code, _, err = run(capsys, "batch-merge", out, "--shard-count", after)
    assert code == 0, err
    assert "8 graphs: 8 pass (exit 0)" in err
    m = merged(out)
    assert len(m["records"]) == 8 and m["duplicates"] == [] and m["inconsistent_units"] == []
    old = [{"unit": f"shard-{i:04d}", "shard_count": before} for i in range(after, before)]
    assert m["superseded"]["units"] == old and m["shard_count"] == after
    if old:
        assert f"unit(s) made with another shard count than {after}: shard-{after:04d} ({before} shards)" in err
    assert sorted(r["graph"] for r in m["records"]) == sorted(p.name for p in corpus.iterdir())
    # without --shard-count the newest units' count is the run's
    code, _, err = run(capsys, "batch-merge", out)
    assert code == 0 and merged(out)["shard_count"] == after


def test_a_half_resumed_shard_count_change_names_only_what_the_new_count_lacks(capsys, tmp_path, corpus):
    """2 -> 4 with only index 0 of the new count run: the graphs of indexes 1-3 are missing under the new plan
    (named with their new shard); with --manifest the old answers, to the same question, still count."""
    out = tmp_path / "out"
    shards(capsys, corpus, out, 2)
    shards(capsys, corpus, out, 4, indexes=[0])
    code, _, err = run(capsys, "batch-merge", out, "--shard-count", 4)
    lacking = sorted(g.name for g in corpus.iterdir() if shard_of(g.name, 4) != 0)
    assert code == 4 and f"{len(lacking)} graph result(s) missing: " in err
    assert {i["graph"] for i in merged(out)["missing"]} == set(lacking)
    assert all(i["shard"] == shard_of(i["graph"], 4) for i in merged(out)["missing"])
    code, _, err = run(capsys, "batch-merge", out, "--shard-count", 4, "--manifest", corpus)
    assert code == 0 and "8 graphs: 8 pass (exit 0)" in err


def test_the_merge_s_manifest_sees_a_graph_changed_after_the_shards_ran(capsys, tmp_path, corpus):
    """The merge re-run after a graph changed on the volume does not report the old answer: its content is
    read now, the old record is stale and the graph missing until its shard re-runs."""
    out = tmp_path / "out"
    shards(capsys, corpus, out, 2)
    (corpus / "gen-00002.json").write_text(json.dumps(graph_dict(2, size=2, kind="mismatch")))
    code, _, err = run(capsys, "batch-merge", out, "--manifest", corpus)
    assert code == 4 and f"1 graph result(s) missing: gen-00002.json (shard {shard_of('gen-00002.json', 2)})" in err
    assert merged(out)["stale_records"] == 1
    code, _, _ = run(capsys, "batch-merge", out)  # without it: what the shards recorded when they ran
    assert code == 0
    shards(capsys, corpus, out, 2)
    code, _, err = run(capsys, "batch-merge", out, "--manifest", corpus)
    assert code == 1 and "8 graphs: 7 pass, 1 fail (exit 1)" in err and merged(out)["failed"] == ["gen-00002.json"]


def test_merge_manifest_errors(capsys, tmp_path, corpus):
    out = tmp_path / "out"
    shards(capsys, corpus, out, 1)
    code, _, err = run(capsys, "batch-merge", out, "--manifest", tmp_path / "nope")
    assert code == 2 and err.startswith("gradcheck-svc: error: --manifest: no such file, directory or matching glob")


def test_a_timed_out_graph_is_verified_again_on_resume(capsys, tmp_path, corpus):
    """A time-out is retryable (a slow or crowded node, exit 75's meaning): the shard records it and goes on, and
    a resumed shard -- same run, same flags -- verifies that graph again instead of keeping the time-out as its
    answer; the graphs answered otherwise are kept. Once a retry finishes it, the merge reports the answer."""
    from gradcheck_client import save_graph
    from grpc_helpers import slow_graph

    save_graph(slow_graph(width=96), corpus / "slow.json")  # tens of seconds of full finite differences
    out = tmp_path / "out"
    flags = ("batch", "--manifest", corpus, "--shard-index", 0, "--out", out, "--fd", "full", "--time-limit", 1)
    code, _, err = run(capsys, *flags)
    assert code == 0 and "9 graphs, 0 already done, 9 to verify" in err, err
    results = out / RUN / "shard-0000" / "results"
    records = {json.loads(p.read_text())["graph"]: p for p in results.glob("*.json")}
    first = json.loads(records["slow.json"].read_text())
    assert first["status"] == "timeout"
    # resumed: only the time-out is verified again (here it times out again: the limit did not change)
    code, _, err = run(capsys, *flags)
    assert code == 0 and "9 graphs, 8 already done, 1 to verify" in err and "timeout slow.json" in err, err
    again = json.loads(records["slow.json"].read_text())
    assert again["status"] == "timeout" and again["finished_at"] != first["finished_at"]
    # a graph that timed out on a crowded node (its record as that attempt wrote it) is answered by the resume
    victim = records["gen-00003.json"]
    record = json.loads(victim.read_text())
    assert record["status"] == "pass"
    record.update(status="timeout", report=None, error="over the per-graph time limit of 1 s (raise it with "
                                                        "--time-limit)")
    victim.write_text(json.dumps(record))
    (corpus / "slow.json").unlink()  # the rest of the set, for the merge to pass
    code, _, err = run(capsys, *flags)
    assert code == 0 and "8 graphs, 7 already done, 1 to verify" in err and "pass    gen-00003.json" in err, err
    assert json.loads(victim.read_text())["status"] == "pass"
    code, _, err = run(capsys, "batch-merge", out, "--manifest", corpus)
    assert code == 0 and "8 graphs: 8 pass" in err, err
