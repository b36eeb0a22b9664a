"""Run one unit (a shard of a batch, or a node's screen): verify each of its graphs not yet done and
write one record per graph, atomically, as it finishes."""
from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from ..text import clip
from .manifest import Manifest
from .store import UnitStore
from .verifiers import load, present_faults

STATUSES = ("pass", "fail", "invalid", "timeout", "error")


def run_unit(manifest: Manifest, mine: list[str], store: UnitStore, plan: dict, verifier, options: dict,
             limit: float, *, faults_where_present: bool = False, stream=None) -> dict:
    """Returns counts per status for this run (graphs skipped as already done are counted as "skipped").
    Raises InfraError (from the verifier or a read) for the caller to turn into a retryable exit."""
    from gradcheck_client.graphio import GraphFileError

    stream = stream or sys.stderr
    store.open(plan)
    label = clip(plan["label"], 300)  # names a node (screen): echoed to the log as terminal text, escaped
    todo = [g for g in mine if not store.done(g)]
    counts = dict.fromkeys(STATUSES, 0) | {"skipped": len(mine) - len(todo)}
    print(f"{label}: {len(mine)} graphs, {counts['skipped']} already done, {len(todo)} to verify "
          f"({verifier.where})", file=stream, flush=True)
    started = time.perf_counter()
    for n, rel in enumerate(todo, 1):
        t0 = time.perf_counter()
        try:
            graph = load(manifest.path(rel))
        except GraphFileError as exc:
            outcome = {"status": "invalid", "error": str(exc)}
        else:
            opts = dict(options)
            if faults_where_present and opts.get("faults"):
                opts["faults"] = present_faults(graph, tuple(opts["faults"])) or None
            outcome = verifier.verify(graph, rel, {k: v for k, v in opts.items() if v is not None}, limit)
        seconds = time.perf_counter() - t0
        record = {"graph": rel, "unit": plan["unit"], "shard_index": plan["shard_index"],
                  "shard_count": plan["shard_count"], "node": plan["node"], "device": None, "dtype": None,
                  "error": None, "report": None, "digests": {}, "digest_scope": None, **outcome,
                  "seconds": round(seconds, 6), "finished_at": datetime.now(timezone.utc).isoformat()}
        store.write(record)
        counts[record["status"]] += 1
        print(f"{label}: [{n}/{len(todo)}] {record['status']:<7} {clip(rel, 300)} ({seconds:.2f}s)", file=stream, flush=True)
    done = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    print(f"{label}: finished: {done or 'nothing to do'} in {time.perf_counter() - started:.1f}s",
          file=stream, flush=True)
    return counts
