"""One graph's finite differences split over processes (a Job's indices), merged into the report one process gives.

A large model's verification is mostly finite differences of the parameters checked on their own (every
parameter the plan checks in full or projected, and every one the joint screen flags). Those are
independent of one another, so they are the unit split here:

    shard I of N   runs what every process needs to agree on the work -- the engine (forward, backward), the
                   FD oracle's base forward and plan, the joint screen -- then the per-parameter differences
                   (parameter_fd, the function verify() itself calls) of the parameters assigned to it, and
                   writes them as one file, DIR/fd-shard-IIII-of-NNNN.npz (atomically: store.atomic_write)
    the merge      runs verify() as one process would, each parameter's differences read from its shard
                   instead of computed (verify(fd_source=...)); the symbolic oracle, comparisons, diagnosis
                   and the report are the single process's code, unchanged

Assignment is deterministic and balanced by cost: the parameters in the graph's order, costliest first (values
evaluated, as the plan counts them: a full check measured on one sliced copy, a projection 2k copies of what is
downstream), each to the shard with the least cost so far (ties: the lower index). The first pass's
refinement is not counted (it is only known once it runs).

Faithful or refused. Each shard file carries the graph's content sha256, the options' sha256 and the gradcheck
version (batch/store.py's keying); the merge refuses, naming them, shards that are missing, duplicated, of
another count, or made from another graph, options or version. Each also carries digests of what it computed
against: the loss, the joint screen's outcome, the list of parameters checked on their own and each of its
parameters' engine gradient; the merge recomputes them and refuses any that differ (a non-deterministic
engine would otherwise pair one process's differences with another's gradient). A projection's directions are
not stored (16 x the parameter's size): the merge regenerates them from the seed and checks their digest.

What is not split: the joint screen (2k whole-graph forwards, plus its bisection where the whole disagrees)
runs in every shard and in the merge, and so do the engine and the symbolic oracle's budget check; the merge
alone runs the symbolic oracle and the diagnosis (localization's differences, only where a parameter fails).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import zipfile
import zlib

import numpy as np

from ..batch.store import as_path, atomic_write, code_version, options_sha256
from ..errors import OptionError
from ..oracles.fd_modes import FDMode
from ..oracles.finite_diff import FiniteDifferences, random_directions
from . import claims, fd_record
from ..text import clip
from .compare import Tolerance
from .engine_run import run_engine
from .run import fd_plan, parameter_fd

FILE = re.compile(r"fd-shard-(\d{4,})-of-(\d{4,})\.npz")
FORMAT = 1
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


def _screen_digest(fd, screen, own) -> str:
    """What every process must agree on before the work is split: the loss, the screen's outcome, the work."""
    parts = [np.float64(fd.loss), np.array(own, dtype=str)]
    if screen is not None:
        parts += [np.array(screen.params, dtype=str), np.array(screen.flagged, dtype=str), screen.reference,
                  screen.error, np.int64(screen.evaluations)]
    return _digest(*parts)


def _cost(fd, p: str) -> float:
    mode = fd.mode_for(p)
    if mode == "joint":  # flagged by the screen: checked as gradient() checks it on its own
        mode = fd.own_mode(p)
    if mode == "projection":
        return 2.0 * fd.options.directions * fd.row_bytes(p) / 8
    return fd.full_cost(p)


def assign(costs: list[float], count: int) -> list[int]:
    """The shard of each item: costliest first (earlier on ties), to the least loaded shard (lower on ties)."""
    load = [0.0] * count
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        s = min(range(count), key=lambda s: (load[s], s))
        out[i] = s
        load[s] += costs[i]
    return out


def _setup(graph, options):
    """As verify() sets up: the gradients under test (the engine's, or the graph's claims), the oracle, the
    tolerance, the joint screen and the parameters checked on their own. `options` were checked at the edge
    (request.verify_options)."""
    dtype = options.dtype or graph.declared_float_dtype
    engine = run_engine(graph, options, dtype, profile=False)  # the gradients only: a shard reports no memory
    fd = FiniteDifferences(graph, options.fd)
    tol = Tolerance.for_dtype(claims.tolerance_dtype(graph, dtype), options.atol, options.rtol)
    subject = claims.subject_gradients(graph, engine.gradients)
    _, screen, own = fd_plan(fd, subject, graph, tol)
    return subject, fd, tol, screen, own


def run_shard(graph, options, graph_sha256: str, index: int, count: int, out) -> dict:
    """Compute shard `index` of `count` and write it under `out` (a local directory or store.as_path's object
    path). Returns its summary: the file and its parameters."""
    subject, fd, tol, screen, own = _setup(graph, options)
    where = assign([_cost(fd, p) for p in own], count)
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
            "shard_count": count, "work": _screen_digest(fd, screen, own), "parameters": params}
    arrays["meta"] = np.frombuffer(json.dumps(meta, allow_nan=True).encode("utf-8"), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    root = as_path(out)
    root.mkdir(parents=True, exist_ok=True)
    path = root / shard_file(index, count)
    atomic_write(path, buf.getvalue())
    return {"file": str(path), "parameters": mine, "checked_on_own": len(own)}


# what a damaged (truncated, overwritten, foreign) file raises on the way in: not a zip, a member cut short
# or not inflating, no metadata, metadata that is not JSON of the shape written
_DAMAGED = (ValueError, KeyError, UnicodeDecodeError, zipfile.BadZipFile, EOFError, zlib.error)


def _load(path) -> tuple[dict, dict]:
    try:
        data = path.read_bytes()
    except OSError as exc:  # the volume or store, not the shard: exit 75, a retry may read it
        raise OSError(exc.errno, f"cannot read: {exc.strerror or exc}", str(path)) from None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else None!r}, not {FORMAT}")
        return meta, arrays
    except _DAMAGED as exc:
        why = clip(str(exc) or type(exc).__name__, 200)
        raise OptionError(f"{path}: damaged or not a finite-difference shard ({why}); run its shard again",
                          field="--fd-from") from None


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
    params, work = {}, {}
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
        for i, p in enumerate(meta["parameters"]):
            if p["name"] in params:
                raise OptionError(f"parameter '{p['name'][:200]}' is in {params[p['name']][2]} and {name}",
                                  field="--fd-from")
            params[p["name"]] = (p, {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}.")},
                                 name)
    return {"params": params, "work": work, "count": count}


def shard_source(shards: dict):
    """verify()'s fd_source: each parameter's differences from its shard, after checking that this process
    agrees with every shard on the work (loss, screen, parameters) and with each one's engine gradient."""
    def source(fd, screen, own, tol):
        here = _screen_digest(fd, screen, own)
        off = sorted(n for n, w in shards["work"].items() if w != here)
        if off:
            raise OptionError(f"{', '.join(off)}: computed against another loss, joint screen or parameter list "
                              "than this process's (a non-deterministic forward?); re-run the shards",
                              field="--fd-from")
        absent = [p for p in own if p not in shards["params"]]
        if absent:
            raise OptionError(f"no shard holds parameter '{absent[0][:200]}'", field="--fd-from")

        def lookup(name, g):
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
