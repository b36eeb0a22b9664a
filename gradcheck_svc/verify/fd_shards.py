"""One graph's finite differences split over processes (a Job's indices), merged into the report one process gives.

A large model's verification is mostly finite differences: the joint screen's first pass (2k forwards of the
whole graph along k directions spanning every screened parameter, verify/joint_check.py) and the parameters
checked on their own (every parameter the plan checks in full or projected). Both are split here, in one wave
of shards and one merge (no second fan-in):

    shard I of N   runs what every process needs to agree on the work -- the engine (forward, backward), the
                   FD oracle's base forward and plan -- then its share: the screen's first-pass differences along
                   the directions dealt to it (dealer: each to the least loaded shard, by the plan's cost
                   model; the directions are seeded: every process makes the same ones, and shard I
                   evaluates its rows of them; joint_check.screen_share), its rows of the screen's second pass
                   as a passing screen takes it, and the per-parameter
                   differences (parameter_fd, the function verify() itself calls) of the parameters the plan
                   checks on their own that are assigned to it; it writes them as one file,
                   DIR/fd-shard-IIII-of-NNNN.npz (atomically: store.atomic_write). Shard 0 also runs the
                   engine as one process does -- the memory profile's inference figures too -- and records
                   its run: the loss, the gradients, the memory profile and the findings (_engine_record);
                   the profile's checkpointed what-if, a gradient run of its own, is made by the shard it is
                   dealt to (shares; engine_run.what_if_figures), which records its figures and findings
    the merge      runs verify() as one process would, the engine's run taken from shard 0's record (the
                   what-if's added as run_engine adds it) where it holds one (no fault injected, no event: run.engine_for; else the reported gradient run
                   only), the screen's first passes and each planned parameter's
                   differences read from the shards instead of computed (verify(fd_source=ShardSource(...)));
                   the follow-up -- refining the screen's failing directions, bisecting them to the parameters
                   they flag, narrowing those, their own checks, a second pass other than the one the shards
                   took -- is the single process's code, run here: it needs the whole screen's result, which
                   only the merge has, and it is small next to the first pass where the screen passes (a
                   graph that fails is diagnosed by the merge anyway)

Assignment is deterministic, every item to the shard with the least cost so far (ties: the lower index), costs
in one unit, values evaluated as the plan counts them (fd_plan.Costs): shard 0 starts with the memory profile's
runs where it makes them (INFERENCE_FORWARDS, WHAT_IF_FORWARDS); then the parameters checked on their own, costliest first
(a full check measured on one sliced copy, a projection 2k copies of what is downstream: shares); then the
screen's directions one by one (each the plan's 2 copies of everything downstream of the parameters: dealer).
The first pass's refinement is not counted (it is only known once it runs).

Faithful or refused. Each shard file carries the graph's content sha256, the options' sha256 and the gradcheck
version (store/records.py's keying); the merge refuses, naming them, shards that are missing, duplicated, of
another count, or made from another graph, options or version. Each also carries digests of what it computed
against: the loss and the list of parameters planned on their own, each of its parameters' engine gradient,
and per screen pass a key of its directions (parameters, count, step, block weights: with the seed and the
graph they fix every sign); the merge recomputes them and refuses any that differ (a non-deterministic engine
would otherwise pair one process's differences with another's gradient); a screen pass whose key the merge
does not ask for is not used, so a second pass the shards guessed wrong costs time, never the answer. A
projection's directions are not stored (16 x the parameter's size): the merge regenerates them from the seed
and checks their digest. Every row of a screen pass must come from exactly one shard. The what-if's
record must come from exactly one shard where shard 0's profile lacks it (its gradients_equal figure compares
that shard's what-if with its own reported run: the same code on the same graph, deterministic as the
gradient digests above require).

What is not split: every shard runs the engine's gradient run and the FD oracle's base forward and plan (the
fixed cost); the merge takes the base forward as the shards made it -- the loss, the plan, the steps a complex
forward cannot pass (finite_diff.BaseRecord; every shard's must be shard 0's) -- and makes it only where a
value of it is read (the follow-up, localization), its loss then checked against theirs bit for bit; the
diagnosis' kink notes come from the shard they are dealt to (shares), used where every row passes and no other
finding names a kink (else the merge makes them: they read the failing rows). The merge alone runs the
symbolic oracle, the screen's bookkeeping (the engine's projections on every direction, what each block
leaves unresolved), its follow-up and the diagnosis (localization's differences, only where a parameter fails).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import re

import numpy as np

from gradcheck_core.npz_bounded import NpzError, read_npz_from

from ..store.records import as_path, atomic_write, code_version, options_sha256
from ..errors import OptionError
from ..oracles.fd_modes import FDMode
from ..oracles.finite_diff import FiniteDifferences, random_directions
from . import fd_record
from ..text import clip
from .compare import Tolerance
from .engine_run import profile_asked, run_engine, what_if_apart, what_if_figures
from .findings import CAUSES, SEVERITIES, Finding
from .joint_check import screen_share
from .diagnosis.context import Run
from .diagnosis.kinks import exact_kink_notes
from ..oracles.finite_diff import BaseRecord
from ..oracles.fd_plan import plan_of_record
from .run import parameter_fd, screen_setup
from .subject import subject_of

FILE = re.compile(r"fd-shard-(\d{4,})-of-(\d{4,})\.npz")
FORMAT = 5  # 2: the joint screen split by direction ("screens"); 3: shard 0 carries its engine run ("engine");
# 4: the memory profile's what-if made by the shard it is dealt to ("what_if"); 5: every shard's FD base forward
# ("base": its loss, plan, complex-step blockers) and the diagnosis' kink notes made by one shard ("kink_notes")
# options that only record (the memory timeline, for a plot or page) never change a value: not keyed
UNKEYED = ("memory_timeline",)


def shard_file(index: int, count: int) -> str:
    return f"fd-shard-{index:04d}-of-{count:04d}.npz"


def options_key(options) -> dict:
    """The verification options that shape a result, as JSON values (faults as their text)."""
    d = dataclasses.asdict(options)
    for k in UNKEYED:
        d.pop(k, None)
    return json.loads(json.dumps(d, sort_keys=True, default=str))


def identity(graph_sha256: str, options) -> dict:
    return {"graph_sha256": graph_sha256, "options_sha256": options_sha256(options_key(options)),
            "gradcheck_version": code_version()}


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _work_digest(fd, own) -> str:
    """What every process must agree on before the work is split: the loss, the parameters planned on their own
    (the rest are screened jointly)."""
    return _digest(np.float64(fd.loss), np.array(own, dtype=str))


def screen_key(dirs, params) -> str:
    """A screen pass's directions: its parameters, their count, the step and each block's weight (the signs
    follow from these, the seed and the graph, all keyed)."""
    return _digest(np.array(params, dtype=str), np.int64(dirs.k), np.float64(dirs.step),
                   np.array([dirs.weight[p] for p in params], dtype=np.float64))


def _cost(fd, p: str) -> float:
    mode = fd.mode_for(p)
    if mode is FDMode.JOINT:  # flagged by the screen: checked as gradient() checks it on its own
        mode = fd.own_mode(p)
    if mode is FDMode.PROJECTION:
        return fd.costs.projection_cost(p, fd.options.count)
    return fd.full_cost(p)


# the memory profile's extra runs (_setup), in forwards of the graph: its inference figures (shard 0's: counted
# beside the reported run's forward on the CPU, engine_run's twin; a device's sampled no-grad forward, not counted
# here, is one forward) and its checkpointed what-if, a gradient run (forward, recomputation, backward: on
# ResNet-18 at 224x224 16.5 CPU s against 3.4 s for a forward; a complex-step direction 8 s, which the plan
# counts as 2 forwards)
INFERENCE_FORWARDS, WHAT_IF_FORWARDS = 0.0, 4.0
# the diagnosis' notes at kinks (diagnosis/kinks.py: every kinked step's inputs scanned), in forwards: ~1 s on
# ResNet-18 at 224x224
KINK_NOTES_FORWARDS = 0.3


def shares(fd, own: list[str], count: int, profile: bool, apart: bool) -> tuple[list[int], int | None, int, list]:
    """The work dealt before the screen's directions, in the plan's unit (values evaluated, fd_plan.Costs):
    (the shard of each parameter planned on its own, the what-if's shard, the kink notes' shard, each shard's
    load then). Shard 0 starts with the memory profile's runs where it makes them (profile) -- its inference
    figures only where the what-if is a run of its own (apart: engine_run.what_if_apart), dealt like a
    parameter, as are the diagnosis' kink notes; the parameters go costliest first to the least loaded shard
    (assign). Every process deals alike."""
    forward = fd.costs.forward_values()
    loads = [(INFERENCE_FORWARDS + (0 if apart else WHAT_IF_FORWARDS)) * forward if profile else 0.0]
    loads += [0.0] * (count - 1)
    where = assign([_cost(fd, p) for p in own] + ([WHAT_IF_FORWARDS * forward] if apart else [])
                   + [KINK_NOTES_FORWARDS * forward], count, loads)
    return where[:len(own)], where[len(own)] if apart else None, where[-1], loads


def dealer(index: int, count: int, loads=None, cost: float = 1.0):
    """deal(k) -> the rows shard `index` of `count` evaluates of the next screen pass of k directions: each
    direction (costing `cost`, in the unit of `loads`) in turn to the shard that holds the least so far (the
    lower index on ties), the passes one after another, each shard starting at its `loads` (shares': shard
    0's memory profile, the parameters checked on their own). Without loads a first pass is dealt by stride
    (index, index + count, ...). Every process deals alike."""
    loads = [0.0] * count if loads is None else list(loads)

    def deal(k: int) -> np.ndarray:
        mine = []
        for j in range(k):
            s = min(range(count), key=lambda s: (loads[s], s))
            loads[s] += cost
            if s == index:
                mine.append(j)
        return np.asarray(mine, dtype=np.int64)
    return deal


def assign(costs: list[float], count: int, load: list[float] | None = None) -> list[int]:
    """The shard of each item: costliest first (earlier on ties), to the least loaded shard (lower on ties),
    starting from `load` (updated in place; none: every shard at 0)."""
    load = [0.0] * count if load is None else load
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        s = min(range(count), key=lambda s: (load[s], s))
        out[i] = s
        load[s] += costs[i]
    return out


def _setup(graph, options, profile: bool = False):
    """As verify() sets up: the engine's run, the gradients under test (the engine's, or the graph's claims), what
    the joint screen judges of them (run.screen_setup: they or their float64 stand-in), the oracle, the tolerance, the parameters the joint screen takes (none where it is not usable: then every
    parameter is checked on its own, run.fd_plan) and those the plan checks on their own. `options` were checked
    at the edge (request.verify_options). profile: the memory profile's runs too, as verify() makes them (shard
    0's, for the merge: _engine_record); else the gradients only."""
    dtype = options.dtype or graph.declared_float_dtype
    engine = run_engine(graph, options, dtype, profile=None if profile else False,
                        what_if=not what_if_apart(graph, options, dtype))
    fd = FiniteDifferences(graph, options.fd)
    under_test = subject_of(graph)
    tol = Tolerance.for_dtype(under_test.tolerance_dtype(dtype), options.atol, options.rtol)
    subject = under_test.gradients(engine.gradients)
    screened, judged = screen_setup(Run(graph, options, dtype, engine=engine, subject=under_test), fd, subject, tol)
    own = [p for p in graph.parameters if p not in screened]
    return engine, subject, judged, fd, tol, screened, own


# a finding's fields as a shard records them (the engine's findings, recompute_check's, carry no worst element)
FINDING_FIELDS = ("node", "op", "cause", "severity", "detail", "parameters")


def _what_if_record(graph, options, dtype: str, engine) -> dict:
    """The memory profile's what-if, made here (engine_run.what_if_figures): its figures and findings."""
    figures, findings = what_if_figures(graph, options, dtype, engine.gradients)
    return {"memory": figures, "findings": [{k: getattr(f, k) for k in FINDING_FIELDS} for f in findings]}


def _engine_record(engine, options, arrays: dict, apart: bool = False) -> dict | None:
    """Shard 0's engine run, made as one process makes it (run_engine's default: the memory profile's runs
    too), for the merge (run.engine_for): its memory profile and findings, and -- where no fault was injected
    and no event recorded -- its loss, time and gradients (array engine.gradients, flat, each parameter's in
    turn in its memory order: meta's names, shapes and axes orders), so that the merge runs no engine at all.
    None where a finding carries a worst element (none of the engine's does: the merge runs it)."""
    if any(f.worst is not None for f in engine.findings):
        return None
    record = {"memory": engine.memory, "findings": [{k: getattr(f, k) for k in FINDING_FIELDS}
                                                    for f in engine.findings], "gradients": None,
              "what_if_apart": apart}  # its profile lacks the what-if: another shard's "what_if" holds it
    if not options.faults and not engine.events:  # one array, not one per parameter: chain_256 has 512 of them
        # each in its memory order, with the axes order that restores its layout (a Linear's weight gradient is
        # a transposed product): the report's norm (BLAS dot over ravel(order="K")) rounds by that order
        grads, axes = engine.gradients, {p: _memory_axes(g) for p, g in engine.gradients.items()}
        record.update(gradients=[[p, list(np.shape(g)), axes[p]] for p, g in grads.items()], loss=engine.loss,
                      seconds=engine.seconds)
        arrays["engine.gradients"] = np.concatenate([np.ravel(np.transpose(g, axes[p]) if axes[p] else g)
                                                     for p, g in grads.items()]) if grads else np.zeros(0)
    return record


def _memory_axes(g) -> list[int]:
    """The axes of g from the largest stride to the smallest: g.transpose(them) walks g in its memory order."""
    g = np.asarray(g)
    return [int(a) for a in sorted(range(g.ndim), key=lambda a: (-abs(g.strides[a]), a))]


def engine_record(record, arrays: dict) -> dict:
    """A shard's _engine_record read back: memory, findings as [Finding], gradients as {name: array} (or None),
    loss, seconds. ValueError (or KeyError, TypeError) where it is not of the shape written."""
    memory, findings, names = record["memory"], record["findings"], record["gradients"]
    if not isinstance(memory, dict) or not isinstance(record["what_if_apart"], bool):
        raise ValueError("metadata 'engine' is not one run_shard writes")
    made = {"memory": memory, "findings": _findings(findings, "engine"), "gradients": None,
            "what_if_apart": record["what_if_apart"]}
    if names is not None:
        flat, gradients, at = arrays["engine.gradients"], {}, 0
        for p, shape, axes in names:
            shape, axes = [int(d) for d in shape], [int(a) for a in axes]
            if sorted(axes) != list(range(len(shape))):
                raise ValueError(f"metadata 'engine': {axes} is no order of {len(shape)} axes")
            n = math.prod(shape)
            # the engine's layout again (_engine_record), in a fresh array (not a view of the file's buffer)
            stored = flat[at:at + n].reshape([shape[a] for a in axes]).copy()
            gradients[str(p)] = np.transpose(stored, np.argsort(axes)) if axes else stored
            at += n
        if flat.dtype != np.float64 or flat.ndim != 1 or at != flat.size or len(gradients) != len(names):
            raise ValueError("metadata 'engine' does not match its gradients")
        made.update(gradients=gradients, loss=float(record["loss"]), seconds=float(record["seconds"]))
    return made


def _findings(findings, where: str) -> list:
    """Recorded findings (FINDING_FIELDS) as [Finding]; ValueError where they are not of the shape written."""
    if not isinstance(findings, list):
        raise ValueError(f"metadata '{where}' is not one run_shard writes")
    out = []
    for f in findings:
        if not isinstance(f, dict) or set(f) != set(FINDING_FIELDS) or f["cause"] not in CAUSES \
                or f["severity"] not in SEVERITIES or not isinstance(f["parameters"], list) \
                or not all(isinstance(f[k], str) for k in FINDING_FIELDS[:5]):
            raise ValueError(f"a finding in metadata '{where}' is not one run_shard writes")
        out.append(Finding(**f))
    return out


def base_record(record) -> BaseRecord:
    """A shard's _base_record read back; ValueError (or KeyError, TypeError) where it is not of the shape written."""
    loss = bytes.fromhex(record["loss"])
    if len(loss) != 8 or not isinstance(record["lacking"], dict) or not isinstance(record["plan"], dict):
        raise ValueError("metadata 'base' is not one run_shard writes")
    plan_of_record(record["plan"])  # raises where it is not a plan
    return BaseRecord(float(np.frombuffer(loss, np.float64)[0]), record["plan"],
                      {str(k): str(v) for k, v in record["lacking"].items()})


def what_if_record(record) -> dict:
    """A shard's _what_if_record read back: memory (the what-if's figures), findings as [Finding]."""
    if not isinstance(record["memory"], dict):
        raise ValueError("metadata 'what_if' is not one run_shard writes")
    return {"memory": record["memory"], "findings": _findings(record["findings"], "what_if")}


def _base_record(made) -> dict:
    """The FD oracle's base forward as this shard made it (finite_diff.BaseRecord): the loss's bits (a NaN's
    too), the plan as planned, the steps a complex forward cannot pass -- the merge's, unless a follow-up
    needs the base forward's values (then it makes it, and its loss must be this one)."""
    return {"loss": np.float64(made.loss).tobytes().hex(), "plan": made.plan, "lacking": made.lacking}


def _kink_notes(graph, options, dtype: str, engine, fd, tol) -> list:
    """The diagnosis' notes at kinks (diagnosis/kinks.py) as verify() makes them where every row passed and
    nothing else named a kink (the merge makes them itself otherwise)."""
    run = Run(graph, options, dtype, engine=engine, subject=subject_of(graph), fd=fd, tol=tol, results=[])
    return [{k: getattr(f, k) for k in FINDING_FIELDS} for f in exact_kink_notes(run, [])]


def run_shard(graph, options, graph_sha256: str, index: int, count: int, out) -> dict:
    """Compute shard `index` of `count` and write it under `out` (a local directory or store.as_path's object
    path). Returns its summary: the file and its parameters."""
    engine, subject, judged, fd, tol, screened, own = _setup(graph, options, profile=index == 0)
    dtype = options.dtype or graph.declared_float_dtype
    apart = what_if_apart(graph, options, dtype)
    where, what_if, kinks, loads = shares(fd, own, count, profile_asked(options), apart)  # as every shard deals
    mine = [p for p, s in zip(own, where) if s == index]
    arrays, params = {}, []
    for i, name in enumerate(mine):
        g = subject[name]
        ref, check = parameter_fd(fd, name, g, tol)
        meta, record = fd_record.to_record(ref, check)
        params.append({"name": name, **meta, "gradient": _digest(g),
                       "directions": None if ref.directions is None else _digest(ref.directions)})
        arrays.update({f"{i}.{field}": a for field, a in record.items()})
    meta = {"format": FORMAT, "graph": graph.name, **identity(graph_sha256, options), "shard_index": index,
            "shard_count": count, "work": _work_digest(fd, own), "parameters": params,
            "engine": _engine_record(engine, options, arrays, apart) if index == 0 else None,
            "what_if": _what_if_record(graph, options, dtype, engine) if what_if == index else None,
            "base": _base_record(fd.record),
            "kink_notes": _kink_notes(graph, options, dtype, engine, fd, tol) if kinks == index else None}
    deal = dealer(index, count, loads, fd.costs.joint_cost(1) or 1.0)
    screens = screen_share(fd, judged, screened, tol, deal) if screened else []
    _add_screens(meta, arrays, screens)
    arrays["meta"] = np.frombuffer(json.dumps(meta, allow_nan=True).encode("utf-8"), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    root = as_path(out)
    root.mkdir(parents=True, exist_ok=True)
    path = root / shard_file(index, count)
    atomic_write(path, buf.getvalue())
    return {"file": str(path), "parameters": mine, "checked_on_own": len(own),
            "screen_rows": [(len(rows), dirs.k) for dirs, _, rows, _ in screens]}


def _add_screens(meta: dict, arrays: dict, screens: list) -> None:
    """A shard's rows of each screen pass (joint_check.screen_share): meta["screens"][j] its key and
    direction count, arrays screen{j}.rows / screen{j}.values."""
    meta["screens"] = []
    for j, (dirs, params, rows, values) in enumerate(screens):
        meta["screens"].append({"key": screen_key(dirs, params), "k": int(dirs.k)})
        arrays[f"screen{j}.rows"] = np.asarray(rows, dtype=np.int64)
        arrays[f"screen{j}.values"] = np.asarray(values, dtype=np.float64)


# what a damaged (truncated, overwritten, foreign) file raises on the way in, past the archive reader's own
# refusals: metadata that is not JSON of the shape written, a parameter's record missing a field or an array
_DAMAGED = (ValueError, KeyError, TypeError, AttributeError, IndexError, UnicodeDecodeError)


def _damaged(path, why: str) -> OptionError:
    return OptionError(f"{path}: damaged or not a finite-difference shard ({clip(why, 200)}); run its shard again",
                       field="--fd-from")


def _load(path) -> tuple[dict, dict]:
    """A shard file's (metadata, arrays), every parameter's record checked whole (fd_record.from_record) before
    anything uses it: a damaged file is refused here, as damaged, whatever part of it is wrong."""

    try:
        data = path.read_bytes()
    except OSError as exc:  # the volume or store, not the shard: exit 75, a retry may read it
        raise OSError(exc.errno, f"cannot read: {exc.strerror or exc}", str(path)) from None
    try:  # np.savez stores its members: no element takes less than a byte of the file, none is counted over 8
        arrays = read_npz_from(io.BytesIO(data), str(path), max_bytes=8 * len(data))
    except NpzError as exc:
        raise _damaged(path, str(exc).removeprefix(f"{path}: ")) from None
    try:
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else None!r}, not {FORMAT}")
        _check_records(meta, arrays)
        return meta, arrays
    except _DAMAGED as exc:
        raise _damaged(path, str(exc) or type(exc).__name__) from None


def _check_records(meta: dict, arrays: dict) -> None:
    """ValueError (or KeyError, TypeError) unless the metadata has the shape run_shard writes and every
    parameter's record reads back (its comparison, mode and arrays)."""
    for key, kind in (("shard_index", int), ("shard_count", int), ("work", str), ("parameters", list)):
        if not isinstance(meta.get(key), kind):
            raise ValueError(f"metadata '{key}' missing or not {kind.__name__}")
    for i, p in enumerate(meta["parameters"]):
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not isinstance(p.get("gradient"), str) \
                or not isinstance(p.get("directions"), (str, type(None))):
            raise ValueError(f"parameter record {i} is not one run_shard writes")
        record = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}.")}
        try:
            fd_record.from_record(p, record)
        except KeyError as exc:
            raise ValueError(f"parameter record {i} lacks {exc}") from None
    if meta.get("engine") is not None:
        engine_record(meta["engine"], arrays)
    if meta.get("what_if") is not None:
        what_if_record(meta["what_if"])
    base_record(meta["base"])
    if meta.get("kink_notes") is not None:
        _findings(meta["kink_notes"], "kink_notes")


