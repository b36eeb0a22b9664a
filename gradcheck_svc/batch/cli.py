"""The batch commands of gradcheck-svc: batch, batch-merge, screen.

Exit codes of `batch` and `screen`, for a Job's podFailurePolicy:
  0   the unit finished; mismatches, invalid graphs and timeouts are results in the records (a timeout:
      the graph ran past --time-limit, or --max-request-seconds where given and lower, and was stopped;
      its record names the limit and the flag; the unit went on with its other graphs)
  2   bad usage or configuration (flags, a missing manifest, a glob or list naming no graph): retrying cannot
      help -> FailIndex
  75  infrastructure failure (unreadable or empty graphs volume, unwritable output, out of memory, server
      unreachable, no GPU; a screen pod on a node outside --expect-nodes or one another index screened): retrying,
      possibly on another node, can -> counted against backoffLimitPerIndex
  3   internal error (counted and retried like 75); 137 is the kernel's SIGKILL (OOM killer), also retried;
      143 SIGTERM (the Job deleted, its deadline): the records written so far stay, the ending is recorded
  With an attempt (--attempt, $GRADCHECK_ATTEMPT: attempt.py), 2 also when another launch of the run is running
  now, or this attempt was launched before by another Job: one line, nothing written.
`batch-merge`: 0 every graph passed, 1 a graph failed (screen: a node disagrees), 2 bad usage (nothing to
  merge: no run, several runs and no --run-id, batch and screen mixed), 4 incomplete: results missing,
  present twice (copied into two shards' folders), damaged (each file named), made under other options
  or versions (unless --allow-mixed), a screen's listed node not screened or undecided, or no graphs at all
  (named on stderr; what was set aside -- superseded -- is listed, not counted). --exit-zero: 0 whenever the
  report is written. 75: the results could not be read (an object store unreachable): retry. --wait: 143
  when a SIGTERM cut the wait (or the merge) short, after the report is written.
Each attempt of a unit records how it ended (ended.json: its exit code, its error line, whether it was the
index's last, and the attempt), which a waiting merge watches; a usage error caught by argparse too. A merge
that cannot write its report to a full or failing volume exits 75 after the report's lines (retry once freed).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gradcheck_core.options import add_option_flags, values_from_args

EXIT_OK, EXIT_USAGE, EXIT_INTERNAL, EXIT_RETRY = 0, 2, 3, 75
EXIT_TERMINATED = 143  # 128 + SIGTERM: a waiting merge stopped early (its report is written; the Job retries it)
# batch-merge --wait looks every half heartbeat (GRADCHECK_HEARTBEAT_SECONDS, default 10: every 5 s), as the
# heartbeat watch of a starting shard does: nothing it waits for changes faster than the shards' heartbeats
WAIT_POLL_BEATS = 0.5


def _verify_options(p: argparse.ArgumentParser, exclude: tuple = ()) -> None:
    """The verification options of `verify` (one table, gradcheck_core/options.py), the time limit and
    the run ID."""
    from ..limits import add_limit_flags

    add_option_flags(p, exclude=exclude)
    add_limit_flags(p, server=False, what="in-process, as `verify`'s; with --server, the server's own apply")
    p.add_argument("--time-limit", type=float, default=300.0, metavar="SECONDS",
                   help="per-graph time limit (in-process, --max-request-seconds too when given and lower): a "
                        "graph over it is stopped and recorded as timeout, and the unit goes on (default 300)")
    p.add_argument("--run-id", default=None, metavar="ID",
                   help="results go to OUT/runs/ID/ (default $GRADCHECK_RUN_ID -- in a Job, the Job's name "
                        "from the downward API -- else 'default')")
    _attempt_flag(p)


def _attempt_flag(p) -> None:
    p.add_argument("--attempt", default=None, metavar="ID",
                   help="this launch of the run (default $GRADCHECK_ATTEMPT; in a Job, settings.yaml `attempt`, fresh "
                        "per apply): every file carries it, the merge of the attempt settles only on its own markers, "
                        "and a second launch under the run ID while this one runs is refused; empty is refused "
                        "(default: in a Job, job-UID, its $GRADCHECK_JOB_UID; a merge, the attempt holding the "
                        "run; by hand, none)")


def add_parsers(sub) -> None:
    """The batch, batch-merge and screen subcommands, added to the service CLI's subparsers."""
    _add_batch(sub)
    _add_merge(sub)
    _add_screen(sub)


