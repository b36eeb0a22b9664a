"""One graph's finite differences split over processes, as an Indexed Job runs them (issue 24 item 6, issue 36
item 5): shards `gradcheck-svc verify G --fd-shard-count N --fd-out DIR` with JOB_COMPLETION_INDEX set, then
`verify G --fd-from DIR`, must print the report a single `verify G` prints -- every JSON field but the timings --
for N = 1, 2, 3, with the joint screen's directions split over the shards (each direction evaluated by exactly
one) as well as the parameters checked on their own; and a merge refuses, naming them, shards that are missing
or were made from another graph, options or version."""
from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import forked_cli
from grpc_helpers import ROOT, _env
from fd_graphs import mlp
from gradcheck_svc.verify.fd_shards import assign, dealer


def cli(*args: str, index: int | None = None) -> subprocess.CompletedProcess:
    env = _env({} if index is None else {"JOB_COMPLETION_INDEX": str(index)})
    return forked_cli.run("gradcheck_svc.cli", "verify", *args, timeout=300, env=env, cwd=ROOT)


def without_timings(report: dict) -> dict:
    """The report but for how long each phase took (the symbolic oracle's `seconds` is one of them)."""
    report = dict(report)
    report.pop("timings")
    if isinstance(report.get("symbolic"), dict):
        report["symbolic"] = {k: v for k, v in report["symbolic"].items() if k != "seconds"}
    return report


def run_shards(graph: Path, out: Path, count: int, *opts: str) -> list[str]:
    """Every index of an Indexed Job of `count` completions, concurrently, as the Job controller starts them."""
    procs = [forked_cli.Forked("gradcheck_svc.cli", ["verify", graph, *opts, "--fd-shard-count", count, "--fd-out", out],
                               env=_env({"JOB_COMPLETION_INDEX": str(i)}), cwd=ROOT) for i in range(count)]
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
    # the joint screen, its directions split; a corrupted saved value makes it flag parameters (the follow-up:
    # refined, bisected, checked on their own by the merge), then the merge's diagnosis names the node: exit 1
    "joint-fault": ("--fd", "joint", "--fault", "h1:scale:1.01"),
    # the joint screen passing, its 7 directions split unevenly (3 shards: 3, 2, 2); in float32, so that every shard
    # and the merge judge the same float64 stand-in (verify/stand_in.py: the directions' weights follow from it)
    "joint": ("--fd", "joint", "--directions", "7", "--dtype", "float32"),
}
CHAIN = ROOT / "examples" / "graphs" / "chain_256.json"


def shard_split(lines: list[str], count: int) -> tuple[list[str], list[tuple[int, int]]]:
    """From the shards' lines: the parameters each checked on its own, and per shard (its directions of the
    joint screen, k) -- or None where it ran no screen."""
    names, rows = [], []
    for line in lines:
        share = line.split("(")[1].split(")")[0]
        names += [] if share == "none" else share.split(", ")
        m = re.search(r", (\d+) of the joint screen's (\d+) directions", line)
        rows.append(None if m is None else (int(m.group(1)), int(m.group(2))))
    return names, rows


def check_split(graph: Path, tmp_path: Path, opts: tuple, want: dict, code: int) -> tuple[list, list[str]]:
    """Shards of 1, 2 and 3, each merged: the single process's report every time. Returns the shards' screen rows
    (per count) and every line the shards printed."""
    planned = [p["name"] for p in want["parameters"] if not p["fd_checked_by"].startswith("joint")]
    screened = any(p["fd_checked_by"].startswith("joint") for p in want["parameters"])
    seen, printed = [], []
    for count in (1, 2, 3):
        out = tmp_path / f"fd-{count}"
        lines = run_shards(graph, out, count, *opts)
        printed += lines
        split, rows = shard_split(lines, count)
        # each parameter the plan checks on its own is computed by exactly one shard (those the screen flags, by
        # the merge: the screen's follow-up)
        assert sorted(split) == sorted(planned), lines
        if screened:  # shard i evaluates the directions dealt to it (by cost: shard 0 makes the memory profile's
            # runs): every one of the k by exactly one shard (the merge refuses any other split)
            k = rows[0][1]
            assert sum(m for m, _ in rows) == k and {n for _, n in rows} == {k}, lines
        else:
            assert rows == [None] * count, lines
        seen.append(rows)
        files = sorted(p.name for p in out.iterdir())
        # the shards' files and the graph they decoded once (verify/fd_graph.py), which the merge reads
        assert files[1:] == [f"fd-shard-{i:04d}-of-{count:04d}.npz" for i in range(count)]
        assert files[0].startswith("fd-graph-") and files[0].endswith(".pb"), files
        merged = cli(str(graph), *opts, "--fd-from", str(out), "--format", "json")
        assert merged.returncode == code, merged.stderr
        got = json.loads(merged.stdout)
        assert without_timings(got) == without_timings(want), f"{count} shards"
    return seen, printed


