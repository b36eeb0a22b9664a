"""What a unit.json and a result record must hold, checked wherever one is read.

The merge and a restarted shard read files that a killed pod, a full volume, an
older or newer gradcheck, or a person may have written. Each file is checked
against the fields below before anything uses it; a file that fails is
*damaged*: the shard verifies its graph again, and the merge names the file and
counts its graph as missing (exit 4), instead of crashing, guessing or counting
an unknown status nowhere. Extra keys are allowed (a later version may add some).
"""
from __future__ import annotations

import json
import math
import re

from ..text import clip

STATUSES = ("pass", "fail", "invalid", "timeout", "error")
MODES = ("batch", "screen")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class Damaged(ValueError):
    """A results file that cannot be used; the message is one line, without the path (the caller adds it)."""


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v) -> bool:
    return isinstance(v, str) and v != ""


def _opt_str(v) -> bool:
    return v is None or isinstance(v, str)


def _hex(v) -> bool:
    return isinstance(v, str) and _HEX64.fullmatch(v) is not None


def _seconds(v) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v) and v >= 0


def _names(v) -> bool:
    return isinstance(v, list) and bool(v) and all(_str(g) for g in v) and len(set(v)) == len(v)


def _hex_map(v) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _hex(x) for k, x in v.items())


# field -> (test, what it must be)
UNIT = {
    "mode": (lambda v: isinstance(v, str) and v in MODES, "one of " + ", ".join(MODES)),
    "unit": (_str, "a non-empty string"),
    "label": (_str, "a non-empty string"),
    "run_id": (_str, "a non-empty string"),
    "shard_index": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "shard_count": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "node": (_opt_str, "a string or null"),
    "manifest_root": (lambda v: isinstance(v, str), "a string"),
    "graphs": (_names, "a non-empty list of distinct graph names"),
    "contents": (_hex_map, "an object of graph name -> sha256"),
    "where": (_str, "a non-empty string"),
    "options": (lambda v: isinstance(v, dict), "an object"),
    "keyed_options": (lambda v: isinstance(v, dict), "an object"),
    "options_sha256": (_hex, "a sha256 (64 hex digits)"),
    "gradcheck_version": (_str, "a non-empty string"),
    "started_at": (_str, "a non-empty string"),
}

RECORD = {
    "graph": (_str, "a non-empty string"),
    "status": (lambda v: isinstance(v, str) and v in STATUSES, "one of " + ", ".join(STATUSES)),
    "unit": (_str, "a non-empty string"),
    "run_id": (_str, "a non-empty string"),
    "shard_index": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "shard_count": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "node": (_opt_str, "a string or null"),
    "device": (_opt_str, "a string or null"),
    "dtype": (_opt_str, "a string or null"),
    "error": (_opt_str, "a string or null"),
    "report": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "digests": (_hex_map, "an object of parameter -> sha256"),
    "digest_scope": (_opt_str, "a string or null"),
    "seconds": (_seconds, "a finite number >= 0"),
    "finished_at": (_str, "a non-empty string"),
    "graph_sha256": (_hex, "a sha256 (64 hex digits)"),
    "options_sha256": (_hex, "a sha256 (64 hex digits)"),
    "gradcheck_version": (_str, "a non-empty string"),
}


def _kind(v) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number")


def _fields(obj, spec: dict) -> dict:
    if not isinstance(obj, dict):
        raise Damaged(f"not a JSON object but {_kind(obj)}")
    for name, (ok, want) in spec.items():
        if name not in obj:
            raise Damaged(f"missing '{name}'")
        if not ok(obj[name]):
            raise Damaged(f"'{name}' must be {want}, not {_kind(obj[name])}"
                          + (f" {json.dumps(obj[name])[:40]}" if isinstance(obj[name], (str, int, float)) else ""))
    return obj


def parse(data: bytes):
    """JSON text -> value; Damaged for anything else (NaN and Infinity included: records are written without)."""
    def no_constant(name):
        raise Damaged(f"not JSON: {name} is not a JSON value")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError:
        raise Damaged("not JSON: not UTF-8 text") from None
    except RecursionError:
        raise Damaged("not JSON: nested too deeply") from None
    except json.JSONDecodeError as exc:
        cut = exc.msg.startswith("Unterminated string") or (  # ends mid-value
            exc.msg != "Extra data" and _cut_token(exc.doc[exc.pos:].rstrip()))
        what = "empty" if not data.strip() else "truncated" if cut else "malformed"
        raise Damaged(f"not JSON ({what}): {exc.msg} (line {exc.lineno}, column {exc.colno})") from None


def _cut_token(rest: str) -> bool:
    """What follows the parser's complaint is nothing, or the start of a number or literal the file ends in
    (`1e-`, `tru`): the file was cut there, not written wrong."""
    return (not rest or re.fullmatch(r"[0-9.eE+-]+", rest) is not None
            or any(w.startswith(rest) for w in ("true", "false", "null")))


# written since attempts (attempt.py); a file from before has none, and is read as of no attempt
OPTIONAL = {"attempt": (_opt_str, "a string or null")}


def check_unit(obj, unit_dir: str) -> dict:
    plan = _fields(obj, UNIT)
    if "attempt" in plan:
        _fields({"attempt": plan["attempt"]}, OPTIONAL)
    if plan["unit"] != unit_dir:
        raise Damaged(f"names unit '{clip(plan['unit'])}' but lies in '{clip(unit_dir)}'")
    if plan["shard_index"] >= plan["shard_count"]:
        raise Damaged(f"shard_index {plan['shard_index']} is not below shard_count {plan['shard_count']}")
    if not set(plan["contents"]) <= set(plan["graphs"]):
        raise Damaged("'contents' names a graph that 'graphs' does not list")
    return plan


def check_record(obj) -> dict:
    r = _fields(obj, RECORD)
    if "attempt" in r:
        _fields({"attempt": r["attempt"]}, OPTIONAL)
    if r["shard_index"] >= r["shard_count"]:
        raise Damaged(f"shard_index {r['shard_index']} is not below shard_count {r['shard_count']}")
    if r["status"] in ("pass", "fail"):
        _check_report(r["report"], r["status"])
    elif r["error"] is None:
        raise Damaged(f"status '{r['status']}' without an 'error'")
    return r


def _check_report(report, status: str) -> None:
    """The parts of a report the merge and its writers read: the verdict, the rows and the findings (the
    client's Report reads the rest with defaults). A "pass" whose own rows say otherwise is a wrong answer
    looking right: damaged, not counted."""
    if not isinstance(report, dict):
        raise Damaged(f"status '{status}' without a 'report' object")
    if report.get("verdict") != status:
        raise Damaged(f"'status' is {status} but the report's verdict is {_kind(report.get('verdict'))} "
                      f"{json.dumps(report.get('verdict'))[:20]}")
    for key in ("parameters", "findings"):
        items = report.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise Damaged(f"report '{key}' must be a list of objects")
    if status == "pass" and (any(p.get("status") == "FAIL" for p in report.get("parameters", []))
                             or any(f.get("severity") == "error" for f in report.get("findings", []))):
        raise Damaged("'status' is pass but the report holds a FAIL row or an error finding")
