"""Run one unit (a shard of a batch, or a node's screen): verify each of its graphs not yet answered and
write one record per graph, atomically, as it finishes.

"Answered" means a whole record under the key of the graph's current bytes, the
run's options and this gradcheck (store.py): a graph replaced since the last
run, or a run with other options or another version, is verified again.
"""
from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from ..text import clip
from .manifest import Manifest
from ..store.records import UnitStore, bytes_sha256, file_sha256, record_key
from ..store.schema import STATUSES
from .verifiers import InfraError, decode, present_faults

__all__ = ["STATUSES", "run_unit", "scan"]


def scan(manifest: Manifest, mine: list[str]) -> dict[str, str]:
    """Each graph's sha256, read now; a graph that cannot be read is left out here and fails the shard
    (exit 75) when its turn comes, after the graphs before it are recorded."""
    contents = {}
    for rel in mine:
        try:
            contents[rel] = file_sha256(manifest.path(rel))
        except OSError:
            pass
    return contents


def run_unit(manifest: Manifest, mine: list[str], store: UnitStore, plan: dict, verifier, options: dict,
             limit: float, *, faults_where_present: bool = False, onnx_import=None, stream=None) -> dict:
    """plan: the unit.json to write, with its options_sha256 and gradcheck_version; its `contents` are filled
    in here. Returns counts per status for this run (graphs already answered are counted as "skipped").
    Raises InfraError (from the verifier or a read) for the caller to turn into a retryable exit."""
    from gradcheck_core.graphio import GraphFileError

    stream = stream or sys.stderr
    opts_sha, version = plan["options_sha256"], plan["gradcheck_version"]
    contents = plan["contents"] = scan(manifest, mine)
    store.open(plan)
    label = clip(plan["label"], 300)  # names a node (screen): echoed to the log as terminal text, escaped
    keys = {rel: record_key(rel, sha, opts_sha, version) for rel, sha in contents.items()}
    done = store.done_many(keys.values())  # one concurrent batch of reads in an object store
    answered = {rel for rel, key in keys.items() if key in done}
    todo = [g for g in mine if g not in answered]
    counts = dict.fromkeys(STATUSES, 0) | {"skipped": len(answered)}
    print(f"{label}: {len(mine)} graphs, {len(answered)} already done, {len(todo)} to verify "
          f"({verifier.where}; run {clip(plan['run_id'], 300)})", file=stream, flush=True)
    started = time.perf_counter()
    for n, rel in enumerate(todo, 1):
        t0 = time.perf_counter()
        path = manifest.path(rel)
        try:
            data = path.read_bytes()
        except OSError as exc:  # the volume's fault, not the graph's: the Job retries the shard
            raise InfraError(f"{path}: cannot read: {exc.strerror or exc}") from None
        sha = bytes_sha256(data)  # the bytes verified are the bytes hashed, even if the file changed since the scan
        if contents.get(rel) != sha:
            contents[rel] = sha
            store.write_plan(plan)
            if store.done(record_key(rel, sha, opts_sha, version)):
                counts["skipped"] += 1
                continue
        try:
            graph = decode(data, str(path), onnx_import)  # a local path or an object store URL
        except GraphFileError as exc:
            outcome = {"status": "invalid", "error": str(exc)}
        else:
            opts = dict(options)
            if faults_where_present and opts.get("faults"):
                opts["faults"] = present_faults(graph, tuple(opts["faults"])) or None
            outcome = verifier.verify(graph, rel, {k: v for k, v in opts.items() if v is not None}, limit)
        seconds = time.perf_counter() - t0
        record = {"graph": rel, "unit": plan["unit"], "run_id": plan["run_id"], "shard_index": plan["shard_index"],
                  "shard_count": plan["shard_count"], "node": plan["node"], "device": None, "dtype": None,
                  "error": None, "report": None, "digests": {}, "digest_scope": None, **outcome,
                  "seconds": round(seconds, 6), "finished_at": datetime.now(timezone.utc).isoformat(),
                  "graph_sha256": sha, "options_sha256": opts_sha, "gradcheck_version": version,
                  "attempt": plan.get("attempt")}
        store.write(record)
        counts[record["status"]] += 1
        print(f"{label}: [{n}/{len(todo)}] {record['status']:<7} {clip(rel, 300)} ({seconds:.2f}s)", file=stream, flush=True)
    done = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    print(f"{label}: finished: {done or 'nothing to do'} in {time.perf_counter() - started:.1f}s",
          file=stream, flush=True)
    return counts