@pytest.mark.parametrize("variant", VARIANTS)
def test_split_report_equals_the_single_process_report(tmp_path, variant):
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp(kink=True))
    opts = VARIANTS[variant]
    single = cli(str(graph), *opts, "--format", "json")
    assert single.returncode in (0, 1), single.stderr
    want = json.loads(single.stdout)
    if variant == "joint-fault":
        assert single.returncode == 1 and want["verdict"] == "fail"
        assert any(p["fd_checked_by"] != "joint" for p in want["parameters"])  # flagged: the merge's follow-up
        assert any(f["node"] == "h1" for f in want["findings"])
    else:
        assert single.returncode == 0 and want["verdict"] == "pass"
    # relu at its kink: a note the merge takes from the shard that made it where every row passes (else its own)
    assert [(f["node"], f["cause"]) for f in want["findings"]][-1] == ("kinked", "nondifferentiable_point")
    if variant == "joint":
        assert sorted(want["fd_plan"]["stand_in"]) == sorted(p["name"] for p in want["parameters"])
    check_split(graph, tmp_path, opts, want, single.returncode)


def test_chain_256_split_by_direction_equals_the_single_process(tmp_path):
    """chain_256 under the default --fd auto: 505 tensors screened jointly (by complex steps, which leave no block
    unresolved, in the 4 directions their power chooses: every process derives the same k, joint_check.joint_k),
    the 7 cheapest in full. The shards split both passes' directions
    and the 7 full checks; the merge evaluates no direction of its own and prints the single process's report."""
    want = json.loads(cli(str(CHAIN), "--format", "json").stdout)
    assert want["verdict"] == "pass"
    assert sum(p["fd_checked_by"] == "joint" for p in want["parameters"]) == 505
    rows, lines = check_split(CHAIN, tmp_path, (), want, 0)
    # dealt by cost (fd_shards.shares): shard 0 counts the memory profile's inference figures beside its reported
    # run (no run of their own), and the what-if (4 forwards: 2 directions), the costliest item, goes to the least
    # loaded shard -- shard 0 on a tie; the directions then even the loads
    assert want["fd_plan"]["directions"] == 4
    assert rows[1] == [(1, 4), (3, 4)] and rows[2] == [(0, 4), (2, 4), (2, 4)]
    # complex steps (the default) leave no block unresolved: no second pass to split, in any of the 6 shards above
    # (central differences' one, whose rounding eps |L| / h blinded chain_256's first layers, is split the same
    # way: screen_share)
    assert len(lines) == 6 and not any("second pass" in line for line in lines), lines


