"""Attempts: which launch of a run a unit's files belong to, and two launches that must never mix.

A run ID names a run across its resumes; an *attempt* is one launch of it (one `kubectl apply`, one
resume). Every unit.json, record, ended.json and alive.json carries the attempt that wrote it, and the
merge of an attempt (batch-merge --attempt) settles only on markers of that attempt: an ended.json of an
earlier one says nothing about this one, whatever its time stamp (clocks are never compared). By hand no
attempt is needed; in a Job the attempt comes from settings.yaml (deploy/README.md: a fresh one per apply; empty
there is refused, attempt_id), or, in a Job whose manifest sets no GRADCHECK_ATTEMPT, is the Job's uid
(unit_attempt); a merge given none settles on the run's holder (merge_attempt).

    OUT/runs/<run>/attempt.json        the run's claim: the attempt writing it now (and the Job's uid)
    OUT/runs/<run>/claim-<H>.json      who replaced the claim whose bytes hash to H: created, never overwritten --
                                       of two launches claiming at once, exactly one creates it (claim)
    OUT/runs/<run>/refused-<A>-<unit>.json   that unit of attempt A was refused: ended, for A's merge (which
                                       writes nothing while the run is another launch's)
    OUT/runs/<run>/<unit>/alive.json   a running unit's heartbeat: its attempt and a beat count, rewritten
                                       every GRADCHECK_HEARTBEAT_SECONDS (default 10)

Two launches under one run ID at once: a unit starting under attempt B finds the run claimed by attempt A.
A is over when each of its units wrote its ended.json (a deleted Job's pods do, on SIGTERM), or when its
heartbeats stop: the starting unit watches them for QUIET_BEATS beats on its own monotonic clock (never
comparing time stamps written elsewhere). A heartbeat that advances is a launch still running: B is refused
(exit 2, one line, nothing written). The same watch lets a waiting merge count an index whose last try was
SIGKILLed (OOM, a node lost) as ended: its heartbeat stops and no ended.json follows.
"""
from __future__ import annotations

import os
import re
import threading
import time

from ..text import clip
from ..store.schema import Damaged, parse

CLAIM_FILE = "attempt.json"
ALIVE_FILE = "alive.json"
CLAIMED = "claim-{}.json"  # runs/<run>/claim-<hash of the claim replaced>.json: who replaced it (created once)
REFUSED = "refused-{}-{}.json"  # runs/<run>/refused-<attempt>-<unit>.json: a launch's unit refused
ENDED_FILE = "ended.json"
RESERVE = 1024  # bytes each alive.json holds
QUIET_BEATS = 6  # a heartbeat unchanged this many intervals, watched here: the process is gone
ATTEMPT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def heartbeat_seconds() -> float:
    """GRADCHECK_HEARTBEAT_SECONDS (default 10): a value that is not a positive number of seconds is refused
    naming it (it fell back to 10, a typo'd setting silently ignored); check_environment asks first."""
    import math

    from ..errors import OptionError

    text = os.environ.get("GRADCHECK_HEARTBEAT_SECONDS", "10")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise OptionError(f"'{clip(text, 40)}' is not a positive number of seconds",
                          field="GRADCHECK_HEARTBEAT_SECONDS")
    return value


def index_count(name: str) -> int | None:
    """GRADCHECK_INDEX_FAILURES / GRADCHECK_INDEX_RETRIES: a count, or None where unset or empty (by hand; the
    downward API's value for an annotation not there); anything else is refused naming the variable (it read
    as unknown: an index never counted as out of retries)."""
    from ..errors import OptionError

    text = os.environ.get(name, "")
    if not text:
        return None
    if not text.isdigit():
        raise OptionError(f"'{clip(text, 40)}' is not a count (0 or more)", field=name)
    return int(text)


def check_environment() -> None:
    """Every GRADCHECK_* setting a batch command reads, checked before it writes anything (exit 2, naming it):
    later reads, some in the heartbeat's thread, then cannot fail."""
    heartbeat_seconds()
    index_count("GRADCHECK_INDEX_FAILURES")
    index_count("GRADCHECK_INDEX_RETRIES")
    attempt_id(None)


