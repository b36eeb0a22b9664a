"""The graph of a finite-difference split, decoded (an ONNX model imported) once and kept beside its shards.

Every shard and the merge verify the same graph; decoding it -- a 2 MB JSON graph's parse (a quarter of a
second), an ONNX model's import (seconds for ResNet-18) -- is a fixed cost each process pays before any of
its share. The split's last shard writes the graph message it decoded (gradcheck.v1 Graph, deterministic
bytes) beside the shards, DIR/fd-graph-KEY.pb; a later shard (a retry) and the merge read it instead: the
merge, which runs once every shard has ended, always finds it. (Shards started together each decode; only
the last serializes and writes -- ~1 s of ResNet-18's 11 M weights -- not shard 0, whose share is the
memory profile's runs, the critical path.)

KEY is the content key (store/records.py's rule: the content, the options and the version): the sha256 of
the graph file's bytes (an ONNX model's with its external data embedded), of the import options and of this
gradcheck's code version -- a changed file, flag or image decodes again, never reads another's graph. The
file holds the sha256 of its message before the message: a damaged file (a bad disk, a truncated copy) is
decoded again, never read as a graph. Reading or writing it never fails the process: a cache miss costs the
decode it saves, nothing else. Only what the file and the flags fix is cached: an ONNX import with --input
or --cotangent tensor files (their external data is read beside them) decodes every time.
"""
from __future__ import annotations

import hashlib

from ..store.records import as_path, atomic_write, code_version

PREFIX = "fd-graph-"


def graph_key(*parts: bytes) -> str:
    """The content key of a decode: each part's bytes (length-prefixed: no two part lists collide), then the
    code version."""
    h = hashlib.sha256()
    for p in (*parts, code_version().encode()):
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def decoded(where, key: str | None, message_type, decode, write: bool, seen: list | None = None):
    """decode()'s graph message, read from `where` (a shard directory or object path) under `key` when a
    process of the split wrote it there, else decoded (and written there: `write`, a shard; the merge only
    reads what its shards left). key None: decoded, not cached. seen: the message's deterministic bytes are
    appended to it where this call has them (read or written), so that its content digest costs no second
    serialization (ResNet-18's 11 M weights: ~0.3 s)."""
    if key is None:
        return decode()
    path = as_path(where) / f"{PREFIX}{key[:32]}.pb"
    message = _read(path, message_type, seen)
    if message is not None:
        return message
    message = decode()
    if not write:
        return message
    data = message.SerializeToString(deterministic=True)
    if seen is not None:
        seen.append(data)
    try:
        as_path(where).mkdir(parents=True, exist_ok=True)
        atomic_write(path, hashlib.sha256(data).digest() + data)
    except OSError:  # the shard's own file, written next, names a failing volume; a merge needs no cache
        pass
    return message


def _read(path, message_type, seen: list | None = None):
    try:
        data = path.read_bytes()
    except OSError:  # not written yet (or unreadable): decode
        return None
    digest, body = data[:32], data[32:]
    if len(digest) != 32 or hashlib.sha256(body).digest() != digest:
        return None
    message = message_type()
    try:
        message.ParseFromString(body)
    except Exception:  # noqa: BLE001 -- protobuf's DecodeError, whatever the runtime: decoded again
        return None
    if seen is not None:  # the writer's deterministic serialization of this very message
        seen.append(body)
    return message