def test_the_merge_reads_the_screen_s_directions_from_the_shards(tmp_path):
    """The merge does not evaluate the screen's directions again: a first-pass value changed in a shard's file
    is the value the merged report shows for that direction (every joint row shows the whole's), and a
    direction held by two shards, or by none, is refused."""
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    opts = ("--fd", "joint", "--directions", "6")
    out = tmp_path / "fd"
    run_shards(graph, out, 2, *opts)
    good = json.loads(cli(str(graph), *opts, "--fd-from", str(out), "--format", "json").stdout)
    path = out / "fd-shard-0001-of-0002.npz"
    original = path.read_bytes()
    rows = {}

    def bump(meta, arrays):
        rows["r"] = int(arrays["screen0.rows"][0])
        # far inside what the direction is allowed (no refinement, no flag): the row shows it as it is
        factor = np.ones(len(arrays["screen0.rows"]))
        factor[0] = 1 + 1e-12
        arrays["screen0.values"] = arrays["screen0.values"] * factor
    rewrite(path, bump)
    r = cli(str(graph), *opts, "--fd-from", str(out), "--format", "json")
    got = json.loads(r.stdout)
    r = rows["r"]  # shard 1's first direction, as the deal by cost gave it (fd_shards.shares)
    before = np.asarray(good["parameters"][0]["reference"])
    after = np.asarray(got["parameters"][0]["reference"])
    assert good["parameters"][0]["fd_checked_by"] == "joint" and after[r] != before[r]
    assert np.array_equal(np.delete(after, r), np.delete(before, r))
    for change in (lambda meta, arrays: arrays.update({"screen0.rows": (arrays["screen0.rows"] + 1) % 6}),  # some twice
                   lambda meta, arrays: meta.update(screens=[])):  # shard 1's by none
        path.write_bytes(original)
        rewrite(path, change)
        r = cli(str(graph), *opts, "--fd-from", str(out))
        assert r.returncode == 2 and "the joint screen's directions are not split once over every shard" in r.stderr, \
            r.stderr


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
    # the shards' own file edited after they ran: decoded again (the graph the shards kept is keyed by the file's
    # bytes), so refused as another graph -- never the shards' graph reported under the edited file's name
    kept = graph.read_text()
    graph.write_text(mlp(seed=1))
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "was made from another graph" in r.stderr, r.stderr
    graph.write_text(kept)
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
    # nor its FD base forward (the plan the report states, the shards' in every file) nor the kink notes (a
    # passing graph's: the shard they were dealt to holds them, here none at first)
    files = sorted(out.glob("fd-shard-*-of-0003.npz"))
    for f in files:
        rewrite(f, lambda meta, arrays: meta["base"]["plan"].update(forwards=meta["base"]["plan"]["forwards"] + 7))
    note = {"node": "h0", "op": "tanh", "cause": "nondifferentiable_point", "severity": "info", "detail": "noted",
            "parameters": ["W0"]}
    holder = next(f for f in files if read_meta(f)["kink_notes"] is not None)
    rewrite(holder, lambda meta, arrays: meta.update(kink_notes=[note]))
    got = json.loads(cli(str(graph), *FULL, "--fd-from", str(out), "--format", "json").stdout)
    rows = {p["name"]: p for p in got["parameters"]}
    before = {p["name"]: p for p in good["parameters"]}
    assert np.allclose(np.asarray(rows[name["p"]]["reference"]), np.asarray(before[name["p"]]["reference"]) + 1.0)
    assert got["fd_plan"]["forwards"] == good["fd_plan"]["forwards"] + 7
    assert [f["detail"] for f in got["findings"]] == [f["detail"] for f in good["findings"]] + ["noted"]
    # one shard's base forward other than shard 0's (a loss one ulp off), or notes held by no shard: refused
    rewrite(files[1], lambda meta, arrays: meta["base"].update(
        loss=(np.frombuffer(bytes.fromhex(meta["base"]["loss"]), np.float64) * (1 + 2 ** -52)).tobytes().hex()))
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and f"{files[1].name}: made another FD base forward than {files[0].name}" in r.stderr, \
        r.stderr
    rewrite(holder, lambda meta, arrays: meta.update(kink_notes=None))
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2 and "the diagnosis' kink notes are held by none" in r.stderr, r.stderr