def attempt_id(given: str | None, field: str = "--attempt") -> str | None:
    """The attempt given (flag, else $GRADCHECK_ATTEMPT), checked; None when neither is set (by hand).

    Set but empty (settings.yaml's `attempt: ""` reaches both Jobs as an empty GRADCHECK_ATTEMPT, or an empty
    flag) is refused: it has no use a launch can rely on. The merge, a second Job, cannot learn the shards'
    Job uid (their job-UID); given no attempt it settles on the run's holder, which before any shard of this
    launch has claimed the run is the previous launch -- whose endings would settle it at once, its report
    passed off as this launch's. By hand, leave it unset."""
    from ..errors import OptionError

    value = given if given is not None else os.environ.get("GRADCHECK_ATTEMPT")
    named = field if given is not None else "GRADCHECK_ATTEMPT"  # where it came from: the flag or the variable
    if value == "":
        raise OptionError("empty: name this launch (settings.yaml `attempt`, fresh per apply); a merge started "
                          "before its shards would settle on the last launch's endings. By hand, leave it unset",
                          field=named)
    if value is not None and not ATTEMPT.fullmatch(value):
        raise OptionError(f"'{clip(value, 80)}' is not an attempt ID: letters, digits, '.', '_' and '-', at most "
                          "80, starting with a letter or digit", field=named)
    return value


def unit_attempt(given: str | None, field: str = "--attempt") -> str | None:
    """The attempt a unit writes under: the one given (attempt_id), else -- in a Job launched without one -- the
    Job's own: job-UID, its uid through the downward API ($GRADCHECK_JOB_UID: new per apply, the same for every
    pod of the Job), so that a Job's files always carry their launch and its merge never settles on time stamps.
    None by hand (no Job)."""
    value = attempt_id(given, field)
    uid = os.environ.get("GRADCHECK_JOB_UID") or ""
    if value is None and uid:
        value = "job-" + re.sub(r"[^A-Za-z0-9._-]", "-", uid)[:76]
    return value


def merge_attempt(given: str | None, rdir) -> str | None:
    """The attempt a merge settles on: the one given (attempt_id), else the one holding the run (attempt.json:
    the launch that claimed it last, unit_attempt's in a Job) -- a launched run's merge settles only on that
    launch's markers, never on time stamps. None for a run no launch claimed (by hand), or not found yet."""
    value = attempt_id(given)
    if value is None:
        try:
            value = holder(rdir)
        except OSError:
            value = None
    return value if value is None or ATTEMPT.fullmatch(value) else None


def read_json(path) -> dict | None:
    """A small marker file as a dict; None when absent, unreadable or damaged (as if never written)."""
    try:
        obj = parse(path.read_bytes())
    except (OSError, Damaged):
        return None
    return obj if isinstance(obj, dict) else None


def ended_by(unit_dir, attempt: str) -> bool:
    """The unit's ended.json was written by this attempt (any exit: the attempt is no longer running there)."""
    ended = read_json(unit_dir / ENDED_FILE)
    return ended is not None and ended.get("attempt") == attempt


class Heartbeat:
    """A thread rewriting the unit's alive.json every interval while the unit runs: {attempt, beat, last_try}.
    A write that fails (a full volume) is skipped; the unit's own writes report the volume."""

    def __init__(self, unit_dir, attempt: str, last_try: bool):
        from ..store.records import atomic_write

        self._write, self._path = atomic_write, unit_dir / ALIVE_FILE
        self._body = {"attempt": attempt, "last_try": last_try}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gradcheck-heartbeat", daemon=True)

    def announce(self) -> None:
        """The first beat alone (claim: before the run names this attempt)."""
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        self._beat(0)

    def start(self) -> "Heartbeat":
        self.announce()
        self._thread.start()
        return self

    def _beat(self, n: int) -> None:
        import json

        text = json.dumps(dict(self._body, beat=n), separators=(",", ":")).encode("utf-8")
        try:  # padded: blocks a full volume's ended.json can be written into (store.write_ended)
            self._write(self._path, text + b" " * max(0, RESERVE - len(text) - 1) + b"\n")
        except OSError:
            pass

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(heartbeat_seconds()):
            n += 1
            self._beat(n)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class Watch:
    """Heartbeats seen, per unit, on this process's monotonic clock: a beat unchanged for QUIET_BEATS
    intervals since this watch first saw it is a process gone (SIGKILL, OOM, a node lost)."""

    def __init__(self):
        self._seen = {}  # unit dir -> (alive.json as read, monotonic time it was first seen so)

    def quiet(self, unit_dir, alive: dict) -> bool:
        key, now = str(unit_dir), time.monotonic()
        last = self._seen.get(key)
        if last is None or last[0] != alive:
            self._seen[key] = (alive, now)
            return False
        return now - last[1] >= QUIET_BEATS * heartbeat_seconds()


