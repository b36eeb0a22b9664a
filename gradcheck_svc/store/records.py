"""Where a batch keeps its results: one directory per run and unit, one file per answered question.

    OUT/runs/<run>/<unit>/unit.json            the unit's plan: mode, shard, node, the whole manifest, the
                                               options, the gradcheck version, each of its graphs' sha256
    OUT/runs/<run>/<unit>/results/<key>.json   one graph's record
    OUT/runs/<run>/<unit>/ended.json           how its latest attempt ended: the exit code, its error line,
                                               whether it is the unit's last (finished, or failed for good),
                                               and the attempt (launch) that wrote it
    OUT/runs/<run>/<unit>/alive.json           the running unit's heartbeat; OUT/runs/<run>/attempt.json the
                                               launch holding the run (attempt.py)

<run> is the run ID (`--run-id`; in a Job, the Job's name). A unit is a shard
(`shard-0003`) of a batch, or a node (`node-<name>`) of a screen.

A record's <key> is the sha256 of the graph's name, the sha256 of its bytes, the
sha256 of the options that shape a result (`keyed_options`) and the gradcheck
version: a record answers exactly one question. A graph replaced on the volume,
a changed option or an upgraded image finds no record under its key and is
verified again -- never reported from an older answer -- and the merge can tell
which question every record answered.

OUT is a local directory or an object store URL (s3://, gs://, az://; see
location.py). Locally every file is written to a temporary name, fsync'ed,
renamed over its final name and the directory fsync'ed; in an object store it
is one PUT of one object. Either way a reader (the merge, or the same shard
restarted after SIGKILL or OOM) sees either nothing or the whole file, never
half of one. A restarted shard skips graphs whose record exists and is whole
(schema.py); a damaged one is verified again and replaced, and so is a time-out's
(RETRIED: a retry may finish it).
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .location import ObjectPath, prefetch
from .schema import Damaged, check_record, check_unit, parse

RUNS = "runs"
# statuses a resumed unit verifies again (the record replaced): a time-out measures the node it ran on (slow,
# crowded) as much as the graph -- retryable, as an exit 75 is -- while pass, fail, invalid and error are the
# graph's own answer under this key
RETRIED = ("timeout",)
RESULTS = "results"
UNIT_FILE = "unit.json"
ENDED_FILE = "ended.json"  # how the unit's latest attempt ended: what a waiting merge (--wait) watches
TMP_SUFFIX = ".tmp"
DEFAULT_RUN = "default"
LATEST = "latest"
# A run ID names the Job (or JobSet) and everything made from it, so it is a DNS label short enough for all of
# them to fit in 63 characters: the merge Job <run>-merge, a JobSet's child Jobs <run>-shards-0 and
# <run>-merge-0, and their pods' hostnames <job>-<index> (an Indexed Job's). The same rule by hand and in a Job.
RUN_ID_MAX = 46
RUN_ID = re.compile(rf"[a-z0-9]([a-z0-9-]{{0,{RUN_ID_MAX - 2}}}[a-z0-9])?")


def atomic_write(path: Path | ObjectPath, data: bytes) -> None:
    if isinstance(path, ObjectPath):  # a PUT is atomic per object: no temporary name to rename
        path.write_bytes(data)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a write's ENOSPC or EFBIG names no file: name the one being written
        tmp.unlink(missing_ok=True)
        raise _naming(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:  # the rename itself is durable only once the directory is
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _naming(exc: OSError, path) -> OSError:
    """The error with the file it was about (the final name, not the temporary one)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def write_json(path: Path, obj) -> None:
    atomic_write(path, _json_bytes(obj))


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")


def create_json(path: Path | ObjectPath, obj) -> bool:
    """Write the file only where none is: True when this call created it, False when it was there already (of two
    writers at once, exactly one gets True). Locally a whole temporary file hard-linked into place; in an object
    store one conditional PUT (If-None-Match), or a plain one where the backend has no conditional write."""
    data = _json_bytes(obj)
    if isinstance(path, ObjectPath):
        return path.create_bytes(data)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError as exc:  # a share without hard links (SMB: Azure Files): O_EXCL, whole once written
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
    except FileExistsError:
        return False
    except OSError as exc:
        raise _naming(exc, path) from None
    finally:
        tmp.unlink(missing_ok=True)
    return True


# --- what a record answers: content, options, version -----------------------------------------------