def _add_batch(sub) -> None:
    b = sub.add_parser("batch", help="verify one shard of many graphs, one result file per graph (Indexed Jobs)",
                       description="Verify one shard of a manifest's graphs, one result file per graph. "
                                   "--fault applies to every graph of the manifest (a graph without that node is "
                                   "recorded invalid): a canary run that checks the pipeline reports a bad gradient.")
    b.add_argument("--manifest", required=True, metavar="FILE|DIR|GLOB",
                   help="the graphs: a directory, a glob, one graph, or a list file (one path per line); local, "
                        "or an s3://, gs:// or az:// URL")
    b.add_argument("--shard-index", type=int, default=None, metavar="I",
                   help="this shard (default: $JOB_COMPLETION_INDEX, as an Indexed Job sets it)")
    b.add_argument("--shard-count", type=int, default=1, metavar="N", help="number of shards (default 1)")
    b.add_argument("--out", required=True, metavar="DIR|URL",
                   help="results directory shared by all shards, or an s3://, gs:// or az:// URL (a prefix)")
    b.add_argument("--server", default=None, metavar="TARGET",
                   help="verify on this server (e.g. dns:///gradcheck-headless:50051); default in-process")
    b.add_argument("--token-file", default=None, metavar="FILE",
                   help="bearer token for --server (default $GRADCHECK_TOKEN)")
    b.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="recorded in each result (default $NODE_NAME, from the downward API)")
    _verify_options(b)
    from gradcheck_core.onnx_options import add_onnx_flags

    add_onnx_flags(b)  # how each .onnx model of the manifest is imported (the same for all of them)
    _ends_on_usage_error(b)


def _ends_on_usage_error(parser) -> None:
    """A shard that argparse refuses (exit 2, before batch() runs: a flag mistyped in the manifest) still ends
    its index: the arguments it was given are read leniently for the unit (--out, --run-id, the index, the
    attempt) and its ended.json written, so the merge waiting on it stops waiting."""
    seen, parse, error = {}, parser.parse_known_args, parser.error

    def parse_known_args(args=None, namespace=None):
        seen["argv"] = list(args or [])
        return parse(args, namespace)

    def on_error(message):
        try:
            _usage_ending(seen.get("argv", []), message)
        except Exception:  # noqa: BLE001 -- best effort: the usage error itself is what must be said
            pass
        error(message)

    parser.parse_known_args, parser.error = parse_known_args, on_error


def _usage_ending(argv: list, message: str) -> None:
    from .attempt import holder, unit_attempt
    from ..store.location import location
    from ..store.records import UnitStore, code_version, run_dir, unit_name, write_ended

    lenient = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for flag in ("--out", "--run-id", "--attempt", "--shard-index", "--shard-count"):
        lenient.add_argument(flag, default=None)
    ns, _ = lenient.parse_known_args(argv)
    if ns.out is None:
        return
    out, count = location(ns.out, "--out"), int(ns.shard_count or 1)
    index = completion_index(None if ns.shard_index is None else int(ns.shard_index), "--shard-index")
    attempt, run_id = unit_attempt(ns.attempt), _run_id(ns)
    if not 0 <= index < count or holder(run_dir(out, run_id)) not in (None, attempt):
        return  # no such index; or another launch holds the run: its files are not this pod's to write
    write_ended(UnitStore(out, run_id, unit_name(index)).dir, EXIT_USAGE, True, _now(), attempt, code_version(),
                message[:500])


def _add_merge(sub) -> None:
    m = sub.add_parser("batch-merge", help="merge batch or screen results into JSON, JUnit and Markdown")
    m.add_argument("dir", metavar="DIR", help="the --out directory (or URL) of the batch or screen")
    m.add_argument("--json", default=None, metavar="FILE",
                   help="merged JSON report (default DIR/runs/ID/merged.json)")
    m.add_argument("--junit", default=None, metavar="FILE", help="JUnit XML (default DIR/runs/ID/junit.xml)")
    m.add_argument("--summary-md", default=None, metavar="FILE",
                   help="Markdown summary (default DIR/runs/ID/summary.md)")
    m.add_argument("--run-id", default=None, metavar="ID|latest",
                   help="the run to merge (OUT/runs/ID); 'latest': the run whose unit started last; "
                        "default: the only run (several runs without --run-id: exit 2)")
    m.add_argument("--exit-zero", action="store_true",
                   help="exit 0 once the report is written, whatever the verdict (a Kubernetes merge Job then "
                        "succeeds; the verdict is in the log, merged.json and --verdict-file); usage errors still 2 "
                        "(default: the verdict's exit code)")
    m.add_argument("--verdict-file", default=None, metavar="FILE",
                   help="write the one-line verdict here too (in a pod: /dev/termination-log, shown in the pod's "
                        "status; default none)")
    m.add_argument("--allow-mixed", action="store_true",
                   help="merge results made under different options or gradcheck versions (default: exit 4, "
                        "naming them)")
    m.add_argument("--shard-count", type=int, default=None, metavar="N",
                   help="a batch's shard count: units made with another are set aside (superseded) and named; "
                        "only their records that answer the current question count (default: the newest unit's)")
    m.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help="started with the shards (or screen pods): wait until every shard of the run (every node "
                        "of a screen) has ended its last attempt -- finished, or failed for good -- or SECONDS have "
                        "passed, then merge what is there (checked every half heartbeat, GRADCHECK_HEARTBEAT_SECONDS/2:"
                        " 5 s by default); on SIGTERM (evicted, or the Job ended) merge at once, write the report, and "
                        "exit 143 (default: merge now)")
    m.add_argument("--manifest", default=None, metavar="FILE|DIR|GLOB",
                   help="the graphs the shards read (the same spec as batch --manifest): the graph set and each "
                        "graph's content are read from it now, so a graph added, removed or replaced since the "
                        "shards ran is missing, set aside or stale, never reported from an old answer (default: "
                        "the set the newest unit recorded)")
    _attempt_flag(m)
    m.add_argument("--expect-nodes", default=None, metavar="NODES|@FILE",
                   help="a screen's intended nodes, added to those its units recorded: each one not screened is "
                        "named, exit 4 (the same syntax as screen's; default: only the recorded ones)")


