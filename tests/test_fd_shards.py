"""One graph's finite differences split over processes, as an Indexed Job runs them (issue 24 item 6): shards
`gradcheck-svc verify G --fd-shard-count N --fd-out DIR` with JOB_COMPLETION_INDEX set, then `verify G --fd-from
DIR`, must print the report a single `verify G` prints -- every JSON field but the timings -- for N = 1, 2, 3;
and a merge refuses, naming them, shards that are missing or were made from another graph, options or version."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpc_helpers import ROOT, _env
from fd_graphs import mlp
from gradcheck_svc.verify.fd_shards import assign


def cli(*args: str, index: int | None = None) -> subprocess.CompletedProcess:
    env = _env({} if index is None else {"JOB_COMPLETION_INDEX": str(index)})
    return subprocess.run([sys.executable, "-m", "gradcheck_svc.cli", "verify", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)


def without_timings(report: dict) -> dict:
    """The report but for how long each phase took (the symbolic oracle's `seconds` is one of them)."""
    report = dict(report)
    report.pop("timings")
    if isinstance(report.get("symbolic"), dict):
        report["symbolic"] = {k: v for k, v in report["symbolic"].items() if k != "seconds"}
    return report


def run_shards(graph: Path, out: Path, count: int, *opts: str) -> list[str]:
    """Every index of an Indexed Job of `count` completions, concurrently, as the Job controller starts them."""
    procs = [subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", "verify", str(graph), *opts,
                               "--fd-shard-count", str(count), "--fd-out", str(out)],
                              env=_env({"JOB_COMPLETION_INDEX": str(i)}), cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(count)]
    lines = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        lines.append(stdout.strip())
    return lines