def running_elsewhere(rdir, attempt: str, units) -> list[str]:
    """The units of `rdir` whose heartbeat names another attempt that has not ended there and still advances,
    watched for up to QUIET_BEATS intervals (only when some unit's other attempt has not ended)."""
    open_ = {}
    for u in units:
        alive = read_json(rdir / u / ALIVE_FILE)
        if alive and alive.get("attempt") not in (None, attempt) and not ended_by(rdir / u, alive["attempt"]):
            open_[u] = alive
    watch = Watch()
    for u, alive in open_.items():
        watch.quiet(rdir / u, alive)
    while open_:
        time.sleep(heartbeat_seconds() / 2)
        for u, seen in list(open_.items()):
            alive = read_json(rdir / u / ALIVE_FILE)
            if alive != seen:
                if alive and alive.get("attempt") == seen.get("attempt") and not ended_by(rdir / u, seen["attempt"]):
                    return [f"{u} (attempt {seen['attempt']})"]
                del open_[u]  # ended, or taken over meanwhile
            elif watch.quiet(rdir / u, alive):
                del open_[u]
    return []


def claim(rdir, attempt: str, job_uid: str | None, announce=lambda: None) -> str | None:
    """Claim the run for this attempt, or say why not (a refusal line; nothing written then). Reading the claim and
    writing it are two steps, and two launches starting at once would both find the run free: the one replacing
    a claim first creates claim-<sha256 of the claim's bytes as read>.json, which only one writer can create; the
    other is refused. The winner then says it is running (`announce`: its unit's first heartbeat) before the run
    names it, so a launch that reads the new claim finds that heartbeat advancing and is refused too."""
    from ..store.records import bytes_sha256, create_json, write_json

    try:
        raw = (rdir / CLAIM_FILE).read_bytes()
    except OSError:
        raw = b""
    held = read_json(rdir / CLAIM_FILE) or {}
    if held.get("attempt") == attempt:
        return _reused(rdir, held, attempt, job_uid)
    units = sorted(p.name for p in rdir.iterdir() if p.is_dir()) if rdir.is_dir() else []
    busy = running_elsewhere(rdir, attempt, units)
    if busy:
        return (f"run {rdir.name} is being written right now by another launch ({', '.join(busy[:3])}: its "
                f"heartbeat advances): a second run under one run ID; attempt {attempt} refused, nothing written")
    rdir.mkdir(parents=True, exist_ok=True)
    taken = rdir / CLAIMED.format(bytes_sha256(raw)[:32])
    if not create_json(taken, {"attempt": attempt, "job_uid": job_uid}):
        winner = read_json(taken) or {}
        if winner.get("attempt") != attempt:
            return (f"run {rdir.name} is being claimed right now by another launch (attempt "
                    f"{clip(str(winner.get('attempt')), 80)}): a second run under one run ID; attempt {attempt} "
                    "refused, nothing written")
        refused = _reused(rdir, winner, attempt, job_uid)  # else another pod of this launch won: this one goes on
        if refused:
            return refused
    announce()
    write_json(rdir / CLAIM_FILE, {"attempt": attempt, "job_uid": job_uid, "previous": held.get("attempt")})
    return None


def _reused(rdir, held: dict, attempt: str, job_uid: str | None) -> str | None:
    """Why a claim of this attempt is another Job's (the attempt reused by a new launch), or None."""
    if job_uid and held.get("job_uid") and held["job_uid"] != job_uid:
        return (f"attempt {attempt} of run {rdir.name} was launched before by Job uid "
                f"{clip(held['job_uid'], 80)}: give each launch a fresh attempt ID (deploy/README.md, "
                "'Attempts'); refused, nothing written")
    return None


def record_refusal(rdir, attempt: str, unit: str, line: str) -> None:
    """Say, beside the run (a file of this attempt's and unit's own name: nothing of the other launch is
    touched), that this unit of this attempt was refused: the attempt's merge counts the index as ended, and
    refuses to write while the run is another launch's, instead of waiting out --wait."""
    from ..store.records import write_json

    try:  # reused: this attempt holds the run from an earlier launch -- its merge must not report that one's files
        write_json(rdir / REFUSED.format(attempt, unit), {"attempt": attempt, "unit": unit, "refused": line,
                                                          "reused": holder(rdir) == attempt})
    except OSError:
        pass


def refused_unit(rdir, attempt: str | None, unit: str) -> bool:
    return attempt is not None and read_json(rdir / REFUSED.format(attempt, unit)) is not None


def refusal(rdir, attempt: str | None) -> str | None:
    """Why this attempt's merge must not write: a unit of it was refused and the run is another launch's, or
    the attempt was reused by a new launch (the files under it are the earlier launch's)."""
    if attempt is None or not rdir.is_dir():
        return None
    other = holder(rdir) not in (None, attempt)
    for f in sorted(p for p in rdir.iterdir() if p.name.startswith("refused-")):
        marker = read_json(f) or {}
        if marker.get("attempt") == attempt and marker.get("refused") and (other or marker.get("reused")):
            return marker["refused"]
    return None


def holder(rdir) -> str | None:
    """The attempt that claimed the run last (None: none did)."""
    return (read_json(rdir / CLAIM_FILE) or {}).get("attempt")