def _add_screen(sub) -> None:
    s = sub.add_parser("screen", help="run the screening suite on this node (one pod per node)",
                       description="Run the screening suite (example and generated graphs) on this node. "
                                   "--fault plants a fault in every graph of the suite that has that node "
                                   "(deploy/README.md: it shows what a bad node looks like).")
    s.add_argument("--out", required=True, metavar="DIR|URL",
                   help="results directory shared by all nodes, or an s3://, gs:// or az:// URL (a prefix)")
    s.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node (default $NODE_NAME from the downward API, else the host name)")
    s.add_argument("--examples", default=os.environ.get("GRADCHECK_EXAMPLES"), metavar="DIR",
                   help="bundled example graphs to include (default $GRADCHECK_EXAMPLES, else the source "
                        "tree's examples/graphs when present; 'none' for none)")
    s.add_argument("--generated", type=int, default=16, metavar="N", help="generated graphs (default 16)")
    s.add_argument("--size", type=int, default=8, metavar="N", help="generated graphs' width (default 8)")
    s.add_argument("--suite-seed", type=int, default=0, metavar="N",
                   help="seed of the generated graphs (same on every node; default %(default)s)")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: the node's GPU when one is usable, else the CPU (default auto)")
    s.add_argument("--expect-nodes", default=os.environ.get("GRADCHECK_EXPECT_NODES"), metavar="NODES|@FILE",
                   help="the nodes this screen is meant to cover, recorded for the merge (which names each one not "
                        "screened): names separated by commas, spaces or newlines, as `kubectl get nodes -l SELECTOR "
                        "-o name` prints them; @FILE reads them from FILE. This node must be one of them, else exit "
                        "75 (retried elsewhere) (default $GRADCHECK_EXPECT_NODES; none: not checked)")
    s.add_argument("--node-count", type=int, default=os.environ.get("GRADCHECK_NODE_COUNT"), metavar="N",
                   help="how many screen pods were launched (the Job's completions): with --expect-nodes, a list of "
                        "another length is refused, exit 2 -- pods for nodes that do not exist would wait for ever, "
                        "nodes without a pod would go unscreened (default $GRADCHECK_NODE_COUNT; none: not checked)")
    _verify_options(s, exclude=("device",))  # screen's --device also takes auto (the node's GPU if any)


def _check_common(args):
    """Every option checked before any graph is read: a bad one is exit 2 naming its flag, not an
    "invalid" record for each graph. Against a server, its own limits apply, not the defaults here.
    Returns the limits in force in-process (`--max-...`, else the defaults)."""
    from gradcheck_core.options import MAX_SECONDS, flag_of

    from ..errors import LimitError, OptionError
    from ..limits import ServerLimits, limit_flag_values
    from ..request import verify_options

    if not args.time_limit > 0:  # NaN too
        raise OptionError("must be positive", field="--time-limit")
    if args.time_limit > MAX_SECONDS:
        raise OptionError(f"must be at most {MAX_SECONDS}", field="--time-limit")
    given = {k: v for k, v in limit_flag_values(args).items() if v is not None}
    if given and getattr(args, "server", None) is not None:  # silently ignored would be worse
        raise OptionError("applies in-process only: with --server, the server's own limits apply",
                          field="--" + next(iter(given)).replace("_", "-"))
    limits = ServerLimits.from_flags(given)
    values = values_from_args(args)
    if "device" in values and values["device"] == "auto":  # screen's own choice, resolved per node
        values = {k: v for k, v in values.items() if k != "device"}
    try:
        verify_options(values, limits, field=flag_of)  # every option checked, each error naming its flag
    except LimitError:
        if getattr(args, "server", None) is None:
            raise
    return limits


def _graph_limit(args) -> tuple[float, str]:
    """The per-graph limit in force and the flag that raises it: --time-limit, or --max-request-seconds
    where it is given and lower (in-process only: with --server, _check_common refuses it)."""
    given = getattr(args, "max_request_seconds", None)
    if given is not None and given <= args.time_limit:
        return given, "--max-request-seconds"
    return args.time_limit, "--time-limit"