def read_shards(src, graph_sha256: str, options) -> dict:
    """Every shard under `src`, checked to be one whole set made from this graph, these options and this
    gradcheck: name -> (meta of its parameter, arrays, shard meta). OptionError naming what is wrong."""
    root = as_path(src)
    found = {}
    try:
        if not root.is_dir():
            raise OptionError(f"'{src}' is not a directory of finite-difference shards", field="--fd-from")
        for f in sorted(root.iterdir()):
            m = FILE.fullmatch(f.name)
            if m:
                found[f.name] = (int(m.group(1)), int(m.group(2)), f)
    except OSError as exc:  # an object store unreachable or denied: exit 75, a retry may reach it
        raise OSError(exc.errno, f"cannot list: {exc.strerror or exc}", str(src)) from None
    if not found:
        raise OptionError(f"no fd-shard-*-of-*.npz files in '{src}'", field="--fd-from")
    counts = sorted({c for _, c, _ in found.values()})
    if len(counts) > 1:
        raise OptionError("shards of different counts (" + ", ".join(sorted(found)) + "): one run's shards only",
                          field="--fd-from")
    count = counts[0]
    missing = sorted(set(range(count)) - {i for i, _, _ in found.values()})
    if missing:
        raise OptionError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {count} "
                          f"missing in '{src}' (expected {', '.join(shard_file(i, count) for i in missing)})",
                          field="--fd-from")
    want = identity(graph_sha256, options)
    what = {"graph_sha256": "another graph", "options_sha256": "other options",
            "gradcheck_version": "another gradcheck version"}
    params, work, screens, engine, what_ifs, bases, kinks = {}, {}, {}, None, [], {}, []
    for name, (index, _, f) in sorted(found.items()):
        meta, arrays = _load(f)
        if meta.get("shard_index") != index or meta.get("shard_count") != count:
            raise OptionError(f"{name}: holds shard {meta.get('shard_index')} of {meta.get('shard_count')} "
                              "(a renamed file)", field="--fd-from")
        wrong = [f"{what[k]} ({str(meta.get(k))[:24]}, here {want[k][:24]})" for k in want if meta.get(k) != want[k]]
        if wrong:
            raise OptionError(f"{name} was made from {' and '.join(wrong)}: re-run the shards, or merge with the "
                              "same graph, options and image", field="--fd-from")
        work[name] = meta["work"]
        if index == 0 and meta.get("engine") is not None:
            engine = engine_record(meta["engine"], arrays)
        if meta.get("what_if") is not None:
            what_ifs.append((name, what_if_record(meta["what_if"])))
        bases[name] = meta["base"]
        if meta.get("kink_notes") is not None:
            kinks.append((name, _findings(meta["kink_notes"], "kink_notes")))
        for i, p in enumerate(meta["parameters"]):
            if p["name"] in params:
                raise OptionError(f"parameter '{p['name'][:200]}' is in {params[p['name']][2]} and {name}",
                                  field="--fd-from")
            params[p["name"]] = (p, {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}.")},
                                 name)
        _read_screens(name, meta, arrays, screens)
    if len(kinks) != 1:
        raise OptionError(f"the diagnosis' kink notes are held by {', '.join(n for n, _ in kinks) or 'none'} in "
                          f"'{src}', not by the one shard they were dealt to; re-run the shards", field="--fd-from")
    return {"params": params, "work": work, "count": count, "screens": screens,
            "engine": _with_what_if(engine, what_ifs, src), "base": _one_base(bases, count),
            "kink_notes": kinks[0][1]}


