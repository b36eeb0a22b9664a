"""The batch commands of gradcheck-svc: batch, batch-merge, screen.

Exit codes of `batch` and `screen`, for a Job's podFailurePolicy:
  0   the unit finished; mismatches, invalid graphs and timeouts are results in the records
  2   bad usage or configuration (flags, an empty or missing manifest): retrying cannot help -> FailIndex
  75  infrastructure failure (unreadable volume, unwritable output, out of memory, server unreachable,
      no GPU; a screen pod on a node outside --expect-nodes or one another index screened): retrying,
      possibly on another node, can -> counted against backoffLimitPerIndex
  3   internal error (counted and retried like 75); 137 is the kernel's SIGKILL (OOM killer), also retried
`batch-merge`: 0 every graph passed, 1 a graph failed (screen: a node disagrees), 2 bad usage (nothing to
  merge: no run, several runs and no --run-id, batch and screen mixed), 4 incomplete: results missing,
  present twice, from another manifest or shard count, damaged (each file named), made under other options
  or versions (unless --allow-mixed), a screen's listed node not screened, or no graphs at all (named on
  stderr), 75 the results could not be read (an object store unreachable): retry. --exit-zero: 0 whenever
  the report is written.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gradcheck_client.options import add_option_flags, values_from_args

EXIT_OK, EXIT_USAGE, EXIT_INTERNAL, EXIT_RETRY = 0, 2, 3, 75


def _verify_options(p: argparse.ArgumentParser, exclude: tuple = ()) -> None:
    """The verification options of `verify` (one table, gradcheck_client/options.py), the time limit and
    the run ID."""
    from ..limits import add_limit_flags

    add_option_flags(p, exclude=exclude)
    add_limit_flags(p, server=False, what="in-process, as `verify`'s; with --server, the server's own apply")
    p.add_argument("--time-limit", type=float, default=300.0, metavar="SECONDS",
                   help="per-graph time limit; a graph over it is recorded as timeout (default 300)")
    p.add_argument("--run-id", default=None, metavar="ID",
                   help="results go to OUT/runs/ID/ (default $GRADCHECK_RUN_ID -- in a Job, the Job's name "
                        "from the downward API -- else 'default')")


def add_parsers(sub) -> None:
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
    from gradcheck_client.onnx_options import add_onnx_flags

    add_onnx_flags(b)  # how each .onnx model of the manifest is imported (the same for all of them)

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
                   help="a batch's shard count: a unit made with another is named, exit 4 (default: the units' own)")
    m.add_argument("--expect-nodes", default=None, metavar="NODES|@FILE",
                   help="a screen's intended nodes, added to those its units recorded: each one not screened is "
                        "named, exit 4 (the same syntax as screen's; default: only the recorded ones)")

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
    from gradcheck_client.options import flag_of

    from ..errors import LimitError, OptionError
    from ..limits import ServerLimits, limit_flag_values
    from ..request import verify_options
    from ..verify.run import check_options

    if not args.time_limit > 0:  # NaN too
        raise OptionError("must be positive", field="--time-limit")
    given = {k: v for k, v in limit_flag_values(args).items() if v is not None}
    if given and getattr(args, "server", None) is not None:  # silently ignored would be worse
        raise OptionError("applies in-process only: with --server, the server's own limits apply",
                          field="--" + next(iter(given)).replace("_", "-"))
    limits = ServerLimits.from_flags(given)
    values = values_from_args(args)
    if "device" in values and values["device"] == "auto":  # screen's own choice, resolved per node
        values = {k: v for k, v in values.items() if k != "device"}
    try:
        check_options(verify_options(values, limits, field=flag_of),
                      field=lambda name: "--" + name.replace("_", "-"))
    except LimitError:
        if getattr(args, "server", None) is None:
            raise
    return limits


def _run_id(args) -> str:
    from ..errors import OptionError
    from .store import DEFAULT_RUN, LATEST, RUN_ID

    run_id = args.run_id if args.run_id is not None else os.environ.get("GRADCHECK_RUN_ID") or DEFAULT_RUN
    if not RUN_ID.fullmatch(run_id) or run_id == LATEST:
        raise OptionError(f"'{run_id[:80]}' is not a run ID (letters, digits, '.', '_', '-'; at most 128; "
                          f"not '{LATEST}')", field="--run-id")
    return run_id


def _keyed_options(args, requested: dict, onnx_import=None) -> dict:
    """What shapes a result, hashed into every record's key: the verification options as asked for (screen's
    --device auto before it is resolved per node), the per-graph time limit, the limits given, and how
    .onnx models are imported (the OnnxImport message, input tensors included, as a sha256)."""
    from ..limits import limit_flag_values
    from .store import bytes_sha256

    keyed = dict(requested, time_limit=args.time_limit)
    keyed |= {k: v for k, v in limit_flag_values(args).items() if v is not None}
    if onnx_import is not None:
        keyed["onnx_import"] = bytes_sha256(onnx_import.SerializeToString(deterministic=True))
    return keyed


def _run(run, label: str) -> int:
    """Map what a unit can raise to the exit codes above."""
    from .verifiers import InfraError

    try:
        run()
    except InfraError as exc:
        print(f"gradcheck-svc {label}: infrastructure failure, retry (exit {EXIT_RETRY}): {exc}", file=sys.stderr)
        return EXIT_RETRY
    except MemoryError:
        print(f"gradcheck-svc {label}: out of memory, retry (exit {EXIT_RETRY})", file=sys.stderr)
        return EXIT_RETRY
    except OSError as exc:  # the results volume: full, read-only, gone
        print(f"gradcheck-svc {label}: infrastructure failure, retry (exit {EXIT_RETRY}): "
              f"{exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_RETRY
    return EXIT_OK


def _plan(mode, unit, label, index, count, node, manifest, verifier, options, run_id, keyed) -> dict:
    from datetime import datetime, timezone

    from .store import options_sha256

    return {"mode": mode, "unit": unit, "label": label, "run_id": run_id, "shard_index": index,
            "shard_count": count, "node": node, "manifest_root": str(manifest.root), "graphs": list(manifest.graphs),
            "contents": {}, "where": verifier.where, "options": options, "keyed_options": keyed,
            "options_sha256": options_sha256(keyed), "gradcheck_version": verifier.version,
            "started_at": datetime.now(timezone.utc).isoformat()}


def batch(args) -> int:
    from ..errors import OptionError
    from .location import location
    from .manifest import load_manifest
    from .runner import run_unit
    from .store import UnitStore, unit_name

    limits = _check_common(args)
    location(args.manifest, "--manifest")  # a URL whose backend is missing: exit 2 before anything runs
    out = location(args.out, "--out")
    onnx_import = _onnx_import(args)
    index = completion_index(args.shard_index, "--shard-index")
    if args.shard_count < 1:
        raise OptionError("must be at least 1", field="--shard-count")
    if not 0 <= index < args.shard_count:
        raise OptionError(f"{index} is not in 0..{args.shard_count - 1}", field="--shard-index")
    run_id = _run_id(args)
    options = values_from_args(args)
    verifier = _verifier(args, options, limits)
    unit, label = unit_name(index), f"shard {index}/{args.shard_count}"

    def run():  # inside _run: an unreadable manifest volume is an infrastructure failure (exit 75)
        manifest = load_manifest(args.manifest)
        verifier.check()  # first: against a server, its version is part of every record's key
        plan = _plan("batch", unit, label, index, args.shard_count, args.node_name, manifest, verifier, options,
                     run_id, _keyed_options(args, options, onnx_import if _has_onnx(manifest) else None))
        run_unit(manifest, manifest.shard(index, args.shard_count), UnitStore(out, run_id, unit), plan,
                 verifier, options, args.time_limit, onnx_import=onnx_import)

    try:
        return _run(run, "batch")
    finally:
        getattr(verifier, "close", lambda: None)()


def _verifier(args, options, limits):
    from .verifiers import LocalVerifier, RemoteVerifier

    if getattr(args, "server", None):
        from ..server.config import read_token

        return RemoteVerifier(args.server, options, token=read_token(args.token_file))
    return LocalVerifier(options, limits)


def _has_onnx(manifest) -> bool:
    from gradcheck_client.onnx_options import is_onnx

    return any(is_onnx(g) for g in manifest.graphs)


def _onnx_import(args):
    """The OnnxImport message of the --params/--input/... flags (tensor files read now: a missing one is
    exit 2 before any graph), for every .onnx model of the manifest."""
    from gradcheck_client.onnx_options import OnnxFlagError, onnx_import_message

    from ..errors import OptionError

    try:
        return onnx_import_message(args)
    except OnnxFlagError as exc:
        raise OptionError(str(exc)) from None


def _examples_dir(arg: str | None) -> Path | None:
    if arg == "none":
        return None
    if arg:
        return Path(arg)
    source_tree = Path(__file__).resolve().parents[2] / "examples" / "graphs"
    return source_tree if source_tree.is_dir() else None


def build_suite(dest: Path, examples: Path | None, generated: int, size: int, seed: int) -> None:
    """The screening suite: the examples' top-level graphs and `generated` graphs, identical on every node."""
    import shutil

    from gradcheck_client.graphio import SUFFIXES

    from ..errors import OptionError
    from .generate import write_graphs

    if examples is not None:
        if not examples.is_dir():
            raise OptionError(f"not a directory: {examples}", field="--examples")
        (dest / "examples").mkdir(parents=True)
        for f in sorted(examples.iterdir()):
            if f.suffix in SUFFIXES and f.is_file():
                shutil.copyfile(f, dest / "examples" / f.name)
    if generated:
        write_graphs(dest / "generated", generated, size=size, seed=seed)


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
    from .store import run_dir, unit_name

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