def _run_id(args) -> str:
    from ..errors import OptionError
    from ..store.records import DEFAULT_RUN, LATEST, RUN_ID, RUN_ID_MAX

    run_id = args.run_id if args.run_id is not None else os.environ.get("GRADCHECK_RUN_ID") or DEFAULT_RUN
    if not RUN_ID.fullmatch(run_id) or run_id == LATEST:
        raise OptionError(f"'{run_id[:80]}' is not a run ID: it names the Job, so a DNS label -- lower-case "
                          f"letters, digits and '-', a letter or digit at each end, at most {RUN_ID_MAX} characters "
                          f"(not '{LATEST}')", field="--run-id")
    return run_id


def _keyed_options(args, requested: dict, onnx_import=None) -> dict:
    """What shapes a result, hashed into every record's key: the verification options as asked for (screen's
    --device auto before it is resolved per node), the per-graph time limit, the limits given, and how
    .onnx models are imported (the OnnxImport message, input tensors included, as a sha256)."""
    from ..limits import limit_flag_values
    from ..store.records import bytes_sha256

    keyed = dict(requested, time_limit=args.time_limit)
    keyed |= {k: v for k, v in limit_flag_values(args).items() if v is not None}
    if onnx_import is not None:
        keyed["onnx_import"] = bytes_sha256(onnx_import.SerializeToString(deterministic=True))
    return keyed


_SAID: list[str] = []  # this process's last failure line, recorded in the unit's ended.json (the merge shows it)


def _fail(label: str, what: str) -> None:
    from ..text import clip

    _SAID[:] = [clip(what, 500)]
    print(f"gradcheck-svc {label}: {what}", file=sys.stderr)


def _run(run, label: str) -> int:
    """Map what a unit can raise to the exit codes above."""
    from .verifiers import InfraError

    try:
        run()
    except InfraError as exc:
        _fail(label, f"infrastructure failure, retry (exit {EXIT_RETRY}): {exc}")
        return EXIT_RETRY
    except MemoryError:
        _fail(label, f"out of memory, retry (exit {EXIT_RETRY})")
        return EXIT_RETRY
    except OSError as exc:  # the results volume: full, read-only, gone (store.atomic_write names the file)
        _fail(label, f"infrastructure failure, retry (exit {EXIT_RETRY}): {exc.filename or '(no path)'}: "
                     f"{exc.strerror or exc}")
        return EXIT_RETRY
    return EXIT_OK


def _last_attempt() -> bool:
    """Whether a retryable failure now is this index's last: the Job controller's count of its earlier failed
    pods (GRADCHECK_INDEX_FAILURES, the pod's batch.kubernetes.io/job-index-failure-count annotation through
    the downward API) has reached backoffLimitPerIndex (GRADCHECK_INDEX_RETRIES). Unknown (by hand): not."""
    from .attempt import index_count

    failures, retries = index_count("GRADCHECK_INDEX_FAILURES"), index_count("GRADCHECK_INDEX_RETRIES")
    return failures is not None and retries is not None and failures >= retries


class Terminated(BaseException):
    """SIGTERM in a unit (the Job deleted, the pod evicted, its deadline): end as 143, the ending recorded."""


def _ending(unit_dir, started_at: str, body, mine=lambda: True, attempt: str | None = None,
            heartbeat: bool = True, label: str = "batch") -> int:
    """Run body() and record how this attempt of the unit ended (store.write_ended), for a merge waiting on the
    run (batch-merge --wait): finished (0) and refused (2: FailIndex) are the unit's last attempt; a retryable
    failure (75, 3, a SIGTERM's 143) is when the index has no retry left. While it runs, a heartbeat
    (attempt.py) says so; a SIGKILL ends it without a word, and the merge sees the heartbeat stop."""
    import signal

    from ..errors import GradcheckError
    from .attempt import Heartbeat
    from ..store.records import code_version, write_ended

    def ended(code: int, final: bool) -> None:
        if beat is not None:
            beat.stop()
        if mine():  # a screen pod refused on another index's node leaves that node's unit alone
            write_ended(unit_dir, code, final, started_at, attempt, code_version(), (_SAID or [None])[-1])

    def term(signum, frame):
        raise Terminated()

    _SAID.clear()
    beat = Heartbeat(unit_dir, attempt, _last_attempt()).start() if attempt is not None and heartbeat else None
    previous = signal.signal(signal.SIGTERM, term)
    try:
        code = body()
    except GradcheckError as exc:
        _SAID[:] = [str(exc)[:500]]
        ended(EXIT_USAGE, True)
        raise
    except Terminated:
        _fail(label, f"terminated (SIGTERM): the records written so far stay (exit {EXIT_TERMINATED})")
        ended(EXIT_TERMINATED, _last_attempt())
        return EXIT_TERMINATED
    except Exception as exc:  # an internal error (exit 3): retried like 75
        _SAID[:] = [f"internal error: {type(exc).__name__}"]
        ended(EXIT_INTERNAL, _last_attempt())
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code is not None:
        ended(code, code in (EXIT_OK, EXIT_USAGE) or _last_attempt())
    return code


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat()


