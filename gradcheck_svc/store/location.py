"""Where a batch reads graphs and writes results: a local path, or an object store URL through fsspec.

`location(spec)` is a pathlib.Path for a local path -- the local code paths are
pathlib's and os's, unchanged -- and an ObjectPath for `s3://`, `gs://` or
`az://`: the handful of Path methods the batch uses (`/`, name, suffix,
iterdir, is_dir, is_file, exists, read_bytes, write_bytes, stat, glob,
unlink), each one a call on the fsspec filesystem of its scheme.

fsspec and the scheme's backend (s3fs, gcsfs, adlfs) are an optional extra,
imported only when a URL is given; a URL whose backend is not installed is a
one-line usage error naming the extra. Credentials and endpoints come from each
backend's standard environment (for S3: `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, a web identity
token, an instance profile...), never from flags.

Writes: one object per record, written by one PUT -- an object store makes
an object visible whole or not at all, so a reader never sees half a record
(the local store gets the same by write-then-rename). Every failure of the
store itself (unreachable endpoint, denied access, missing bucket) is an
OSError naming the URL, which the batch turns into its retryable exit 75.
"""
from __future__ import annotations

import errno
import functools
import importlib
import os
import posixpath
import re
from pathlib import Path, PurePosixPath

from ..errors import OptionError
from ..extras import install_hint
from ..text import clip

# scheme -> (the fsspec backend's module, the extra that installs it)
BACKENDS = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
            "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure")}
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.S)
# the environment a backend reads its endpoint and credentials from: a filesystem is reused only under the same
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCE_", "AZURE_", "FSSPEC_")


def is_url(spec) -> bool:
    return isinstance(spec, str) and _URL.match(spec) is not None


def location(spec, field: str):
    """A local path (pathlib.Path) or an object store URL (ObjectPath); an unknown scheme, or one whose
    backend is not installed, is an OptionError naming `field`."""
    if isinstance(spec, ObjectPath) or not is_url(spec):
        return spec if isinstance(spec, ObjectPath) else Path(spec)
    scheme, rest = _URL.match(spec).groups()
    scheme = scheme.lower()
    if scheme == "file":  # file:///data/graphs is a local path, and gets the local path's code
        return Path("/" + rest.lstrip("/"))
    if scheme not in BACKENDS:
        raise OptionError(f"'{scheme[:20]}://' is not a storage this batch reads or writes (a local path, s3://, "
                          "gs:// or az://)", field=field)
    module, extra = BACKENDS[scheme]
    try:  # the backend first: fsspec alone would name a module, not what to install
        importlib.import_module(module)
        import fsspec  # noqa: F401
    except ImportError:
        raise OptionError(f"{scheme}:// needs fsspec and {module}, which are not installed: "
                          f"{install_hint(extra)}", field=field) from None
    key = rest.strip("/")
    if not key:
        raise OptionError(f"'{clip(spec, 200)}' names no bucket", field=field)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))
    return ObjectPath(_filesystem(scheme, env), scheme, key)


@functools.lru_cache(maxsize=8)
def _filesystem(scheme: str, env: tuple):
    """One filesystem per scheme and credential environment (fsspec's own instance cache would hand a test,
    or a process that changed AWS_ENDPOINT_URL, a filesystem made for another endpoint)."""
    import fsspec

    try:
        # no listings cache: other pods write the same prefixes, and a listing remembered is a record missed
        return fsspec.filesystem(scheme, skip_instance_cache=True, use_listings_cache=False)
    except Exception as exc:  # a backend that refuses its configuration (no credentials, a bad account name)
        raise OptionError(f"{scheme}://: {clip(str(exc), 300)}") from None


class _Stat:
    def __init__(self, mtime_ns: int):
        self.st_mtime_ns = mtime_ns


