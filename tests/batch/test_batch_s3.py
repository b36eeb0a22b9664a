"""batch / batch-merge / screen against a real S3 API server on loopback (moto's server mode, a subprocess on
127.0.0.1), reached as a Job's pod reaches S3: through s3fs and the standard AWS_ENDPOINT_URL / AWS_*
variables. Three shards read their graphs from the bucket and write their records there, one of them is
SIGKILLed mid-run and re-run, and the merge reads them back and writes its report to the bucket."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter

import pytest

from conftest import free_port as _free_port
from grpc_helpers import ROOT, _env, slow_graph
from deploy_helpers import FAILURE_COUNT, JOB_UID, deploy_copy, render
from gradcheck_svc.batch.generate import graph_dict, write_graphs
from gradcheck_svc.batch.manifest import load_manifest, shard_of
from gradcheck_svc.cli import main

SHARDS, VICTIM, N_GRAPHS, RUN_ID = 3, 1, 30, "s3-job"
TIME_LIMIT = 2  # seconds: the slow graph's finite differences take tens


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def upload_corpus(fs, bucket: str) -> dict[str, str]:
    """N_GRAPHS graphs in two folders of s3://bucket/graphs/; every 7th+3 a wrong derivative (fail), every
    9th+5 an unknown op (invalid); and one graph far over the time limit, last in the victim's shard, so the
    kill lands mid-run however fast the machine. Returns name -> expected status."""
    fs.mkdir(bucket)
    slow = next(f"zz/slow-{k}.pb" for k in range(100) if shard_of(f"zz/slow-{k}.pb", SHARDS) == VICTIM)
    fs.pipe_file(f"{bucket}/graphs/{slow}", slow_graph(width=96).SerializeToString())
    expected = {slow: "timeout"}
    for i in range(N_GRAPHS):
        kind = "mismatch" if i % 7 == 3 else "invalid" if i % 9 == 5 else "ok"
        rel = f"team-{i % 2}/model-{i:02d}.json"
        fs.pipe_file(f"{bucket}/graphs/{rel}", json.dumps(graph_dict(i, size=3, kind=kind)).encode())
        expected[rel] = {"ok": "pass", "mismatch": "fail", "invalid": "invalid"}[kind]
    return expected


def shard_cmd(bucket: str, index: int | None = None) -> list[str]:
    """A shard's command line; without an index, the pod's: index and run ID come from the environment."""
    given = [] if index is None else ["--shard-index", str(index), "--run-id", RUN_ID]
    # --fd full: the slow graph's full finite differences take tens of seconds (the default's joint
    # screen would verify it within the time limit on a fast machine); the small graphs' cost nothing
    return ["batch", "--manifest", f"s3://{bucket}/graphs", "--shard-count", str(SHARDS),
            "--out", f"s3://{bucket}/results", "--fd", "full", "--time-limit", str(TIME_LIMIT), *given]


def verified(stderr: str) -> list[str]:
    return re.findall(r"\] \w+\s+(\S+) \(", stderr)


def records(fs, bucket: str, index: int) -> dict[str, dict]:
    keys = fs.find(f"{bucket}/results/runs/{RUN_ID}/shard-{index:04d}/results")
    return {json.loads(fs.cat_file(k))["graph"]: json.loads(fs.cat_file(k)) for k in keys}


def test_three_shards_a_killed_one_rerun_and_the_merge_in_the_bucket(capsys, s3):
    fs, env = s3
    bucket = "gradcheck-job"
    expected = upload_corpus(fs, bucket)
    mine = {i: sorted(g for g in expected if shard_of(g, SHARDS) == i) for i in range(SHARDS)}
    assert all(len(v) >= 6 for v in mine.values())

    # the victim is a real process started as the batch-s3 Job starts a pod (its index and run ID from the
    # environment), killed as the OOM killer would once it has recorded 3 graphs
    victim = subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", *shard_cmd(bucket)], cwd=ROOT, text=True,
                              env=_env({**env, "JOB_COMPLETION_INDEX": str(VICTIM), "GRADCHECK_RUN_ID": RUN_ID}),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    for line in victim.stderr:
        lines.append(line)
        if len(verified("".join(lines))) == 3:
            victim.send_signal(signal.SIGKILL)
            break
    lines.append(victim.stderr.read())
    assert victim.wait(timeout=60) == -signal.SIGKILL
    first = verified("".join(lines))
    kept = records(fs, bucket, VICTIM)
    assert 3 <= len(kept) < len(mine[VICTIM]), "the kill must land mid-run"
    assert set(first) <= set(kept) | {first[-1]} and set(kept) <= set(mine[VICTIM])

    for i in range(SHARDS):  # the other shards, and the victim's retry, as the Job controller would run them
        if i == VICTIM:
            continue
        code, _, err = run(capsys, *shard_cmd(bucket, i))
        assert code == 0 and f"{len(mine[i])} graphs, 0 already done" in err, err
    code, _, err = run(capsys, *shard_cmd(bucket, VICTIM))
    assert code == 0, err
    assert f"{len(kept)} already done, {len(mine[VICTIM]) - len(kept)} to verify" in err
    second = verified(err)
    assert sorted(set(kept) | set(second)) == mine[VICTIM] and not set(kept) & set(second)

    # every record is a whole object under its key, with the status its graph must get
    for i in range(SHARDS):
        got = records(fs, bucket, i)
        assert {g: r["status"] for g, r in got.items()} == {g: expected[g] for g in mine[i]}
    unit = json.loads(fs.cat_file(f"{bucket}/results/runs/{RUN_ID}/shard-0000/unit.json"))
    assert unit["manifest_root"] == f"s3://{bucket}/graphs" and len(unit["graphs"]) == len(expected)

    code, _, err = run(capsys, "batch-merge", f"s3://{bucket}/results", "--exit-zero")
    assert code == 0, err  # --exit-zero: the report is written; the verdict is in it
    run_prefix = f"{bucket}/results/runs/{RUN_ID}"
    merged = json.loads(fs.cat_file(f"{run_prefix}/merged.json"))
    assert merged["verdict"] == "fail" and merged["exit_code"] == 1 and merged["missing"] == []
    assert merged["damaged"] == [] and merged["duplicates"] == [] and merged["graphs"] == len(expected)
    assert {k: v for k, v in merged["counts"].items() if v} == dict(Counter(expected.values()))
    assert {r["graph"]: r["status"] for r in merged["records"]} == expected
    suite = ET.fromstring(fs.cat_file(f"{run_prefix}/junit.xml"))
    assert sum(1 for _ in suite.iter("testcase")) == len(expected)
    assert f"{len(expected)} graphs" in fs.cat_file(f"{run_prefix}/summary.md").decode()

    # a graph replaced in the bucket is verified again on the re-run, never answered from its old record
    victim_graph = next(g for g in mine[0] if expected[g] == "pass")
    fs.pipe_file(f"{bucket}/graphs/{victim_graph}", json.dumps(graph_dict(99, size=3, kind="mismatch")).encode())
    code, _, err = run(capsys, *shard_cmd(bucket, 0))
    assert code == 0 and f"{len(mine[0]) - 1} already done, 1 to verify" in err, err
    code, _, err = run(capsys, "batch-merge", f"s3://{bucket}/results", "--json", f"s3://{bucket}/again.json")
    assert code == 1 and "(exit 1)" in err
    again = json.loads(fs.cat_file(f"{bucket}/again.json"))
    assert again["stale_records"] == 1 and victim_graph in again["failed"]


def test_manifest_forms_in_a_bucket_name_the_graphs_a_local_tree_names(capsys, s3, tmp_path):
    fs, _ = s3
    local = tmp_path / "graphs"
    write_graphs(local / "a", 3, size=2)
    write_graphs(local / "b" / "c", 2, size=2)
    (local / "notes.txt").write_text("not a graph\n")
    (local / "top.json").write_bytes((local / "a" / "gen-00000.json").read_bytes())  # `**` matches no folder too
    fs.mkdir("forms")
    fs.put(str(local) + "/", "forms/graphs/", recursive=True)
    names = load_manifest(str(local)).graphs
    assert len(names) == 6 and load_manifest(f"file://{local}").graphs == names
    listing = "# a list file\n" + "\n".join(reversed(names)) + "\n"
    fs.pipe_file("forms/graphs/list.txt", listing.encode())
    for spec in ("s3://forms/graphs", "s3://forms/graphs/", "s3://forms/graphs/**/*.json",
                 "s3://forms/graphs/list.txt"):
        m = load_manifest(spec)
        assert m.graphs == names and str(m.root) == "s3://forms/graphs", spec
        assert [m.shard(i, 3) for i in range(3)] == [load_manifest(str(local)).shard(i, 3) for i in range(3)]
    one = load_manifest("s3://forms/graphs/b/c/gen-00001.json")
    assert one.graphs == ("gen-00001.json",) and str(one.root) == "s3://forms/graphs/b/c"

    fs.pipe_file("forms/bad.txt", b"graphs/a/gen-00000.json\ngraphs/nope.json\n")
    fs.pipe_file("forms/escape/list.txt", b"../graphs/a/gen-00000.json\n")
    for spec, message in (("s3://forms/bad.txt", "list file s3://forms/bad.txt, line 2: no such graph object: "
                                                 "graphs/nope.json"),
                          ("s3://forms/escape/list.txt", "is outside the manifest root s3://forms/escape"),
                          ("s3://forms/nothing-here", "no such object, prefix or matching glob"),
                          ("s3://forms/graphs/**/*.pb",
                           "no graphs (*.json, *.pb, *.onnx) in s3://forms/graphs/**/*.pb")):
        code, _, err = run(capsys, "batch", "--manifest", spec, "--shard-index", 0, "--out", tmp_path / "o")
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (spec, err)


def test_screen_writes_to_a_bucket_and_merges_from_it(capsys, monkeypatch, s3):
    """A screen of three listed nodes in a bucket, as its Indexed Job runs it: index 0 on n1, index 1 landing
    on n1 too (refused, exit 75, its landing recorded in the bucket), then on n2; n3 never reached. The
    merge reads it all back from the bucket and names the landing and the node not screened."""
    fs, _ = s3
    fs.mkdir("screens")

    def screen(node, index):
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
        return run(capsys, "screen", "--out", "s3://screens/out", "--node-name", node, "--examples", "none",
                   "--generated", 2, "--size", 2, "--run-id", "scr", "--expect-nodes", "node/n1,node/n2,node/n3")

    code, _, err = screen("n1", 0)
    assert code == 0, err
    code, _, err = screen("n1", 1)
    assert code == 75 and "node n1 was screened by index 0 in run scr; index 1 landed on it again" in err, err
    landing = json.loads(fs.cat_file("screens/out/runs/scr/node-n1/landings/index-0001.json"))
    assert (landing["node"], landing["index"], landing["screened_by"]) == ("n1", 1, 0)
    code, _, err = screen("n2", 1)
    assert code == 0, err
    code, _, err = run(capsys, "batch-merge", "s3://screens/out")
    assert code == 4, err
    assert "2 graphs on each of 2 of 3 expected node(s): n1: 2 pass; n2: 2 pass; n3: not screened (exit 4)" in err
    assert "1 of 3 expected node(s) not screened (no unit.json in this run): n3" in err
    assert "n1 (index 1; screened by index 0)" in err
    merged = json.loads(fs.cat_file("screens/out/runs/scr/merged.json"))
    assert merged["mode"] == "screen" and sorted(merged["screen"]["nodes"]) == ["n1", "n2"]
    assert merged["nodes"]["unscreened"] == ["n3"]
    assert merged["nodes"]["landings"] == [{"node": "n1", "index": 1, "screened_by": 0}]


def test_missing_backend_or_unknown_scheme_is_one_line_exit_2(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as on an image without the [gcs] extra
    code, _, err = run(capsys, "batch", "--manifest", "gs://bucket/graphs", "--shard-index", 0, "--out", tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("--manifest: gs:// needs fsspec and gcsfs, which are not installed: pip install '.[gcs]' in a gradcheck "
            "checkout") in err
    monkeypatch.setitem(sys.modules, "adlfs", None)
    code, _, err = run(capsys, "batch-merge", "az://container/results")
    assert code == 2 and "DIR: az:// needs fsspec and adlfs" in err and "pip install '.[azure]'" in err
    code, _, err = run(capsys, "batch-merge", f"file://{tmp_path}/none")  # file:// is a local path
    assert code == 2 and f"DIR: not a directory: {tmp_path}/none" in err
    code, _, err = run(capsys, "screen", "--out", "ftp://host/x", "--examples", "none", "--generated", 1)
    assert code == 2 and "--out: 'ftp://' is not a storage this batch reads or writes" in err
    assert len(err.strip().splitlines()) == 1


def test_unreachable_endpoint_is_an_infrastructure_failure_exit_75(capsys, monkeypatch, s3, tmp_path):
    """A bucket that cannot be reached is the platform's fault: exit 75, retried by the Job; one line."""
    fs, _ = s3
    write_graphs(tmp_path / "g", 2, size=2)
    code, _, err = run(capsys, "batch", "--manifest", tmp_path / "g", "--shard-index", 0, "--out",
                       "s3://no-such-bucket/out")
    assert code == 75 and len(err.strip().splitlines()) == 1, err
    assert "infrastructure failure, retry (exit 75): s3://no-such-bucket/out/runs/default/shard-0000/" in err
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    code, _, err = run(capsys, "batch", "--manifest", tmp_path / "g", "--shard-index", 0, "--out",
                       "s3://gradcheck-job/unreachable")
    assert code == 75 and len(err.strip().splitlines()) == 1, err
    assert "infrastructure failure, retry (exit 75): s3://gradcheck-job/unreachable/runs/default/shard-0000/" in err
    assert "Could not connect to the endpoint URL" in err
    code, _, err = run(capsys, "batch", "--manifest", "s3://gradcheck-job/graphs", "--shard-index", 0, "--out",
                       tmp_path / "o")
    assert code == 75 and "infrastructure failure, retry (exit 75): s3://gradcheck-job/graphs" in err
    code, _, err = run(capsys, "batch-merge", "s3://gradcheck-job/results")
    assert code == 75 and len(err.strip().splitlines()) == 1, err
    assert ("batch-merge: infrastructure failure, retry (exit 75): cannot read results under "
            "s3://gradcheck-job/results") in err