def _plan(mode, unit, label, index, count, node, manifest, verifier, options, run_id, keyed, started_at,
          attempt) -> dict:
    from ..store.records import options_sha256

    return {"mode": mode, "unit": unit, "label": label, "run_id": run_id, "shard_index": index,
            "shard_count": count, "node": node, "manifest_root": str(manifest.root), "graphs": list(manifest.graphs),
            "contents": {}, "where": verifier.where, "options": options, "keyed_options": keyed,
            "options_sha256": options_sha256(keyed), "gradcheck_version": verifier.version,
            "started_at": started_at, "attempt": attempt, "job_uid": os.environ.get("GRADCHECK_JOB_UID") or None}


def batch(args) -> int:
    from ..errors import OptionError
    from .attempt import check_environment, unit_attempt
    from ..store.location import location
    from ..store.records import UnitStore, run_dir, unit_name

    check_environment()  # a GRADCHECK_* setting that is garbage: exit 2 naming it, nothing written
    # where this unit's ending is recorded first, so that a refused option (exit 2) is recorded too
    out = location(args.out, "--out")
    index = completion_index(args.shard_index, "--shard-index")
    if args.shard_count < 1:
        raise OptionError("must be at least 1", field="--shard-count")
    if not 0 <= index < args.shard_count:
        raise OptionError(f"{index} is not in 0..{args.shard_count - 1}", field="--shard-index")
    run_id, started_at, attempt = _run_id(args), _now(), unit_attempt(args.attempt)
    unit, label = unit_name(index), f"shard {index}/{args.shard_count}"
    store = UnitStore(out, run_id, unit)
    if attempt is not None:
        # the claim may watch an earlier launch's heartbeats for a minute: a SIGTERM (143) or a failing store (75)
        # meanwhile ends this try with its ending recorded, as later ones do; a claim decided writes none here
        refused = []

        def claiming() -> int:
            return _run(lambda: refused.append(_claimed(run_dir(out, run_id), attempt, store.dir)), "batch")

        code = _ending(store.dir, started_at, claiming, mine=lambda: not refused, attempt=attempt, heartbeat=False)
        if code != EXIT_OK:
            return code
        if refused[0]:  # another launch is writing this run: nothing of it is touched, not even an ending
            from .attempt import record_refusal

            record_refusal(run_dir(out, run_id), attempt, unit, refused[0])
            print(f"gradcheck-svc batch: {refused[0]} (exit {EXIT_USAGE})", file=sys.stderr)
            return EXIT_USAGE
    args.attempt = attempt
    return _ending(store.dir, started_at, lambda: _batch_unit(args, index, run_id, unit, label, store, started_at),
                   attempt=attempt)


def _claimed(rdir, attempt: str, unit_dir) -> str | None:
    """Why this launch may not write the run (attempt.claim), or None (an OSError: _run's exit 75). Claiming it,
    the unit's heartbeat beats once before the run names this attempt (the heartbeat proper starts in _ending)."""
    from .attempt import Heartbeat, claim

    announce = Heartbeat(unit_dir, attempt, _last_attempt()).announce
    return claim(rdir, attempt, os.environ.get("GRADCHECK_JOB_UID") or None, announce)


def _batch_unit(args, index, run_id, unit, label, store, started_at) -> int:
    from ..store.location import location
    from .runner import run_unit

    limits = _check_common(args)
    location(args.manifest, "--manifest")  # a URL whose backend is missing: exit 2 before anything runs
    onnx_import = _onnx_import(args)
    options = values_from_args(args)
    verifier = _verifier(args, options, limits)

    def run():  # inside _run: an unreadable manifest volume is an infrastructure failure (exit 75)
        manifest = _load_graphs(args.manifest)
        verifier.check()  # first: against a server, its version is part of every record's key
        plan = _plan("batch", unit, label, index, args.shard_count, args.node_name, manifest, verifier, options,
                     run_id, _keyed_options(args, options, onnx_import if _has_onnx(manifest) else None), started_at,
                     args.attempt)
        run_unit(manifest, manifest.shard(index, args.shard_count), store, plan,
                 verifier, options, _graph_limit(args)[0], onnx_import=onnx_import)

    try:
        return _run(run, "batch")
    finally:
        getattr(verifier, "close", lambda: None)()


def _load_graphs(spec: str):
    """The shard's manifest. A directory that exists and holds no graph is a volume not (yet) populated -- a
    claim bound to the wrong export, an init container's copy cut short -- which a retry can fix: exit 75, not 2.
    A glob or list file naming nothing is the configuration's (exit 2)."""
    from ..errors import OptionError
    from .manifest import load_manifest
    from .verifiers import InfraError

    try:
        return load_manifest(spec)
    except OptionError as exc:
        if exc.reason.startswith("no graphs") and Path(spec).is_dir():
            raise InfraError(f"{exc.reason}: an empty volume (not mounted, or not yet populated?)") from None
        raise


