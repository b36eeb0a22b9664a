"""A local Indexed Job: shard processes of `gradcheck-svc batch` with JOB_COMPLETION_INDEX set, as
Kubernetes runs them, over 120 generated graphs with planted mismatches and invalid graphs; one shard is
SIGKILLed mid-run and rerun; the merge must account for every graph exactly once. Then the same against a
running server (--server). The SIGKILLed shard is a real process; the others, the rerun and the merge are the
same commands forked from this process (tests/forked_cli.py), or real processes where they talk gRPC."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import forked_cli
from grpc_helpers import ROOT, ServerProcess, _env
from gradcheck_svc.batch.generate import graph_dict
from gradcheck_svc.batch.manifest import shard_of

# 120: 28 to 34 graphs a shard, so the victim's kill after 5 lands mid-run with 23 to spare; every kind of
# graph (pass, fail, invalid, truncated) several times in every shard
N_GRAPHS, SHARDS, VICTIM = 120, 4, 2
RUN = Path("runs", "default")

def make_corpus(root: Path) -> dict[str, str]:
    """N_GRAPHS graphs in three team folders; every 10th+3 a wrong user derivative (fail), every 10th+7 an unknown
    op (invalid), every 40th+11 truncated JSON (invalid). Returns relative path -> expected status."""
    expected = {}
    for i in range(N_GRAPHS):
        rel = f"team-{i % 3}/model-{i:03d}.json"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if i % 40 == 11:
            path.write_text('{"name": "truncated", "nodes": [')
            expected[rel] = "invalid"
            continue
        kind = "mismatch" if i % 10 == 3 else "invalid" if i % 10 == 7 else "ok"
        path.write_text(json.dumps(graph_dict(i, size=3, kind=kind)))
        expected[rel] = {"ok": "pass", "mismatch": "fail", "invalid": "invalid"}[kind]
    return expected

def batch_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["batch", "--manifest", str(corpus), "--shard-count", str(SHARDS), "--out", str(out), *extra]

def start_shard(index: int, corpus: Path, out: Path, *extra: str, real: bool = False):
    """A pod of the Job: a real process (`real`, or one talking gRPC), else the command forked."""
    env = _env({"JOB_COMPLETION_INDEX": str(index)})
    if real or "--server" in extra:
        return subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", *batch_args(corpus, out, *extra)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    return forked_cli.Forked("gradcheck_svc.cli", batch_args(corpus, out, *extra), env=env, cwd=ROOT, timeout=300)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m gradcheck_svc.cli ARGS`, forked (a real process where it talks gRPC)."""
    return forked_cli.run("gradcheck_svc.cli", *args, env=_env(env), cwd=ROOT, timeout=300)

def verified(stderr: str) -> list[str]:
    """The graphs a shard's progress lines say it verified (each line is printed after the record's rename)."""
    return re.findall(r"\] \w+\s+(\S+) \(", stderr)

def run_job(tmp_path: Path, *extra: str) -> None:
    corpus, out = tmp_path / "graphs", tmp_path / "results"
    expected = make_corpus(corpus)
    mine = {i: sorted(g for g in expected if shard_of(g, SHARDS) == i) for i in range(SHARDS)}
    assert all(len(v) > 20 for v in mine.values())

    others = [start_shard(i, corpus, out, *extra) for i in range(SHARDS) if i != VICTIM]
    victim = start_shard(VICTIM, corpus, out, *extra, real=True)  # SIGKILLed: a real process
    lines = []
    for line in victim.stderr:  # kill it once it has finished 5 graphs: mid-run, as the OOM killer would
        lines.append(line)
        if len(verified("".join(lines))) == 5:
            victim.send_signal(signal.SIGKILL)
            break
    lines.append(victim.stderr.read())
    assert victim.wait(timeout=60) == -signal.SIGKILL
    first = verified("".join(lines))
    on_disk = list((out / RUN / f"shard-{VICTIM:04d}" / "results").glob("*.json"))
    assert 5 <= len(on_disk) < len(mine[VICTIM]), "the kill must land mid-run"
    # a write cut short by the kill leaves at most a temporary file, which nothing may read as a result
    (out / RUN / f"shard-{VICTIM:04d}" / "results" / ".deadbeef.json.999.tmp").write_text('{"graph": "team-0/')

    for p in others:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err  # mismatches and invalid graphs are results: exit 0
    rerun = cli(*batch_args(corpus, out, *extra), env={"JOB_COMPLETION_INDEX": str(VICTIM)})
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(on_disk)} already done" in rerun.stderr
    second = verified(rerun.stderr)
    # restarted, the shard verifies exactly what the killed run had not finished
    assert len(on_disk) == len(first) or len(on_disk) == len(first) + 1  # +1: killed between rename and print
    assert set(first).isdisjoint(second) and sorted(set(first) | set(second)) == mine[VICTIM]
    assert not list((out / RUN / f"shard-{VICTIM:04d}" / "results").glob(".*.tmp"))

    merge = cli("batch-merge", str(out))
    assert merge.returncode == 1, merge.stderr  # planted mismatches: exit 1
    merged = json.loads((out / RUN / "merged.json").read_text())
    assert merged["missing"] == [] and merged["duplicates"] == [] and merged["unexpected"] == []
    got = [r["graph"] for r in merged["records"]]
    assert sorted(got) == sorted(expected) and len(got) == len(set(got)) == N_GRAPHS
    assert {r["graph"]: r["status"] for r in merged["records"]} == expected
    for r in merged["records"]:
        assert r["shard_index"] == shard_of(r["graph"], SHARDS) and r["unit"] == f"shard-{r['shard_index']:04d}"
    counts = {s: list(expected.values()).count(s) for s in ("pass", "fail", "invalid")}
    assert {k: merged["counts"][k] for k in counts} == counts and counts["fail"] == N_GRAPHS // 10
    assert sorted(merged["failed"]) == sorted(g for g, s in expected.items() if s != "pass")
    fails = [r for r in merged["records"] if r["status"] == "fail"]
    assert all(any(f["cause"] == "rule_error" and f["node"] == "act" for f in r["report"]["findings"]) for r in fails)
    assert all("unknown op 'no_such_op'" in r["error"] or "not a valid" in r["error"]
               for r in merged["records"] if r["status"] == "invalid")

    suite = ET.parse(out / RUN / "junit.xml").getroot()
    assert int(suite.get("tests")) == N_GRAPHS and int(suite.get("failures")) == counts["fail"]
    assert int(suite.get("errors")) == counts["invalid"]
    md = (out / RUN / "summary.md").read_text()
    assert f"{counts['pass']} pass, {counts['fail']} fail, {counts['invalid']} invalid" in md
    assert f"gradcheck-svc batch-merge: {N_GRAPHS} graphs:" in merge.stderr