def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path | ObjectPath) -> str:
    if isinstance(path, ObjectPath):
        return bytes_sha256(path.read_bytes())
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def options_sha256(keyed_options: dict) -> str:
    """The options as canonical JSON (sorted keys; tuples as lists), hashed."""
    text = json.dumps(keyed_options, sort_keys=True, separators=(",", ":"), allow_nan=False, default=list)
    return bytes_sha256(text.encode("utf-8"))


@functools.lru_cache(maxsize=1)
def _source_sha256() -> str:
    """Every Python file of the service, the core below it and the generated protocol: an image rebuilt with a
    fix but the same version number is a different gradcheck, and its answers are not the old ones."""
    import gradcheck
    import gradcheck_core

    from .. import __file__ as svc_init

    h = hashlib.sha256()
    for pkg in (Path(svc_init).parent, Path(gradcheck_core.__file__).parent, Path(list(gradcheck.__path__)[0])):
        for f in sorted(pkg.rglob("*.py")):
            h.update(f"{pkg.name}/{f.relative_to(pkg).as_posix()}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def code_version() -> str:
    """This process's gradcheck: the release and a digest of its source (`0.1.0+src.1a2b3c4d5e6f`)."""
    from .. import __version__

    return f"{__version__}+src.{_source_sha256()[:12]}"


def record_key(graph: str, graph_sha256: str, opts_sha256: str, version: str) -> str:
    return bytes_sha256("\0".join((graph, graph_sha256, opts_sha256, version)).encode("utf-8"))


def key_of(record: dict) -> str:
    return record_key(record["graph"], record["graph_sha256"], record["options_sha256"], record["gradcheck_version"])


# --- runs and units -----------------------------------------------------------------------------------

def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:200]


def unit_name(shard_index: int | None = None, node: str | None = None) -> str:
    if node is not None:
        return "node-" + safe_name(node)
    return f"shard-{shard_index:04d}"


def as_path(out):
    """A local directory as a Path; an object store location (location.py) as it is."""
    return out if isinstance(out, ObjectPath) else Path(out)


def run_dir(out: Path | ObjectPath, run_id: str) -> Path | ObjectPath:
    return as_path(out) / RUNS / run_id


def list_runs(out: Path) -> dict[str, int]:
    """Run ID -> when its newest unit started (unit.json's mtime in ns; a unit that lost its unit.json counts
    by its results directory, one that ended before writing it -- refused by argparse, an empty or missing
    graphs volume -- by its ended.json), for every run holding a unit: a launch whose every shard ended so is
    a run its merge finds and reports on (each graph missing, and why), not one it waits out --wait for."""
    runs = {}
    root = as_path(out) / RUNS
    if not root.is_dir():
        return runs
    for run in root.iterdir():
        if not run.is_dir():
            continue
        stamps = []
        for u in run.iterdir():
            for marker in (u / UNIT_FILE, u / RESULTS, u / ENDED_FILE):
                if marker.exists():
                    stamps.append(marker.stat().st_mtime_ns)
                    break
        if stamps:
            runs[run.name] = max(stamps)
    return runs


class UnitStore:
    """The results directory of one unit of one run."""

    def __init__(self, out: Path, run_id: str, unit: str):
        self.dir = run_dir(out, run_id) / unit
        self.results = self.dir / RESULTS

    def open(self, plan: dict) -> None:
        self.results.mkdir(parents=True, exist_ok=True)
        # a SIGKILLed predecessor may have left a temporary file; the Job controller starts a
        # replacement pod only after the old one has terminated, so none of these is in use
        for stale in self.results.glob(f".*{TMP_SUFFIX}"):
            stale.unlink(missing_ok=True)
        self.write_plan(plan)

    def write_plan(self, plan: dict) -> None:
        write_json(self.dir / UNIT_FILE, plan)

    def record_path(self, key: str) -> Path:
        return self.results / f"{key}.json"

    def done(self, key: str) -> bool:
        """A whole, valid record answers this key, and not with a time-out (a damaged one or a time-out's does
        not: the graph is verified again)."""
        return self._whole(self.record_path(key), key)

    def done_many(self, keys) -> set[str]:
        """The keys that done() says are answered, their records fetched together from an object store."""
        paths = {key: self.record_path(key) for key in keys}
        prefetch(paths.values())
        return {key for key, path in paths.items() if self._whole(path, key)}

    @staticmethod
    def _whole(path, key: str) -> bool:
        try:
            record = check_record(parse(path.read_bytes()))
        except FileNotFoundError:
            return False
        except Damaged:
            return False
        return key_of(record) == key and record["status"] not in RETRIED

    def write(self, record: dict) -> None:
        write_json(self.record_path(key_of(record)), record)