FULL = ("--fd", "full")
VARIANTS = {
    # the joint screen, the cheapest parameter in full (oracles/fd_plan.py)
    "auto": (),
    # projections: the merge regenerates each one's directions from the seed
    "projection": ("--fd", "projection", "--directions", "5", "--seed", "3"),
    # the joint screen, which a corrupted saved value makes flag parameters (checked on their own, split),
    # then the merge's diagnosis names the node: a failing report, exit 1
    "joint-fault": ("--fd", "joint", "--fault", "h1:scale:1.01"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_split_report_equals_the_single_process_report(tmp_path, variant):
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    opts = VARIANTS[variant]
    single = cli(str(graph), *opts, "--format", "json")
    assert single.returncode in (0, 1), single.stderr
    want = json.loads(single.stdout)
    if variant == "joint-fault":
        assert single.returncode == 1 and want["verdict"] == "fail"
        assert any(p["fd_checked_by"] != "joint" for p in want["parameters"])  # flagged ones, split below
        assert any(f["node"] == "h1" for f in want["findings"])
    else:
        assert single.returncode == 0 and want["verdict"] == "pass"
    params_on_own = [p["name"] for p in want["parameters"] if p["fd_checked_by"] != "joint"]
    for count in (1, 2, 3):
        out = tmp_path / f"fd-{count}"
        lines = run_shards(graph, out, count, *opts)
        shares = [line.split("(")[1].split(")")[0] for line in lines]
        split = [n for s in shares if s != "none" for n in s.split(", ")]
        # each parameter checked on its own is computed by exactly one shard
        assert sorted(split) == sorted(params_on_own), lines
        assert sorted(p.name for p in out.iterdir()) == [f"fd-shard-{i:04d}-of-{count:04d}.npz" for i in range(count)]
        merged = cli(str(graph), *opts, "--fd-from", str(out), "--format", "json")
        assert merged.returncode == single.returncode, merged.stderr
        got = json.loads(merged.stdout)
        assert without_timings(got) == without_timings(want), f"{count} shards"


def test_merge_refuses_missing_foreign_and_mismatched_shards(tmp_path):
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    # every parameter in full, so that every shard has parameters to refuse (auto screens this graph jointly)
    out = tmp_path / "fd"
    run_shards(graph, out, 3, *FULL)
    # a missing index is named, with the file expected
    (out / "fd-shard-0001-of-0003.npz").rename(tmp_path / "kept.npz")
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "shard 1 of 3 missing" in r.stderr, r.stderr
    assert "fd-shard-0001-of-0003.npz" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "kept.npz").rename(out / "fd-shard-0001-of-0003.npz")
    # other options than the shards': refused, naming the shard and the cause
    r = cli(str(graph), *FULL, "--fd-from", str(out), "--atol", "1e-3")
    assert r.returncode == 2 and "fd-shard-0000-of-0003.npz was made from other options" in r.stderr, r.stderr
    # another graph (same names, other values): refused as such
    other = tmp_path / "other.json"
    other.write_text(mlp(seed=1))
    r = cli(str(other), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "was made from another graph" in r.stderr, r.stderr
    # a shard re-run under another count into the same directory: the mix is refused, naming the files
    r = cli(str(graph), *FULL, "--fd-shard-count", "2", "--fd-out", str(out), index=0)
    assert r.returncode == 0, r.stderr
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "shards of different counts" in r.stderr and "fd-shard-0000-of-0002.npz" in r.stderr
    # a file from another gradcheck version: its version field rewritten (the digest of the source differs)
    (out / "fd-shard-0000-of-0002.npz").unlink()
    path = out / "fd-shard-0002-of-0003.npz"
    original = path.read_bytes()
    rewrite(path, lambda meta, arrays: meta.update(gradcheck_version="0.0.1+src.000000000000"))
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "fd-shard-0002-of-0003.npz was made from another gradcheck version" in r.stderr
    # made against another engine gradient, or another screen / loss / work list than the merge's: refused
    path.write_bytes(original)
    rewrite(path, lambda meta, arrays: meta["parameters"][0].update(gradient="0" * 64))
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "was checked against another engine gradient" in r.stderr, r.stderr
    path.write_bytes(original)
    rewrite(path, lambda meta, arrays: meta.update(work="0" * 64))
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "fd-shard-0002-of-0003.npz: computed against another loss" in r.stderr, r.stderr
    # the merge reads the shards' differences, it does not compute them again: a value changed in a shard
    # is the value the report shows
    path.write_bytes(original)
    good = json.loads(cli(str(graph), *FULL, "--fd-from", str(out), "--format", "json").stdout)
    name = {}

    def bump(meta, arrays):
        name["p"] = meta["parameters"][0]["name"]
        arrays["0.reference"] = arrays["0.reference"] + 1.0
    rewrite(path, bump)
    r = cli(str(graph), *FULL, "--fd-from", str(out), "--format", "json")
    rows = {p["name"]: p for p in json.loads(r.stdout)["parameters"]}
    before = {p["name"]: p for p in good["parameters"]}
    assert np.allclose(np.asarray(rows[name["p"]]["reference"]), np.asarray(before[name["p"]]["reference"]) + 1.0)


def rewrite(path: Path, change) -> None:
    """Rewrite a shard file: change(meta, arrays) edits its metadata and arrays in place."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    change(meta, arrays)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def test_shard_flags_refused_as_usage_errors(tmp_path):
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    cases = [
        ((str(graph), "--fd-shard-count", "2", "--fd-out", str(tmp_path)), None, "--fd-shard-index",
         "$JOB_COMPLETION_INDEX is not set"),
        ((str(graph), "--fd-shard-count", "2", "--fd-out", str(tmp_path)), 2, "--fd-shard-index", "not in 0..1"),
        ((str(graph), "--fd-shard-count", "2"), 0, "--fd-shard-count", "--fd-out"),
        ((str(graph), "--fd-out", str(tmp_path)), None, "--fd-out", "needs --fd-shard-count"),
        ((str(tmp_path), "--fd-from", str(tmp_path)), None, "PATH", "one graph file"),
        ((str(graph), "--fd-from", str(tmp_path / "none")), None, "--fd-from", "not a directory"),
        ((str(graph), "--fd-from", str(tmp_path), "--fd-shard-index", "1"), None, "--fd-from", "merges shards"),
        ((str(graph), "--fd-shard-count", "2", "--fd-out", str(tmp_path), "--html", "x.html"), 0, "--html",
         "a shard writes no report"),
    ]
    for args, index, field, text in cases:
        env_index = index
        r = cli(*args, index=env_index)
        assert r.returncode == 2, (args, r.stderr)
        assert field in r.stderr and text in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_assignment_is_balanced_and_deterministic():
    costs = [10.0, 1.0, 1.0, 7.0, 3.0, 3.0, 0.0]
    assert assign(costs, 1) == [0] * 7
    where = assign(costs, 2)
    assert where == assign(list(costs), 2)
    loads = [sum(c for c, s in zip(costs, where) if s == k) for k in range(2)]
    assert loads == [12.0, 13.0] or loads == [13.0, 12.0]
    assert assign(costs, 3)[0] == 0 and assign(costs, 3)[3] == 1  # costliest first, lowest index on ties


def test_shards_through_object_storage(tmp_path, s3):  # noqa: F811 -- the fixture
    """--fd-out and --fd-from as S3 URLs (a real S3 API server on loopback, reached through s3fs and the
    standard AWS_* environment): one PUT per shard file; the merged report is the single process's."""
    fs, _ = s3
    fs.mkdir("fd-shards")
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    want = json.loads(cli(str(graph), "--format", "json").stdout)
    url = "s3://fd-shards/runs/model-1"
    for i in range(2):
        r = cli(str(graph), "--fd-shard-count", "2", "--fd-out", url, index=i)
        assert r.returncode == 0 and f"-> {url}/fd-shard-000{i}-of-0002.npz" in r.stdout, r.stderr
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("fd-shards/runs/model-1")) == [
        "fd-shard-0000-of-0002.npz", "fd-shard-0001-of-0002.npz"]
    merged = cli(str(graph), "--fd-from", url, "--format", "json")
    assert merged.returncode == 0, merged.stderr
    assert without_timings(json.loads(merged.stdout)) == without_timings(want)
    fs.rm("fd-shards/runs/model-1/fd-shard-0001-of-0002.npz")
    r = cli(str(graph), "--fd-from", url)
    assert r.returncode == 2 and "shard 1 of 2 missing" in r.stderr, r.stderr


def test_time_limits_are_retried_and_bad_input_is_not(tmp_path):
    """A shard or a merge over --max-request-seconds exits 75 (the Job's podFailurePolicy counts and retries it:
    a slow or crowded node), one line naming the limit and its flag, stopped at the limit even inside one long
    C call; a shard file the merge cannot read is 75 too; a bad graph stays 2 (FailIndex: no retry helps)."""
    import time

    from slow_graphs import SLACK, unfinishable_graph

    LIMIT = 2.0  # seconds

    slow = tmp_path / "einsum8.json"
    slow.write_text(json.dumps(unfinishable_graph()))
    start = time.monotonic()
    r = cli(str(slow), "--fd-shard-count", "2", "--fd-out", str(tmp_path / "fd"), "--max-request-seconds",
            str(LIMIT), index=1)
    assert r.returncode == 75, r.stderr
    assert r.stderr.strip() == ("gradcheck-svc: fd shard 1/2: over the time limit, retry (exit 75): verification "
                                "exceeded the per-request limit of 2 s (raise it with --max-request-seconds)")
    assert time.monotonic() - start < LIMIT + SLACK  # unbounded, the einsum runs for minutes
    assert not (tmp_path / "fd").exists()  # nothing written: the retry computes it whole

    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    out = tmp_path / "shards"
    run_shards(graph, out, 2)
    # the merge under a limit no verification can meet (1 ms: the child alone takes longer to start)
    r = cli(str(graph), "--fd-from", str(out), "--max-request-seconds", "0.001")
    assert r.returncode == 75 and r.stdout == "", r.stderr
    assert r.stderr.strip() == ("gradcheck-svc: fd merge: over the time limit, retry (exit 75): verification "
                                "exceeded the per-request limit of 0.001 s (raise it with --max-request-seconds)")
    assert cli(str(graph), "--fd-from", str(out)).returncode == 0  # the default limit fits the work
    # a shard file that reads as an I/O error (a link to /proc/self/mem): the volume's fault, retried
    victim = out / "fd-shard-0001-of-0002.npz"
    victim.unlink()
    victim.symlink_to("/proc/self/mem")
    r = cli(str(graph), "--fd-from", str(out))
    assert r.returncode == 75, r.stderr
    assert r.stderr.strip() == (f"gradcheck-svc: fd merge: infrastructure failure, retry (exit 75): {victim}: "
                                "cannot read: Input/output error")

    bad = tmp_path / "bad.json"
    data = json.loads(mlp())
    next(n for n in data["nodes"] if n["name"] == "h0")["op"] = "no_such_op"
    bad.write_text(json.dumps(data))
    for args in (("--fd-shard-count", "2", "--fd-out", str(tmp_path / "fd")), ("--fd-from", str(out))):
        r = cli(str(bad), *args, index=0)
        assert r.returncode == 2 and r.stderr.strip() == "gradcheck-svc: error: node 'h0': unknown op 'no_such_op'", \
            r.stderr