def screen(args) -> int:
    import socket
    import tempfile

    from ..errors import OptionError
    from . import screen as screen_nodes
    from .location import location
    from .manifest import load_manifest
    from .runner import run_unit
    from .store import UnitStore, unit_name
    from .verifiers import InfraError

    limits = _check_common(args)
    out = location(args.out, "--out")
    if args.generated < 0:
        raise OptionError("must be 0 or more", field="--generated")
    if args.size < 1:
        raise OptionError("must be at least 1", field="--size")
    node = args.node_name or socket.gethostname()
    run_id = _run_id(args)
    expected = screen_nodes.parse_nodes(args.expect_nodes) if args.expect_nodes is not None else None
    if args.node_count is not None and args.node_count < 1:  # (argparse converts $GRADCHECK_NODE_COUNT too)
        raise OptionError("must be at least 1", field="--node-count")
    if expected is not None and args.node_count is not None and len(expected) != args.node_count:
        raise OptionError(f"{args.node_count} screen pod(s) for the {len(expected)} node(s) of --expect-nodes: "
                          "launch one pod per listed node (settings.yaml `nodes`)", field="--node-count")
    index = completion_index(None, "screen", required=False)
    keyed = _keyed_options(args, values_from_args(args))  # --device auto as asked: the same on every node
    if args.device == "auto":
        from ..backend import cuda_available

        args.device = "cuda" if cuda_available() else "cpu"
    options = values_from_args(args)
    with tempfile.TemporaryDirectory(prefix="gradcheck-screen-") as tmp:  # /tmp: an emptyDir in the pod
        build_suite(Path(tmp), _examples_dir(args.examples), args.generated, args.size, args.suite_seed)
        manifest = load_manifest(tmp, field="--examples")
        verifier = _verifier(args, options, limits)
        unit = unit_name(node=node)

        def run():
            refused = _wrong_node(out, node, expected, index, run_id)
            if refused:
                raise InfraError(refused)
            verifier.check()
            plan = _plan("screen", unit, f"node {node}", 0, 1, node, manifest, verifier, options, run_id, keyed)
            plan["manifest_root"] = "screen-suite"  # a temporary directory: the same suite, the same root everywhere
            plan["expected_nodes"], plan["screen_index"] = expected, index
            run_unit(manifest, list(manifest.graphs), UnitStore(out, run_id, unit), plan, verifier,
                     options, args.time_limit, faults_where_present=True)

        return _run(run, "screen")