def write_ended(unit_dir, code: int, final: bool, started_at: str, attempt: str | None = None,
                version: str | None = None, error: str | None = None) -> None:
    """Best effort: a volume that cannot take this file has already failed the attempt, which says so itself.
    A full volume may still take it in place of the heartbeat (attempt.py): the ending is what the merge waits on."""
    from datetime import datetime, timezone

    body = {"exit": code, "final": final, "started_at": started_at, "at": datetime.now(timezone.utc).isoformat(),
            "attempt": attempt, "gradcheck_version": version, "error": error}
    try:
        unit_dir.mkdir(parents=True, exist_ok=True)
        write_json(unit_dir / ENDED_FILE, body)
    except OSError:
        _ended_in_place(unit_dir, body)


def _ended_in_place(unit_dir, body: dict) -> None:
    """A full disk: no room for a new file, but the heartbeat's alive.json holds blocks already -- renamed to
    ended.json and rewritten in place (no new block), so the merge still learns how the attempt ended."""
    if isinstance(unit_dir, ObjectPath):
        return
    alive, ended = unit_dir / "alive.json", unit_dir / ENDED_FILE
    text = json.dumps(body, allow_nan=False, separators=(",", ":")).encode("utf-8")
    try:
        size = alive.stat().st_size
        if len(text) > size:
            return
        os.replace(alive, ended)
        with open(ended, "r+b") as fh:
            fh.write(text + b" " * (size - len(text)))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        pass


def has_ended(unit_dir, ok_only: bool = False, attempt: str | None = None) -> bool:
    """The unit's latest attempt was its last: it finished (exit 0), or failed for good (ok_only: finished).
    With an attempt: only an ended.json written by that attempt counts (never a time stamp). Without (a run by
    hand): an ended.json older than the unit's latest start belongs to an attempt since retried."""
    try:
        ended = parse((unit_dir / ENDED_FILE).read_bytes())
    except (OSError, Damaged):
        return False
    if not isinstance(ended, dict) or ended.get("final") is not True or (ok_only and ended.get("exit") != 0):
        return False
    if attempt is not None:
        return ended.get("attempt") == attempt
    try:
        started = parse((unit_dir / UNIT_FILE).read_bytes()).get("started_at", "")
    except (OSError, Damaged, AttributeError):
        started = ""
    return str(ended.get("started_at", "")) >= str(started)


@dataclass
class Unit:
    """One unit as read back: its plan (None when unit.json is damaged), its valid records, its damaged files."""
    name: str
    plan: dict | None
    records: list = field(default_factory=list)
    damaged: list = field(default_factory=list)  # (path, reason)


def _read(path: Path):
    try:
        return parse(path.read_bytes())
    except OSError as exc:
        raise Damaged(f"cannot read: {exc.strerror or exc}") from None


def read_run(rdir: Path) -> list[Unit]:
    """Every unit directory of a run, each file schema-checked; temporary files are ignored (unfinished
    writes). A record is read only when its unit.json is valid: without the plan nothing says what it answers."""
    units = []
    for unit_dir in sorted(p for p in as_path(rdir).iterdir() if p.is_dir()):
        plan_file = unit_dir / UNIT_FILE
        results = unit_dir / RESULTS
        if not plan_file.is_file():
            if results.is_dir():  # records without a plan: the unit.json was lost
                units.append(Unit(unit_dir.name, None, damaged=[(plan_file, "missing")]))
            continue
        try:
            unit = Unit(unit_dir.name, check_unit(_read(plan_file), unit_dir.name))
        except Damaged as exc:
            units.append(Unit(unit_dir.name, None, damaged=[(plan_file, str(exc))]))
            continue
        if results.is_dir():
            files = [f for f in sorted(results.iterdir()) if not f.name.startswith(".") and f.suffix == ".json"]
            prefetch(files)  # an object store: all of them in one concurrent batch of GETs
            for f in files:
                try:
                    record = check_record(_read(f))
                    if key_of(record) != f.stem:
                        raise Damaged("its name is not its record's key (graph, content, options, version): "
                                      "a copied or edited file")
                except Damaged as exc:
                    unit.damaged.append((f, str(exc)))
                else:
                    unit.records.append(record)
        units.append(unit)
    return units