def _one_base(bases: dict, count: int) -> dict:
    """Shard 0's FD base forward (_base_record), refused unless every shard made the same one (a forward that is
    not deterministic would pair one process's differences with another's loss and plan)."""
    first = bases[shard_file(0, count)]
    off = sorted(n for n, b in bases.items() if b != first)
    if off:
        raise OptionError(f"{', '.join(off)}: made another FD base forward than {shard_file(0, count)} (its loss, "
                          "plan or complex-step blockers differ: a non-deterministic forward?); re-run the shards",
                          field="--fd-from")
    return first


def _with_what_if(engine, what_ifs: list, src) -> dict | None:
    """Shard 0's engine record with the memory profile's what-if another shard made (shares deals it) added as
    run_engine adds it: its figures after the profile's, its findings after the engine's. OptionError unless
    exactly one shard holds it where shard 0's profile lacks it (none otherwise)."""
    if engine is None:  # the merge runs the engine itself
        return None
    held = ", ".join(name for name, _ in what_ifs) or "none"
    if len(what_ifs) != (1 if engine["what_if_apart"] else 0):
        raise OptionError(f"the memory profile's what-if is held by {held} in '{src}', not by the one shard it was "
                          "dealt to; re-run the shards", field="--fd-from")
    if what_ifs:
        extra = what_ifs[0][1]
        engine = {**engine, "memory": {**engine["memory"], **extra["memory"]},
                  "findings": engine["findings"] + extra["findings"]}
    return engine


