"""Damaged finite-difference shard files (verify/fd_shards.py): whatever part of a shard is wrong -- the zip,
an .npy member, the metadata, one parameter's record or array -- the merge refuses it in one line as damaged,
naming the file ("...; run its shard again"), exit 2: never `internal error: KeyError`, never exit 1 or 3."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fd_graphs import mlp
from grpc_helpers import ROOT, _env
import forked_cli

FULL = ("--fd", "full")
VICTIM = "fd-shard-0001-of-0002.npz"


def cli(*args: str, index: int | None = None) -> subprocess.CompletedProcess:
    env = _env({} if index is None else {"JOB_COMPLETION_INDEX": str(index)})
    return forked_cli.run("gradcheck_svc.cli", "verify", *args, timeout=300, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("fd")
    graph = d / "mlp.json"
    graph.write_text(mlp())
    for i in range(2):  # every parameter in full: each shard holds parameter records
        r = cli(str(graph), *FULL, "--fd-shard-count", "2", "--fd-out", str(d / "fd"), index=i)
        assert r.returncode == 0, r.stderr
    return graph, d / "fd"


def _rewrite(path: Path, change, meta_bytes: bytes | None = None) -> None:
    """The shard rewritten: change(meta, arrays) edits them in place; meta_bytes, when given, is the metadata."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    change(meta, arrays)
    arrays["meta"] = np.frombuffer(meta_bytes or json.dumps(meta).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def _param(change):
    """A change to the first parameter record of the shard."""
    def edit(meta, arrays):
        change(meta["parameters"][0])
    return edit


def _bytes(change):
    def edit(path: Path):
        path.write_bytes(change(path.read_bytes()))
    return edit


def _extra_member(path: Path) -> None:
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("notes.txt", "not an array")


DAMAGE = {
    "truncated": _bytes(lambda b: b[: len(b) // 2]),
    "empty": _bytes(lambda b: b""),
    "garbage": _bytes(lambda b: bytes((i * 7919) % 251 for i in range(len(b)))),
    "not_npy_member": _extra_member,
    "meta_not_json": lambda p: _rewrite(p, lambda m, a: None, meta_bytes=b"{oops"),
    "no_comparison": lambda p: _rewrite(p, _param(lambda r: r.pop("comparison"))),
    "comparison_wrong_field": lambda p: _rewrite(p, _param(lambda r: r["comparison"].update(bogus=1.0))),
    "worst_index_a_number": lambda p: _rewrite(p, _param(lambda r: r["comparison"].update(worst_index=3))),
    "mode_unknown": lambda p: _rewrite(p, _param(lambda r: r.update(mode="sideways"))),
    "array_missing": lambda p: _rewrite(p, lambda m, a: a.pop("0.reference")),
    "record_a_string": lambda p: _rewrite(p, lambda m, a: m.update(parameters=["w"])),
    "parameters_missing": lambda p: _rewrite(p, lambda m, a: m.pop("parameters")),
    "work_missing": lambda p: _rewrite(p, lambda m, a: m.pop("work")),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_shard_is_refused_as_damaged_in_one_line(case, shards, tmp_path):
    graph, src = shards
    out = tmp_path / "fd"
    shutil.copytree(src, out)
    DAMAGE[case](out / VICTIM)
    r = cli(str(graph), *FULL, "--fd-from", str(out))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr and not r.stdout.strip()
    [line] = r.stderr.strip().splitlines()
    assert f"{out / VICTIM}: damaged or not a finite-difference shard (" in line, line
    assert line.endswith("; run its shard again"), line


def test_the_undamaged_shards_still_merge(shards):
    graph, src = shards
    r = cli(str(graph), *FULL, "--fd-from", str(src), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verdict"] == "pass"