def _verifier(args, options, limits):
    from .verifiers import LocalVerifier, RemoteVerifier

    if getattr(args, "server", None):
        from ..config import read_token

        return RemoteVerifier(args.server, options, token=read_token(args.token_file))
    return LocalVerifier(options, limits, limit_flag=_graph_limit(args)[1])


def _has_onnx(manifest) -> bool:
    from gradcheck_core.onnx_options import is_onnx

    return any(is_onnx(g) for g in manifest.graphs)


def _onnx_import(args):
    """The OnnxImport message of the --params/--input/... flags (tensor files read now: a missing one is
    exit 2 before any graph), for every .onnx model of the manifest."""
    from gradcheck_core.onnx_options import OnnxFlagError, onnx_import_message

    from ..errors import OptionError

    try:
        return onnx_import_message(args)
    except OnnxFlagError as exc:
        raise OptionError(str(exc)) from None


def completion_index(given: int | None, field: str, *, required: bool = True) -> int | None:
    """The index a flag gives, else $JOB_COMPLETION_INDEX (an Indexed Job's pod); without either, an
    OptionError naming the flag, or None when not `required` (a screen run by hand)."""
    from ..errors import OptionError

    if given is not None:
        return given
    env = os.environ.get("JOB_COMPLETION_INDEX")
    if env is None:
        if not required:
            return None
        raise OptionError("not given and $JOB_COMPLETION_INDEX is not set", field=field)
    try:
        return int(env)
    except ValueError:
        raise OptionError(f"$JOB_COMPLETION_INDEX '{env[:40]}' is not an integer", field=field) from None


def _wrong_node(out, node: str, expected, index, run_id) -> str | None:
    """Why this pod must not screen here (exit 75: the Job controller retries the index, elsewhere), or None."""
    from ..text import clip
    from . import screen as screen_nodes
    from ..store.records import run_dir, unit_name

    if expected is not None and node not in expected:
        return (f"node {clip(node, 200)} is not among the {len(expected)} expected node(s) (--expect-nodes): "
                "a pod landed outside the list written at launch; retry elsewhere")
    if index is None:
        return None
    unit_dir = run_dir(out, run_id) / unit_name(node=node)
    owner = screen_nodes.claimed_by(unit_dir)
    if owner is None or owner == index:
        return None
    screen_nodes.record_landing(unit_dir, node, index, owner)
    return (f"node {clip(node, 200)} was screened by index {owner} in run {clip(run_id, 200)}; index {index} "
            "landed on it again (its landing is recorded for the merge); retry elsewhere")


def _screen_suite_and_nodes(args) -> list[str] | None:
    """Check screen's own options (the suite's size, --expect-nodes against --node-count): the nodes
    the screen is meant to cover, or None when not given."""
    from ..errors import OptionError
    from . import screen as screen_nodes

    if args.generated < 0:
        raise OptionError("must be 0 or more", field="--generated")
    if args.size < 1:
        raise OptionError("must be at least 1", field="--size")
    expected = screen_nodes.parse_nodes(args.expect_nodes) if args.expect_nodes is not None else None
    if args.node_count is not None and args.node_count < 1:  # (argparse converts $GRADCHECK_NODE_COUNT too)
        raise OptionError("must be at least 1", field="--node-count")
    if expected is not None and args.node_count is not None and len(expected) != args.node_count:
        raise OptionError(f"{args.node_count} screen pod(s) for the {len(expected)} node(s) of --expect-nodes: "
                          "launch one pod per listed node (settings.yaml `nodes`)", field="--node-count")
    return expected