def test_the_rendered_batch_s3_overlay_runs_as_rendered(capsys, monkeypatch, s3, kubectl, tmp_path):
    """deploy/overlays/batch-s3 as a cluster would run it, with the batch settings changed as a user changes
    them (run ID and shard count, once, in deploy/components/batch-run/settings.yaml) and the bucket edited
    in its ConfigMap: every completion index with the container's environment (the ConfigMap's keys by
    envFrom, then the container's own env, which wins, as the kubelet orders them) and its args ($(VAR)
    expanded from that environment), then the merge Job's args."""
    fs, env = s3
    bucket = "rendered"
    fs.mkdir(bucket)
    write_graphs(tmp_path / "g" / "team", 7, size=2, kinds=lambda i: "mismatch" if i == 2 else "ok")
    fs.put(str(tmp_path / "g") + "/", f"{bucket}/graphs/", recursive=True)

    root = deploy_copy(tmp_path, "batch-run", run="s3-nightly", shards="3")

    def pod(objs, kind, name):
        (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
        return obj

    objs = render(kubectl, root / "overlays/batch-s3")
    job = pod(objs, "Job", "s3-nightly")
    assert job["spec"]["completions"] == 3
    config = dict(pod(objs, "ConfigMap", "gradcheck-s3")["data"])
    config.update(GRADCHECK_MANIFEST=f"s3://{bucket}/graphs/", GRADCHECK_OUT=f"s3://{bucket}/results")

    def environment(c, node: str) -> dict:
        assert [e["configMapRef"]["name"] for e in c["envFrom"] if "configMapRef" in e] == ["gradcheck-s3"]
        environ = dict(config)
        for e in c.get("env", []):
            if "value" in e:
                environ[e["name"]] = e["value"]
            elif e["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}:  # the downward API
                environ[e["name"]] = node
            elif e["valueFrom"] == {"fieldRef": {"fieldPath": JOB_UID}}:  # the Job's uid, the same for every pod
                environ[e["name"]] = "uid-of-s3-nightly"
            else:  # the only other: the Job controller's failure count of the index (a first attempt here)
                assert e["valueFrom"] == {"fieldRef": {"fieldPath": FAILURE_COUNT}}, e
                environ[e["name"]] = "0"
        return environ

    def expand(args, environ):  # the kubelet's $(VAR) expansion
        return [re.sub(r"\$\((\w+)\)", lambda m: environ.get(m.group(1), m.group(0)), a) for a in args]

    (c,) = job["spec"]["template"]["spec"]["containers"]
    for index in range(job["spec"]["completions"]):
        environ = environment(c, f"node-{index}")
        for k, v in environ.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))  # as the Job controller sets it
        code, _, err = run(capsys, *expand(c["args"], environ))
        assert code == 0, err

    merge = pod(render(kubectl, root / "overlays/batch-s3/merge"), "Job", "s3-nightly-merge")
    (m,) = merge["spec"]["template"]["spec"]["containers"]
    environ = environment(m, "node-m")
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    verdict = tmp_path / "termination-log"  # the kubelet's /dev/termination-log
    args = [f"--verdict-file={verdict}" if a == "--verdict-file=/dev/termination-log" else a
            for a in expand(m["args"], environ)]
    code, _, err = run(capsys, *args)
    assert code == 0, err  # --exit-zero: the merge Job succeeds once the report is written
    assert verdict.read_text() == "fail: run s3-nightly: 7 graphs: 6 pass, 1 fail\n"
    merged = json.loads(fs.cat_file(f"{bucket}/results/runs/s3-nightly/merged.json"))
    assert merged["shard_count"] == 3 and merged["missing"] == [] and merged["failed"] == ["team/gen-00002.json"]
    assert {r["node"] for r in merged["records"]} <= {f"node-{i}" for i in range(3)}
    # the merge read the graph set from the bucket the shards read, and waited for them as deployed
    assert merged["manifest"] == f"s3://{bucket}/graphs/" and any(a.startswith("--wait=") for a in m["args"])