def test_a_damaged_kept_graph_is_decoded_again(tmp_path):
    """The graph the shards decoded once (verify/fd_graph.py) carries its digest: a damaged copy is not read as
    a graph; the merge decodes the file itself and still prints the single process's report."""
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    want = json.loads(cli(str(graph), *FULL, "--format", "json").stdout)
    out = tmp_path / "fd"
    run_shards(graph, out, 1, *FULL)
    [kept] = out.glob("fd-graph-*.pb")
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    r = cli(str(graph), *FULL, "--fd-from", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert without_timings(json.loads(r.stdout)) == without_timings(want)


def test_the_merge_takes_shard_0_s_engine_run(tmp_path):
    """A failing graph (a wrong rule: the diagnosis names it), no fault injected: shard 0 records its engine run
    (loss, gradients, memory profile, findings) and the merge runs no engine -- its report equals the single
    process's, and a loss or a memory figure changed in shard 0's file (or in the what-if's, shard 1's) is the one
    the merged report shows."""
    from gradcheck_svc.batch.generate import graph_dict

    graph = tmp_path / "mismatch.json"
    graph.write_text(json.dumps(graph_dict(7, size=2, kind="mismatch")))
    single = cli(str(graph), "--format", "json")
    want = json.loads(single.stdout)
    assert single.returncode == 1 and any(f["cause"] == "rule_error" for f in want["findings"]), single.stderr
    out = tmp_path / "fd"
    run_shards(graph, out, 2)
    merged = cli(str(graph), "--fd-from", str(out), "--format", "json")
    assert merged.returncode == 1 and without_timings(json.loads(merged.stdout)) == without_timings(want)

    def change(meta, arrays):
        assert meta["engine"]["gradients"] is not None  # recorded: no fault, no event
        meta["engine"]["loss"] += 1.0
        meta["engine"]["memory"]["op_evaluations"] += 1000
    rewrite(out / "fd-shard-0000-of-0002.npz", change)
    # the profile's checkpointed what-if is made by the shard it is dealt to (fd_shards.shares: by cost), its
    # figures the merged report's; held by no shard, the merge refuses
    what_if = next(p for p in sorted(out.glob("fd-shard-*.npz")) if read_meta(p)["what_if"] is not None)
    rewrite(what_if, lambda meta, arrays: meta["what_if"]["memory"].update(checkpoint_op_evaluations=-1))
    got = json.loads(cli(str(graph), "--fd-from", str(out), "--format", "json").stdout)
    assert got["loss"] == want["loss"] + 1.0
    assert got["memory"]["op_evaluations"] == want["memory"]["op_evaluations"] + 1000
    assert want["memory"]["checkpoint_op_evaluations"] > 0 and got["memory"]["checkpoint_op_evaluations"] == -1
    rewrite(what_if, lambda meta, arrays: meta.update(what_if=None))
    r = cli(str(graph), "--fd-from", str(out))
    assert r.returncode == 2 and "the memory profile's what-if is held by none" in r.stderr, r.stderr


def test_recorded_gradients_keep_the_engine_s_layout():
    """Shard 0's gradients come back with the engine's values, shapes and memory layout (a Linear's weight gradient
    is a transposed product: the report's norm, a BLAS dot over the memory order, rounds by that order)."""
    from types import SimpleNamespace

    from gradcheck_svc.verify.fd_shards import _engine_record, engine_record

    grads = {"w": np.arange(5120.0).reshape(512, 10).T, "t": np.arange(60.0).reshape(3, 4, 5).transpose(2, 0, 1),
             "b": np.linspace(0, 1, 5), "s": np.array(3.0)}
    engine = SimpleNamespace(findings=[], memory={"op_evaluations": 1}, events=[], gradients=grads, loss=1.5,
                             seconds=0.1)
    arrays = {}
    record = json.loads(json.dumps(_engine_record(engine, SimpleNamespace(faults=[]), arrays)))
    made = engine_record(record, arrays)
    assert made["loss"] == 1.5 and made["memory"] == {"op_evaluations": 1} and made["findings"] == []
    for p, g in grads.items():
        back = made["gradients"][p]
        assert back.shape == g.shape and back.strides == g.strides and np.array_equal(back, g), p


def read_meta(path: Path) -> dict:
    """A shard file's metadata (its "meta" array: UTF-8 JSON)."""
    with np.load(path) as z:
        return json.loads(z["meta"].tobytes().decode("utf-8"))


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
    load = [30.0, 0.0]  # shard 0 already holding the memory profile's runs (shares)
    assert assign(costs, 2, load) == [1] * 7 and load == [30.0, 25.0]


def test_directions_are_dealt_once_each_and_shard_0_fewer():
    """Each pass's directions are dealt to exactly one shard; without a preload a first pass by stride; shard 0,
    preloaded with the memory profile's runs, gets that many fewer, and a second pass evens the loads out."""
    for count, preload in ((1, 2), (3, 0), (4, 0), (4, 2), (5, 2)):
        deals = [dealer(i, count, [preload] + [0] * (count - 1)) for i in range(count)]
        for k in (16, 8):
            rows = [d(k) for d in deals]
            assert sorted(int(r) for part in rows for r in part) == list(range(k)), (count, preload, k)
            if k == 16 and preload == 0:
                assert [list(r) for r in rows] == [list(range(i, k, count)) for i in range(count)]
    first = [len(dealer(i, 4, [2, 0, 0, 0])(16)) for i in range(4)]
    assert first == [3, 5, 4, 4]
    # loads and a direction's cost in one unit (shares'): shard 0's profile worth 2.5 directions, shard 1's
    # parameters 1.5
    assert [len(dealer(i, 3, [5.0, 3.0, 0.0], 2.0)(6)) for i in range(3)] == [1, 2, 3]


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
    files = sorted(p.rsplit("/", 1)[1] for p in fs.ls("fd-shards/runs/model-1"))
    # the shards' files and the graph decoded once (verify/fd_graph.py), one object each
    assert files[1:] == ["fd-shard-0000-of-0002.npz", "fd-shard-0001-of-0002.npz"]
    assert files[0].startswith("fd-graph-"), files
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

    LIMIT = 1.0  # seconds: any limit is over (the einsum runs for minutes), so a short one proves the same

    slow = tmp_path / "einsum8.json"
    slow.write_text(json.dumps(unfinishable_graph()))
    start = time.monotonic()
    r = cli(str(slow), "--fd-shard-count", "2", "--fd-out", str(tmp_path / "fd"), "--max-request-seconds",
            str(LIMIT), index=1)
    assert r.returncode == 75, r.stderr
    assert r.stderr.strip() == ("gradcheck-svc: fd shard 1/2: over the time limit, retry (exit 75): verification "
                                "exceeded the per-request limit of 1 s (raise it with --max-request-seconds)")
    assert time.monotonic() - start < LIMIT + SLACK  # unbounded, the einsum runs for minutes
    # no shard file written: the retry computes it whole (from the graph decoded once, verify/fd_graph.py)
    assert [p.name[:9] for p in (tmp_path / "fd").iterdir()] == ["fd-graph-"]

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