def screen(args) -> int:
    import socket
    import tempfile

    from . import screen as screen_nodes
    from .attempt import check_environment, unit_attempt
    from ..store.location import location
    from .manifest import load_manifest
    from .runner import run_unit
    from ..store.records import UnitStore, unit_name
    from .verifiers import InfraError

    check_environment()  # a GRADCHECK_* setting that is garbage: exit 2 naming it, nothing written
    limits = _check_common(args)
    out = location(args.out, "--out")
    expected = _screen_suite_and_nodes(args)
    node = args.node_name or socket.gethostname()
    run_id, started_at, attempt = _run_id(args), _now(), unit_attempt(args.attempt)
    index = completion_index(None, "screen", required=False)
    keyed = _keyed_options(args, values_from_args(args))  # --device auto as asked: the same on every node
    if args.device == "auto":  # asked in the verifying child (verifiers.cuda_usable): CUDA does not survive a fork
        from .verifiers import cuda_usable

        try:
            args.device = "cuda" if cuda_usable() else "cpu"
        except InfraError as exc:
            print(f"gradcheck-svc screen: infrastructure failure, retry (exit {EXIT_RETRY}): {exc}", file=sys.stderr)
            return EXIT_RETRY
    options = values_from_args(args)
    with tempfile.TemporaryDirectory(prefix="gradcheck-screen-") as tmp:  # /tmp: an emptyDir in the pod
        suite = {"examples": screen_nodes.examples_dir(args.examples), "generated": args.generated,
                 "size": args.size, "seed": args.suite_seed}
        screen_nodes.build_suite(Path(tmp), **suite)
        manifest = load_manifest(tmp, field="--examples")
        verifier = _verifier(args, options, limits)
        unit = unit_name(node=node)
        store, refused_here = UnitStore(out, run_id, unit), []

        def run():
            refused = _wrong_node(out, node, expected, index, run_id)
            if refused:
                refused_here.append(refused)
                raise InfraError(refused)
            verifier.check()
            plan = _plan("screen", unit, f"node {node}", 0, 1, node, manifest, verifier, options, run_id, keyed,
                         started_at, attempt)
            plan["manifest_root"] = "screen-suite"  # a temporary directory: the same suite, the same root everywhere
            plan["expected_nodes"], plan["screen_index"] = expected, index
            # what the merge needs to run the reference itself: the suite it rebuilds, and this host's numerics
            plan["suite"] = {**suite, "examples": None if suite["examples"] is None else str(suite["examples"])}
            plan["numerics"] = screen_nodes.numerics(options.get("device"))
            run_unit(manifest, list(manifest.graphs), store, plan, verifier,
                     options, _graph_limit(args)[0], faults_where_present=True)

        return _ending(store.dir, started_at, lambda: _run(run, "screen"), mine=lambda: not refused_here,
                       attempt=attempt, heartbeat=False, label="screen")


def batch_merge(args) -> int:
    import signal

    from ..errors import OptionError
    from . import screen as screen_nodes
    from .attempt import attempt_id, check_environment
    from ..store.location import location

    check_environment()  # a GRADCHECK_* setting that is garbage: exit 2 naming it, nothing written
    if args.shard_count is not None and args.shard_count < 1:
        raise OptionError("must be at least 1", field="--shard-count")
    expect = screen_nodes.parse_nodes(args.expect_nodes) if args.expect_nodes is not None else None
    # each output is checked before the merge reads anything: a URL without its backend is exit 2 at once
    out = location(args.dir, "DIR")
    files = {flag: location(given, flag) for flag, given in
             (("--json", args.json), ("--junit", args.junit), ("--summary-md", args.summary_md)) if given}
    if args.manifest is not None:
        location(args.manifest, "--manifest")
    if args.wait is not None and not args.wait >= 0:
        raise OptionError("must be 0 or more", field="--wait")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        args.attempt = attempt_id(args.attempt)  # else the run's holder (_current_attempt), once it has one
        state = _wait(out, args, expect) if args.wait is not None else {"terminated": False}
        args.attempt = _current_attempt(out, args)
        refused = _refused(out, args)
        if refused:  # the run is another launch's: its report is not this merge's to write
            print(f"gradcheck-svc batch-merge: {refused}: this merge writes nothing (exit {EXIT_USAGE})",
                  file=sys.stderr)
            return EXIT_USAGE
        code = _merge_and_report(args, out, files, expect)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_TERMINATED if state["terminated"] else code


def _current_attempt(out, args) -> str | None:
    """The attempt this merge settles on (attempt.merge_attempt): --attempt ($GRADCHECK_ATTEMPT), else the one
    holding the run now -- read again at every poll of --wait, as a Job's first pod may claim the run later."""
    from ..errors import OptionError
    from .attempt import merge_attempt
    from .merge import StoreUnreadable, resolve_run
    from ..store.records import run_dir

    if args.attempt is not None:
        return args.attempt
    try:
        return merge_attempt(None, run_dir(out, resolve_run(out, args.run_id)))
    except (OptionError, StoreUnreadable, OSError):
        return None  # no run yet, or unreadable: the merge itself says so


def _refused(out, args) -> str | None:
    """Why this merge's attempt was refused (its shards found another launch running: attempt.record_refusal)."""
    from ..errors import OptionError
    from .attempt import refusal
    from .merge import StoreUnreadable, resolve_run
    from ..store.records import run_dir

    if args.attempt is None:
        return None
    try:
        return refusal(run_dir(out, resolve_run(out, args.run_id)), args.attempt)
    except (OptionError, StoreUnreadable, OSError):
        return None  # no run, or unreadable: the merge itself says so