def _read_screens(name: str, meta: dict, arrays: dict, screens: dict) -> None:
    """screens: key -> (k, {shard file: (rows, values)}), this shard's rows added."""
    try:
        for j, entry in enumerate(meta.get("screens", [])):
            rows, values = arrays[f"screen{j}.rows"], arrays[f"screen{j}.values"]
            if rows.shape != values.shape or rows.ndim != 1 or not np.all((rows >= 0) & (rows < entry["k"])):
                raise ValueError(f"screen pass {j}: rows and values do not match")
            screens.setdefault(entry["key"], (int(entry["k"]), {}))[1][name] = (rows, values)
    except (KeyError, TypeError, ValueError) as exc:
        raise OptionError(f"{name}: damaged or not a finite-difference shard ({clip(str(exc), 200)}); run its "
                          "shard again", field="--fd-from") from None


def screen_values(shards: dict, dirs, params) -> np.ndarray | None:
    """The first pass along every direction of dirs over `params`, assembled from the shards' rows; None when
    no shard evaluated this pass (the merge evaluates it: a screen's second pass other than the shards')."""
    entry = shards["screens"].get(screen_key(dirs, params))
    if entry is None:
        return None
    k, parts = entry
    values, seen = np.zeros(dirs.k), np.zeros(dirs.k, np.int64)
    for rows, v in parts.values():
        values[rows] = v
        np.add.at(seen, rows, 1)
    if k != dirs.k or len(parts) != shards["count"] or not np.all(seen == 1):
        held = ", ".join(sorted(parts))
        raise OptionError(f"the joint screen's directions are not split once over every shard (held by {held}); "
                          "re-run the shards", field="--fd-from")
    return values