class ObjectPath:
    """A key (or a prefix: a "directory") in an object store. Immutable, like a Path."""

    __slots__ = ("fs", "scheme", "key", "_info", "_data")

    def __init__(self, fs, scheme: str, key: str, info: dict | None = None, exact: bool = False):
        self.fs, self.scheme, self.key = fs, scheme, key if exact else key.strip("/")
        self._info, self._data = info, None

    # --- names ------------------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectPath) and (self.scheme, self.key) == (other.scheme, other.key)

    def __hash__(self) -> int:
        return hash((self.scheme, self.key))

    def __lt__(self, other) -> bool:
        return self.key < other.key

    def __truediv__(self, part) -> ObjectPath:
        """The key `part` names below this one, exactly: `root / "/a.json"` is the key `root//a.json` (an object
        store's key is a string; a slash at either end of `part` is part of the key, never folded away)."""
        return ObjectPath(self.fs, self.scheme, f"{self.key}/{part}", exact=True)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.fs, self.scheme, posixpath.dirname(self.key) or self.key)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.key.split("/"))

    def key_below(self, other: ObjectPath) -> str:
        """This key's rest below `other`, exactly: an object's key is a string, not a path, and `a//b.json`
        is not `a/b.json` (PurePosixPath would fold the two, and the graph named so could never be read)."""
        if not self.key.startswith(other.key + "/"):
            raise ValueError(f"{self} is not under {other}")
        return self.key[len(other.key) + 1:]

    # --- the store --------------------------------------------------------------------------------------
    def _call(self, fn, *args, **kwargs):
        """Every store failure as an OSError naming this URL (botocore's connection errors are not OSErrors)."""
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            if exc.filename is not None and exc.strerror:
                raise
            kind, code = next(((k, c) for k, c in ((FileNotFoundError, errno.ENOENT), (PermissionError, errno.EACCES),
                                                   (FileExistsError, errno.EEXIST)) if isinstance(exc, k)),
                              (OSError, errno.EIO))
            raise kind(exc.errno or code, _one_line(exc.strerror or exc), str(self)) from None
        except Exception as exc:
            raise OSError(errno.EIO, _one_line(f"{type(exc).__name__}: {exc}"), str(self)) from None

    def read_bytes(self) -> bytes:
        got, self._data = self._data, None  # prefetched (prefetch()): handed out once, then read afresh
        if isinstance(got, bytes):
            return got
        if isinstance(got, FileNotFoundError):
            raise FileNotFoundError(errno.ENOENT, "no such object", str(self))
        return self._call(self.fs.cat_file, self.key)

    def write_bytes(self, data: bytes) -> None:
        """One PUT: the object appears whole, or not at all (an upload that fails midway leaves nothing)."""
        self._call(self.fs.pipe_file, self.key, data)

    def create_bytes(self, data: bytes) -> bool:
        """One conditional PUT (If-None-Match: *): True when it created the object, False when one was there. Where
        the conditional PUT itself is refused (a backend without mode="create", a store answering 501) a plain PUT:
        True -- the write is not exclusive there, and a store that is down fails that PUT too (an OSError)."""
        try:
            self._call(self.fs.pipe_file, self.key, data, mode="create")
        except FileExistsError:
            return False
        except OSError:
            self.write_bytes(data)
        return True

    def exists(self) -> bool:
        return self._info is not None or self._call(self.fs.exists, self.key)

    def is_file(self) -> bool:
        if self._info is not None:
            return self._info.get("type") == "file"
        return self._call(self.fs.isfile, self.key)

    def is_dir(self) -> bool:
        """Whether objects lie under this prefix; a bucket that does not exist is an OSError (ENOENT) naming
        it, not a False: the store is not (or not yet) there, a retryable failure (exit 75), where an empty
        prefix in a bucket that is there is the user's to fix."""
        if self._info is not None:
            return self._info.get("type") == "directory"
        if self._call(self.fs.isdir, self.key):
            return True
        bucket = self.key.split("/", 1)[0]
        if bucket and not self._call(self.fs.exists, bucket):
            raise FileNotFoundError(errno.ENOENT, "no such bucket", f"{self.scheme}://{bucket}")
        return False

    def iterdir(self):
        """The objects and prefixes right under this prefix (one listing; each child keeps what it said)."""
        for info in self._call(self.fs.ls, self.key, detail=True):
            name = info["name"].strip("/")
            if name != self.key:
                yield ObjectPath(self.fs, self.scheme, name, info)

    def glob(self, pattern: str):
        """The objects and prefixes matching pattern below this prefix (`**` at any depth)."""
        found = self._call(self.fs.glob, f"{self.key}/{pattern}", detail=True)
        for key, info in sorted(found.items()):
            yield ObjectPath(self.fs, self.scheme, key, info)

    def find(self):
        """Every object below this prefix, at any depth (one recursive listing)."""
        return [ObjectPath(self.fs, self.scheme, k, exact=True) for k in self._call(self.fs.find, self.key)]

    def stat(self) -> _Stat:
        info = self._info if self._info is not None and self._info.get("type") == "file" else None
        stamp = _modified(info) if info else None
        if stamp is None:
            stamp = self._call(self.fs.modified, self.key)
        return _Stat(int(stamp.timestamp() * 1e9))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a prefix exists once an object is under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self._call(self.fs.rm_file, self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise


def _modified(info: dict):
    for k in ("LastModified", "last_modified", "updated", "mtime"):  # s3fs, adlfs, gcsfs, others
        v = info.get(k)
        if v is not None and hasattr(v, "timestamp"):
            return v
    return None


def _one_line(text) -> str:
    return clip(" ".join(str(text).split()), 300)


def prefetch(paths) -> None:
    """Fetch many objects in one concurrent request batch before they are read one by one (a merge reads
    thousands of records: one GET at a time would be one round trip each). Local paths: nothing to do."""
    paths = [p for p in paths if isinstance(p, ObjectPath)]
    if not paths:
        return
    fs = paths[0].fs
    got = paths[0]._call(fs.cat, [p.key for p in paths], on_error="return")
    for p in paths:
        data = got.get(p.key) if isinstance(got, dict) else None
        if isinstance(data, (bytes, FileNotFoundError)):
            p._data = data  # any other error is left for read_bytes to meet (and name) on its own
