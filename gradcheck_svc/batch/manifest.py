"""Which graphs a batch covers, and which of them belong to shard I of N.

A graph is named by its path relative to the manifest root (POSIX form), and
its shard is a hash of that name modulo N: each graph belongs to exactly one
shard, independent of listing order, of the other graphs, and of the machine
(sha256, not Python's salted hash()).

The manifest may be an object store URL (s3://bucket/graphs/, a glob under
one, a graph or a list file there; location.py): the same four forms, each
listed with one recursive listing of the prefix.
"""
from __future__ import annotations

import glob
import hashlib
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from gradcheck_core.graphio import SUFFIXES as GRAPH_SUFFIXES
from gradcheck_core.onnx_options import ONNX_SUFFIX

from ..errors import OptionError
from ..store.location import ObjectPath, is_url, location

GLOB_CHARS = "*?["
SUFFIXES = (*GRAPH_SUFFIXES, ONNX_SUFFIX)  # graphs, and ONNX models (imported with the batch's --params etc.)


@dataclass(frozen=True)
class Manifest:
    root: Path | ObjectPath
    graphs: tuple[str, ...]  # relative POSIX paths, sorted, unique
    # a local file name that is not UTF-8 is named by its bytes escaped (_name); its real path, by that name
    real: dict = field(default_factory=dict, compare=False)

    def path(self, rel: str) -> Path | ObjectPath:
        return self.real.get(rel) or self.root / rel

    def shard(self, index: int, count: int) -> list[str]:
        return [g for g in self.graphs if shard_of(g, count) == index]


def graph_key(rel: str) -> str:
    """A stable, file-name-safe key for a graph's relative path."""
    return hashlib.sha256(rel.encode("utf-8")).hexdigest()


def shard_of(rel: str, count: int) -> int:
    return int(graph_key(rel)[:16], 16) % count


def _relative(paths, root: Path, field: str) -> tuple[tuple[str, ...], dict]:
    """The graphs' names below root, and the real path of each one named by _name's escapes."""
    rels, real = set(), {}
    for p in paths:
        try:
            rel = Path(os.path.abspath(p)).relative_to(root).as_posix()
        except ValueError:
            raise OptionError(f"'{_name(str(p))}' is outside the manifest root {_name(str(root))}",
                              field=field) from None
        name = _name(rel)
        if name != rel:
            real[name] = root / rel
        rels.add(name)
    clash = sorted(n for n in real if (root / n).is_file())
    if clash:  # `a\xff.json` written out, beside the file whose name has that byte: one name for two graphs
        raise OptionError(f"'{clash[0][:200]}' names two graph files (one of them with a name that is not UTF-8): "
                          "rename one", field=field)
    return tuple(sorted(rels)), real


def _name(rel: str) -> str:
    """A graph's name as every record, key and report carries it: valid UTF-8 text. A local file name that is not
    UTF-8 (os gives its bytes as surrogates) has each such byte written `\\xNN`: a name that can be hashed, stored
    and shown, saying which file it is -- instead of a shard and a merge that cannot encode it (exit 3)."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")
    return rel


def _glob_root(pattern: str) -> Path:
    """The directory part of a glob before its first wildcard: graph names are relative to it."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if any(c in part for c in GLOB_CHARS):
            break
        fixed.append(part)
    return Path(os.path.abspath(Path(*fixed) if fixed else "."))


def load_manifest(spec: str, field: str = "--manifest") -> Manifest:
    """spec: a directory (every *.json/*.pb/*.onnx below it), a glob (recursive `**` allowed), a single graph
    file, or a list file (any other suffix: one graph path per line, relative to the list's directory,
    `#` comments)."""
    if not spec:
        raise OptionError("is empty", field=field)
    if is_url(spec):
        where = location(spec, field)
        if isinstance(where, ObjectPath):
            return _load_objects(where, spec, field)
        spec = str(where)  # file:///...: a local path
    p = Path(spec)
    if any(c in spec for c in GLOB_CHARS) and not p.exists():
        root = _glob_root(spec)
        files = [f for f in glob.glob(spec, recursive=True) if Path(f).is_file()]
    elif p.is_dir():
        root = Path(os.path.abspath(p))
        files = [f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file()]
    elif p.is_file() and p.suffix in SUFFIXES:
        root, files = Path(os.path.abspath(p.parent)), [p]
    elif p.is_file():
        root = Path(os.path.abspath(p.parent))
        try:  # an OSError here (EIO, EACCES) is the volume's: it propagates, and the shard is retried
            lines = p.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise OptionError(f"list file {spec} is not UTF-8 text", field=field) from None
        files = []
        for n, entry in enumerate((ln.split("#", 1)[0].strip() for ln in lines), 1):
            if entry and not (root / entry).is_file():  # a typo is configuration (exit 2), not a bad volume
                raise OptionError(f"list file {spec}, line {n}: no such graph file: {entry[:200]}", field=field)
            if entry:
                files.append(root / entry)
    else:
        raise OptionError(f"no such file, directory or matching glob: {spec}", field=field)
    graphs, real = _relative(files, root, field)
    if not graphs:
        raise OptionError(f"no graphs (*.json, *.pb, *.onnx) in {spec}", field=field)
    return Manifest(root, graphs, real)


def _load_objects(p: ObjectPath, spec: str, field: str) -> Manifest:
    """load_manifest's four forms in an object store, where a "directory" is a prefix (a store failure is an
    OSError: retried, exit 75)."""
    if any(c in p.key for c in GLOB_CHARS) and not p.exists():
        fixed = []
        for part in p.parts:
            if any(c in part for c in GLOB_CHARS):
                break
            fixed.append(part)
        if not fixed:
            raise OptionError(f"'{spec[:200]}': a glob needs a bucket before its first wildcard", field=field)
        root = ObjectPath(p.fs, p.scheme, "/".join(fixed))
        files = [f for f in root.glob("/".join(p.parts[len(fixed):])) if f.is_file()]
    elif p.is_dir():
        root = p
        files = [f for f in p.find() if f.suffix in SUFFIXES]
    elif p.is_file() and p.suffix in SUFFIXES:
        root, files = p.parent, [p]
    elif p.is_file():
        root = p.parent
        try:
            lines = p.read_bytes().decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise OptionError(f"list file {spec[:200]} is not UTF-8 text", field=field) from None
        present = {f.key for f in root.find()}
        files = []
        for n, entry in enumerate((ln.split("#", 1)[0].strip() for ln in lines), 1):
            if not entry:
                continue
            key = f"{root.key}/{entry}"  # an object's own key, as listed (`a//b.json` too), else the path resolved
            key = key if key in present else posixpath.normpath(key)
            if not key.startswith(root.key + "/"):
                raise OptionError(f"list file {spec[:200]}, line {n}: '{entry[:200]}' is outside the manifest root "
                                  f"{root}", field=field)
            if key not in present:
                raise OptionError(f"list file {spec[:200]}, line {n}: no such graph object: {entry[:200]}",
                                  field=field)
            files.append(ObjectPath(p.fs, p.scheme, key))
    else:
        raise OptionError(f"no such object, prefix or matching glob: {spec[:200]}", field=field)
    graphs = tuple(sorted({f.key_below(root) for f in files}))
    if not graphs:
        raise OptionError(f"no graphs (*.json, *.pb, *.onnx) in {spec[:200]}", field=field)
    return Manifest(root, graphs)