class ShardSource:
    """verify()'s fd_source for a merge: the shards under `src` (read when first needed, once the graph
    validated: a bad graph is named before its shards are), the joint screen's first passes
    (joint_values) and each planned parameter's differences (called as fd_source) from them."""

    def __init__(self, src, graph_sha256: str, options):
        self._read = (src, graph_sha256, options)
        self._shards = None

    def shards(self) -> dict:
        if self._shards is None:
            self._shards = read_shards(*self._read)
        return self._shards

    def joint_values(self, dirs, params):
        return screen_values(self.shards(), dirs, params)

    def engine_record(self, graph):
        """Shard 0's engine run as it recorded it (engine_record), or None; refused unless its gradients are
        the graph's parameters' (names and shapes)."""
        made = self.shards()["engine"]
        grads = made and made["gradients"]
        if grads is not None and {p: g.shape for p, g in grads.items()} != \
                {p: np.shape(graph.inputs[p].value) for p in graph.parameters}:
            raise _damaged(f"{self._read[0]}/{shard_file(0, self.shards()['count'])}",
                           "its engine gradients are not the graph's parameters")
        return made

    def base_record(self) -> BaseRecord:
        """The FD oracle's base forward as every shard made it: the merge makes its own only where a follow-up
        or the diagnosis needs its values, and refuses where its loss is not the shards'."""
        made = base_record(self.shards()["base"])

        def check(loss: float) -> None:
            if np.float64(loss).tobytes() != np.float64(made.loss).tobytes():
                raise OptionError(f"the FD base forward's loss here ({loss!r}) is not the shards' ({made.loss!r}): a "
                                  "non-deterministic forward? re-run the shards", field="--fd-from")
        made.check = check
        return made

    def kink_notes(self) -> list:
        """The diagnosis' kink notes one shard made (_kink_notes): verify()'s where every row passes."""
        return self.shards()["kink_notes"]

    def __call__(self, fd, screen, own, tol):
        return shard_source(self.shards())(fd, screen, own, tol)