def _merge_and_report(args, out, files, expect) -> int:
    from gradcheck_core.outputs.guard import junit_text

    from ..text import clip
    from .merge import StoreUnreadable, markdown, merge, notes, outcomes, partial, problems, summary_line
    from ..store.records import run_dir

    try:
        m = merge(out, run_id=args.run_id, allow_mixed=args.allow_mixed, shard_count=args.shard_count,
                  expect_nodes=expect, manifest=args.manifest, attempt=args.attempt)
    except StoreUnreadable as exc:
        print(f"gradcheck-svc batch-merge: infrastructure failure, retry (exit {EXIT_RETRY}): {clip(exc, 2000)}",
              file=sys.stderr)
        return EXIT_RETRY
    d = run_dir(out, m["run_id"])  # beside the run's units, in the same store
    outs = outcomes(m)
    unwritten = [line for line in (
        _write(files.get("--json", d / "merged.json"), _json(m), "--json"),
        _write(files.get("--junit", d / "junit.xml"), junit_text(outs), "--junit"),
        _write(files.get("--summary-md", d / "summary.md"), markdown(m, outs), "--summary-md")) if line]
    print(f"gradcheck-svc batch-merge: run {clip(m['run_id'], 300)}: {len(m['units'])} unit(s) in "
          f"{clip(str(d), 2000)}", file=sys.stderr)
    for line in problems(m):  # names come from files and directories: terminal text, escaped, one line each
        print(f"gradcheck-svc batch-merge: {clip(line, 2000)}", file=sys.stderr)
    if m["mode"] == "screen" and m["screen"]["disagreeing_nodes"]:
        print("gradcheck-svc batch-merge: nodes that disagree: "
              + clip(", ".join(m["screen"]["disagreeing_nodes"]), 2000), file=sys.stderr)
    for line in notes(m) + [line for line in [partial(m)] if line]:
        print(f"gradcheck-svc batch-merge: {clip(line, 2000)}", file=sys.stderr)
    summary = clip(summary_line(m), 2000)  # a screen's counts are per node: summed, they would say nothing
    print(f"gradcheck-svc batch-merge: {summary} (exit {m['exit_code']})", file=sys.stderr)
    if args.verdict_file:
        _write_verdict(Path(args.verdict_file), f"{m['verdict']}: run {m['run_id']}: {summary}")
    for line in unwritten:  # the volume's fault (full, gone): the report is in the log; retried once freed
        print(f"gradcheck-svc batch-merge: infrastructure failure, retry (exit {EXIT_RETRY}): {clip(line, 2000)}",
              file=sys.stderr)
    return EXIT_RETRY if unwritten else EXIT_OK if args.exit_zero else m["exit_code"]


def _wait(out, args, expect) -> dict:
    """batch-merge --wait: poll until the run is settled (merge.settled), the time is up, or a SIGTERM came.
    The SIGTERM handler only marks `terminated` (a signal may reach any thread: nothing is raised in the middle
    of a read), the wait ends at the next poll, and the report is still written (within the pod's grace
    period): an evicted or ended merge leaves what it saw."""
    import signal
    import time

    from .attempt import Watch, heartbeat_seconds
    from .merge import settled

    state = {"terminated": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: state.update(terminated=True))
    deadline = time.monotonic() + args.wait
    print(f"gradcheck-svc batch-merge: waiting up to {args.wait:g} s for every shard (or node) of the run to end",
          file=sys.stderr, flush=True)
    watch = Watch()  # heartbeats as this process sees them: a last try's that stops is a SIGKILL
    while not state["terminated"] and not settled(out, args.run_id, args.shard_count, expect,
                                                  _current_attempt(out, args), watch):
        left = deadline - time.monotonic()
        if left <= 0:
            print(f"gradcheck-svc batch-merge: waited {args.wait:g} s and some shards or nodes have not ended: "
                  "merging what is there", file=sys.stderr)
            break
        time.sleep(min(WAIT_POLL_BEATS * heartbeat_seconds(), left))
    if state["terminated"]:
        print("gradcheck-svc batch-merge: terminated while waiting (SIGTERM): merging what is there now",
              file=sys.stderr)
    return state


def _write_verdict(path: Path, line: str) -> None:
    """Plainly, not by rename: /dev/termination-log is a file the kubelet mounted, in a directory we cannot write."""
    from ..errors import OptionError

    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
    except OSError as exc:
        raise OptionError(f"cannot write {path}: {exc.strerror or exc}", field="--verdict-file") from None


def _json(m: dict) -> str:
    import json

    # compact: json's C encoder; with indent= it falls back to pure Python, 10x slower on 10,000 reports
    return json.dumps(m, allow_nan=False, separators=(",", ":")) + "\n"


# a write failing for these is the volume's state, not the command line's: exit 75 (retry), not 2
VOLUME_ERRNOS = ("ENOSPC", "EDQUOT", "EFBIG", "EIO", "EROFS")


def _write(path: Path, text: str, field: str) -> str | None:
    """Write one output; a full or failing volume is returned as a line (the caller exits 75 after the report's
    lines), a path that cannot be written otherwise is the user's (exit 2, naming the flag)."""
    import errno

    from ..errors import OptionError
    from ..store.records import atomic_write

    try:
        atomic_write(path, text.encode("utf-8"))
    except OSError as exc:
        if exc.errno in {getattr(errno, name) for name in VOLUME_ERRNOS if hasattr(errno, name)}:
            return f"cannot write {path} ({field}): {exc.strerror or exc}"
        raise OptionError(f"cannot write {path}: {exc.strerror or exc}", field=field) from None
    return None


COMMANDS = {"batch": batch, "batch-merge": batch_merge, "screen": screen}