def test_a_resume_in_the_bucket_after_a_removal_and_a_new_shard_count_converges(capsys, s3):
    """The resume scenarios of tests/batch/test_batch_resume.py in a bucket: 3 shards, one graph deleted from the
    bucket, resumed with 2 shards; the merge reads the graph set from the bucket (--manifest s3://...), counts
    each graph once, and names the set-aside units and the removed graph once."""
    fs, _ = s3
    bucket = "gradcheck-resume"
    fs.mkdir(bucket)
    for i in range(6):
        fs.pipe_file(f"{bucket}/graphs/g{i}.json", json.dumps(graph_dict(i, size=2)).encode())
    base = ["--manifest", f"s3://{bucket}/graphs", "--out", f"s3://{bucket}/results", "--run-id", "resume"]
    for i in range(3):
        assert run(capsys, "batch", *base, "--shard-index", i, "--shard-count", 3)[0] == 0
    fs.rm_file(f"{bucket}/graphs/g4.json")
    for i in range(2):
        assert run(capsys, "batch", *base, "--shard-index", i, "--shard-count", 2)[0] == 0
    code, _, err = run(capsys, "batch-merge", f"s3://{bucket}/results", "--run-id", "resume", "--shard-count", 2,
                       "--manifest", f"s3://{bucket}/graphs")
    assert code == 0, err
    assert "5 graphs: 5 pass (exit 0)" in err
    assert ("set aside (superseded): records of 1 graph(s) no longer in the manifest: g4.json; 1 unit(s) made "
            "with another shard count than 2: shard-0002 (3 shards); ") in err
    merged = json.loads(fs.cat_file(f"{bucket}/results/runs/resume/merged.json"))
    assert sorted(r["graph"] for r in merged["records"]) == [f"g{i}.json" for i in (0, 1, 2, 3, 5)]
    assert merged["duplicates"] == [] and merged["missing"] == []