def test_indexed_job_in_process(tmp_path):
    run_job(tmp_path)

def test_indexed_job_against_a_server(tmp_path):
    with ServerProcess("--workers", "2") as server:
        # dns:/// as with the headless Service: the client balances round-robin over what it resolves
        run_job(tmp_path, "--server", f"dns:///127.0.0.1:{server.port}")


def test_indexed_job_rerun_after_a_graph_and_an_option_changed(tmp_path):
    """The Job re-applied under the same name (the same run ID, from the downward API) after an author
    replaced a graph: only that graph is verified again and the merge reports its new verdict; an index
    re-run with other options is refused by the merge, naming the units and the options that differ."""
    corpus, out = tmp_path / "graphs", tmp_path / "results"
    for i in range(24):
        (corpus / f"m-{i:02d}.json").parent.mkdir(parents=True, exist_ok=True)
        (corpus / f"m-{i:02d}.json").write_text(json.dumps(graph_dict(i, size=2)))
    job_env = {"GRADCHECK_RUN_ID": "gradcheck-batch"}

    def index(i: int, *extra: str) -> subprocess.CompletedProcess:
        return cli(*batch_args(corpus, out, *extra), env={"JOB_COMPLETION_INDEX": str(i), **job_env})

    def merge(*extra: str) -> tuple[subprocess.CompletedProcess, dict]:
        proc = cli("batch-merge", str(out), *extra)
        return proc, json.loads((out / "runs" / "gradcheck-batch" / "merged.json").read_text())

    assert all(index(i).returncode == 0 for i in range(SHARDS))
    proc, merged = merge("--shard-count", str(SHARDS))  # as the merge Job runs it: the count from the settings
    assert proc.returncode == 0 and merged["run_id"] == "gradcheck-batch" and merged["counts"]["pass"] == 24
    # a merge told another shard count (the settings changed after the shards ran): every unit set aside and
    # named, every graph missing (no shard has run under that count, so nothing says what each must answer)
    proc, merged = merge("--shard-count", str(SHARDS * 2))
    assert proc.returncode == 4 and merged["counts"]["missing"] == 24 and merged["records"] == []
    assert merged["superseded"]["units"] == [{"unit": f"shard-{i:04d}", "shard_count": SHARDS} for i in range(SHARDS)]
    assert f"unit(s) made with another shard count than {SHARDS * 2}: shard-0000 ({SHARDS} shards), " in proc.stderr

    changed = "m-05.json"
    (corpus / changed).write_text(json.dumps(graph_dict(5, size=2, kind="mismatch")))
    shard = shard_of(changed, SHARDS)
    rerun = index(shard)
    assert rerun.returncode == 0 and ", 1 to verify" in rerun.stderr and verified(rerun.stderr) == [changed]
    proc, merged = merge()
    assert proc.returncode == 1 and merged["failed"] == [changed] and merged["stale_records"] == 1

    other = (shard + 1) % SHARDS
    assert index(other, "--atol", "1e6").returncode == 0
    proc, merged = merge()
    assert proc.returncode == 4
    assert f"shard-{other:04d}: options " in proc.stderr and "(they differ in: atol)" in proc.stderr
    assert [g["units"] for g in merged["mixed"] if g["keyed_options"].get("atol") == 1e6] == [[f"shard-{other:04d}"]]
