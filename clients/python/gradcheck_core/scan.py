"""Which files a `gradcheck verify` run takes: paths named, directories searched.

A file named on the command line is always verified (a broken one is reported). A directory
scan takes the files matching the --include globs (default *.json, *.pb, *.onnx) and none of the
--exclude globs, each glob matched against the path below the scanned directory and against
the bare file name; and it skips, with a note, a JSON file that is clearly not a graph: valid
JSON whose top level is not an object with any of the Graph message's fields (a manifest, a
package.json). Invalid JSON is not "clearly not a graph": it is reported as invalid. A file the globs take
that is not a regular file (a broken link, a FIFO, a device) is refused, naming it: left out, a graph the
user meant would be missing from a passing run; read, a FIFO would block for ever.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from gradcheck.v1 import graph_pb2

from .graphio import SUFFIXES
from .onnx_options import ONNX_SUFFIX

DEFAULT_INCLUDE = tuple(f"*{s}" for s in (*SUFFIXES, ONNX_SUFFIX))
# every spelling of a Graph field a JSON graph may use (protobuf JSON accepts both)
GRAPH_KEYS = frozenset(n for f in graph_pb2.Graph.DESCRIPTOR.fields for n in (f.name, f.json_name))


@dataclass
class Scan:
    graphs: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one note per file left out as not a graph


def _matches(rel: PurePosixPath, globs) -> bool:
    return any(fnmatchcase(rel.as_posix(), g) or fnmatchcase(rel.name, g) for g in globs)


def not_a_graph(path: Path) -> str | None:
    """Why a JSON file is clearly not a graph, or None when it may be one (or cannot be read)."""
    if path.suffix != ".json":
        return None
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None  # unreadable or malformed: verify it and report the error
    if not isinstance(doc, dict):
        return f"its top level is a JSON {type(doc).__name__}, not an object"
    if not GRAPH_KEYS & set(doc):
        keys = ", ".join(sorted(doc)[:4]) or "none"
        return f"no graph fields (inputs, nodes, output); its keys: {keys}"
    return None


def find_graphs(paths, include=(), exclude=()) -> Scan:
    include = tuple(include) or DEFAULT_INCLUDE
    scan = Scan()
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = PurePosixPath(f.relative_to(p).as_posix())
                if f.is_dir() or not _matches(rel, include) or _matches(rel, exclude):
                    continue
                if not f.is_file():  # a graph the user meant, never silently left out of a passing run
                    raise FileNotFoundError(f"not a regular file: {f} (a broken link, a FIFO or a device: fix it, "
                                            "or leave it out with --exclude)")
                why = not_a_graph(f)
                if why is None:
                    scan.graphs.append(f)
                else:
                    scan.skipped.append(f"{f}: skipped, not a graph ({why})")
        elif p.is_file():
            scan.graphs.append(p)
        elif p.exists():  # a FIFO, a device or a socket: reading it would block or never end
            raise FileNotFoundError(f"not a regular file or directory: {p}")
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return scan


def graph_paths(paths, include, exclude, prog: str) -> list[str]:
    """The graph files of a verify command (gradcheck-svc verify, gradcheck verify): those named, or found in
    the directories named; each skipped file a note on stderr, not a failure. FileNotFoundError (its one
    line) for a path that is not there, or when nothing is found: each command says it its own way."""
    import sys

    from .outputs.text import clip

    scan = find_graphs(paths, include, exclude)
    for note in scan.skipped:
        print(f"{prog}: {clip(note, 1000)}", file=sys.stderr)
    if not scan.graphs:
        raise FileNotFoundError("no *.json or *.pb graphs (or *.onnx models) found in " + " ".join(map(str, paths)))
    return [str(p) for p in scan.graphs]