# every key S3 accepts, read and written exactly: `//` (which a path would fold into `/`), a leading or
# trailing-segment slash, dots, spaces, URL and glob characters, non-ASCII; `a/x.json` beside `a//x.json`
ODD_KEYS = ("a//x.json", "a/x.json", "/lead.json", "///three.json", "c/d//e.json", "dot/./x.json", "dd/../y.json",
            "sp ace.json", "end /x.json", "pl+us.json", "per%20c.json", "q?m.json", "h#.json", "*st.json",
            "[br].json", "t~l.json", "a\\b.json", "ünï.json")


def test_every_key_s3_accepts_is_read_and_written_exactly(capsys, s3):
    import hashlib

    fs, _ = s3
    bucket = "odd-keys"
    fs.mkdir(bucket)
    sha, expected = {}, {}
    for i, key in enumerate(ODD_KEYS):  # each graph its own content: a record read from another key would show
        kind = "mismatch" if i % 3 == 1 else "ok"
        data = json.dumps(graph_dict(i, size=3, kind=kind)).encode()
        fs.pipe_file(f"{bucket}/graphs/{key}", data)
        sha[key], expected[key] = hashlib.sha256(data).hexdigest(), "fail" if kind == "mismatch" else "pass"
    out = f"s3://{bucket}/results//deep"  # the results' own prefix holds `//` too
    code, _, err = run(capsys, "batch", "--manifest", f"s3://{bucket}/graphs", "--shard-count", 2, "--shard-index", 0,
                       "--run-id", "odd", "--out", out)
    assert code == 0, err
    code, _, err = run(capsys, "batch", "--manifest", f"s3://{bucket}/graphs", "--shard-count", 2, "--shard-index", 1,
                       "--run-id", "odd", "--out", out)
    assert code == 0, err
    assert all(k.startswith(f"{bucket}/results//deep/runs/odd/") for k in fs.find(f"{bucket}/results"))
    code, _, err = run(capsys, "batch-merge", out, "--exit-zero")
    assert code == 0, err
    merged = json.loads(fs.cat_file(f"{bucket}/results//deep/runs/odd/merged.json"))
    assert merged["missing"] == [] and merged["damaged"] == [] and merged["graphs"] == len(ODD_KEYS)
    assert {r["graph"]: r["status"] for r in merged["records"]} == expected
    assert {r["graph"]: r["graph_sha256"] for r in merged["records"]} == sha


def test_a_missing_bucket_is_retryable_an_empty_prefix_is_the_users(capsys, s3):
    fs, _ = s3
    fs.mkdir("there")
    code, _, err = run(capsys, "batch-merge", "s3://no-such-bucket/results")
    assert code == 75 and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith("infrastructure failure, retry (exit 75): cannot read results under "
                                "s3://no-such-bucket/results: no such bucket")
    code, _, err = run(capsys, "batch-merge", "s3://there/no-such-prefix")
    assert code == 2 and err.strip() == "gradcheck-svc: error: DIR: no results under s3://there/no-such-prefix"