def shard_source(shards: dict):
    """verify()'s fd_source: each planned parameter's differences from its shard, after checking that this
    process agrees with every shard on the work (loss, parameters) and with each one's engine gradient; the
    parameters the joint screen flagged are its follow-up, computed here."""
    def source(fd, screen, own, tol):
        planned = [p for p in own if screen is None or p not in screen.params]
        here = _work_digest(fd, planned)
        off = sorted(n for n, w in shards["work"].items() if w != here)
        if off:
            raise OptionError(f"{', '.join(off)}: computed against another loss or parameter list than this "
                              "process's (a non-deterministic forward?); re-run the shards", field="--fd-from")
        absent = [p for p in planned if p not in shards["params"]]
        if absent:
            raise OptionError(f"no shard holds parameter '{absent[0][:200]}'", field="--fd-from")

        def lookup(name, g):
            if name not in planned:  # flagged by the screen: its follow-up, here
                return parameter_fd(fd, name, g, tol)
            p, a, file = shards["params"][name]
            if _digest(g) != p["gradient"]:
                raise OptionError(f"{file}: parameter '{name[:200]}' was checked against another engine gradient "
                                  "than this process's; re-run the shards", field="--fd-from")
            directions = None
            if p["mode"] == FDMode.PROJECTION:  # regenerated from the seed, as FiniteDifferences._projection makes them
                directions = random_directions(int(np.size(fd.base[name])), len(a["fd_reference"]), fd.options.seed)
                if _digest(directions) != p["directions"]:
                    raise OptionError(f"{file}: parameter '{name[:200]}': the projection directions differ from "
                                      "this process's", field="--fd-from")
            return fd_record.from_record(p, a, directions)
        return lookup
    return source