def batch_merge(args) -> int:
    from ..errors import OptionError
    from ..text import clip
    from . import screen as screen_nodes
    from .location import location
    from .merge import StoreUnreadable, markdown, merge, notes, outcomes, problems, summary_line
    from .store import run_dir

    if args.shard_count is not None and args.shard_count < 1:
        raise OptionError("must be at least 1", field="--shard-count")
    expect = screen_nodes.parse_nodes(args.expect_nodes) if args.expect_nodes is not None else None
    # each output is checked before the merge reads anything: a URL without its backend is exit 2 at once
    out = location(args.dir, "DIR")
    files = {flag: location(given, flag) for flag, given in
             (("--json", args.json), ("--junit", args.junit), ("--summary-md", args.summary_md)) if given}
    try:
        m = merge(out, run_id=args.run_id, allow_mixed=args.allow_mixed, shard_count=args.shard_count,
                  expect_nodes=expect)
    except StoreUnreadable as exc:
        print(f"gradcheck-svc batch-merge: infrastructure failure, retry (exit {EXIT_RETRY}): {clip(exc, 2000)}",
              file=sys.stderr)
        return EXIT_RETRY
    d = run_dir(out, m["run_id"])  # beside the run's units, in the same store
    outs = outcomes(m)
    _write(files.get("--json", d / "merged.json"), _json(m), "--json")
    from gradcheck_client.outputs.guard import junit_text

    _write(files.get("--junit", d / "junit.xml"), junit_text(outs), "--junit")
    _write(files.get("--summary-md", d / "summary.md"), markdown(m, outs), "--summary-md")
    print(f"gradcheck-svc batch-merge: run {clip(m['run_id'], 300)}: {len(m['units'])} unit(s) in "
          f"{clip(str(d), 2000)}", file=sys.stderr)
    for line in problems(m):  # names come from files and directories: terminal text, escaped, one line each
        print(f"gradcheck-svc batch-merge: {clip(line, 2000)}", file=sys.stderr)
    if m["mode"] == "screen" and m["screen"]["disagreeing_nodes"]:
        print("gradcheck-svc batch-merge: nodes that disagree: "
              + clip(", ".join(m["screen"]["disagreeing_nodes"]), 2000), file=sys.stderr)
    for line in notes(m):
        print(f"gradcheck-svc batch-merge: {clip(line, 2000)}", file=sys.stderr)
    summary = clip(summary_line(m), 2000)  # a screen's counts are per node: summed, they would say nothing
    print(f"gradcheck-svc batch-merge: {summary} (exit {m['exit_code']})", file=sys.stderr)
    if args.verdict_file:
        _write_verdict(Path(args.verdict_file), f"{m['verdict']}: run {m['run_id']}: {summary}")
    return EXIT_OK if args.exit_zero else m["exit_code"]


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


def _write(path: Path, text: str, field: str) -> None:
    from ..errors import OptionError
    from .store import atomic_write

    try:
        atomic_write(path, text.encode("utf-8"))
    except OSError as exc:
        raise OptionError(f"cannot write {path}: {exc.strerror or exc}", field=field) from None


COMMANDS = {"batch": batch, "batch-merge": batch_merge, "screen": screen}
