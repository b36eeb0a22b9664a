"""Where a batch keeps its results: one directory per unit, one file per finished graph.

    OUT/<unit>/unit.json              the unit's plan: mode, shard, node, the whole manifest
    OUT/<unit>/results/<key>.json     one graph's record (key: sha256 of its relative path)

A unit is a shard (`shard-0003`) in a batch, or a node (`node-<name>`) in a
screen. Every file is written to a temporary name, fsync'ed, renamed over
its final name and the directory fsync'ed: a reader (the merge, or the same
shard restarted after SIGKILL or OOM) sees either nothing or the whole file,
never half of one. A restarted shard skips graphs whose record exists.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .manifest import graph_key

RESULTS = "results"
UNIT_FILE = "unit.json"
TMP_SUFFIX = ".tmp"


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:  # the rename itself is durable only once the directory is
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8"))


def unit_name(shard_index: int | None = None, node: str | None = None) -> str:
    if node is not None:
        return "node-" + re.sub(r"[^A-Za-z0-9._-]", "_", node)[:200]
    return f"shard-{shard_index:04d}"


class UnitStore:
    """The results directory of one unit."""

    def __init__(self, out: Path, unit: str):
        self.dir = Path(out) / unit
        self.results = self.dir / RESULTS

    def open(self, plan: dict) -> None:
        self.results.mkdir(parents=True, exist_ok=True)
        # a SIGKILLed predecessor may have left a temporary file; the Job controller starts a
        # replacement pod only after the old one has terminated, so none of these is in use
        for stale in self.results.glob(f".*{TMP_SUFFIX}"):
            stale.unlink(missing_ok=True)
        write_json(self.dir / UNIT_FILE, plan)

    def record_path(self, rel: str) -> Path:
        return self.results / f"{graph_key(rel)}.json"

    def done(self, rel: str) -> bool:
        return self.record_path(rel).is_file()

    def write(self, record: dict) -> None:
        write_json(self.record_path(record["graph"]), record)


def read_units(out: Path):
    """Yield (unit name, plan, [records]) for every unit directory under out; temporary files are
    ignored (they are unfinished writes)."""
    for unit_dir in sorted(p for p in Path(out).iterdir() if (p / UNIT_FILE).is_file()):
        plan = json.loads((unit_dir / UNIT_FILE).read_text(encoding="utf-8"))
        records = []
        results = unit_dir / RESULTS
        if results.is_dir():
            for f in sorted(results.iterdir()):
                if f.suffix == ".json" and not f.name.startswith("."):
                    records.append(json.loads(f.read_text(encoding="utf-8")))
        yield unit_dir.name, plan, records
