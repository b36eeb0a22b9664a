"""An .npz archive read within limits that hold before anything is expanded: the one reader of every
archive a user hands us (`--claimed GRADS.npz` in process, through `gradcheck-svc verify` and before
`gradcheck verify --server` sends it; finite-difference shard files).

np.load inflates each member in full before anyone can look at its size: a few hundred KB of deflated
zeros becomes gigabytes, and a member that is not an .npy array, or an .npy header that is not a dict
literal, ends in a traceback. Here, in order, before a member's data is inflated:
- the path must be a regular file, opened without blocking (a FIFO or a device is refused, not waited on);
- the zip directory (its member count and size, from its end record, before zipfile parses it) and its
  declared member sizes, summed, must fit what a request can carry;
- each member must be NAME.npy, unencrypted, named once; its .npy header is read through numpy's own
  header parser (ast.literal_eval under a length cap: never eval, never a pickle), version 1.0 or 2.0;
- its dtype must be a plain number, its shape x dtype within max_elements and max_bytes (counted as the
  request will carry it: float32 4 bytes, everything else as float64, 8), and the directory's size for
  it exactly header + data (numpy writes nothing else);
- then the data is read in chunks, never more than the header promised plus one byte (to see that
  nothing follows): the declared sizes are checked, never trusted.
Anything else is NpzError: one line naming the file and the member.
"""
from __future__ import annotations

import math
import os
import stat
import struct
import zipfile
from typing import BinaryIO

import numpy as np

# the client's own cap on a message it sends (client.py's max_message_bytes default): with a server, whose
# limits are its own, an archive is read within this
CLIENT_MESSAGE_BYTES = 16 * 2**20
NPY_SUFFIX = ".npy"
# a claim in a request costs at least this many bytes (its map entry: key, dtype, shape, data fields)
MEMBER_MIN_BYTES = 16
_EOCD_MAX = 22 + 65_535  # the end-of-directory record, and the comment that may follow it
_CD_PER_REQUEST_BYTE = 8  # a directory entry (46 bytes + name + zip64 extra) per claim's bytes, at most
HEADER_MAX = 10_000  # numpy's own default cap on an .npy header's length (numpy.lib.format)
_PREFIX_MAX = 6 + 2 + 4  # magic, version, header length (4 bytes in version 2.0)
_CHUNK = 1 << 20
_KINDS = "fiu"  # float, signed and unsigned integer: the numbers a gradient can be


class NpzError(ValueError):
    """An archive the bounded reader does not take: one line naming the file (and the member)."""


def _clip(text, limit: int = 200) -> str:
    """A name or message from the archive: hostile text, cut and escaped to one line (outputs/text.clip)."""
    from .outputs.text import clip

    return clip(text, limit)


def open_regular(path) -> BinaryIO:
    """`path` opened for reading if it is a regular file; NpzError at once otherwise. O_NONBLOCK: opening a
    FIFO would otherwise wait for a writer (the open itself blocks); fstat on what was opened, not a
    second look at the name, so nothing can be swapped in between."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise NpzError(f"{path}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or special file"
        raise NpzError(f"{path}: not a regular file ({kind}): give an .npz archive")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_npz(path, max_elements: int | None = None, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of the .npz archive at `path` by name (the member's name less .npy), read within the
    limits (None: not limited), as the module docstring says; NpzError naming the file and member."""
    with open_regular(path) as f:
        return read_npz_from(f, path, max_elements, max_bytes)


def read_npz_from(f, name, max_elements: int | None = None, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """read_npz of an open seekable binary file (bytes already read: io.BytesIO), called `name` in errors."""
    try:
        if not zipfile.is_zipfile(f):  # (np.load would try other formats: a pickle, a single .npy)
            raise NpzError(f"{name}: not an .npz archive (np.savez writes one)")
        _directory_within(f, name, max_bytes)
        f.seek(0)
        with zipfile.ZipFile(f) as archive:
            members = _members(name, archive.infolist(), max_bytes)
            budget = _Budget(name, max_elements, max_bytes)
            return {key[:-len(NPY_SUFFIX)]: _member(name, archive, info, budget) for key, info in members}
    except NpzError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError,
            RuntimeError, ValueError, OverflowError) as exc:  # a broken zip, a method zipfile cannot inflate
        raise NpzError(f"{name}: not a readable .npz archive ({_clip(str(exc) or type(exc).__name__)})") from None
    except Exception as exc:  # zlib.error, lzma.LZMAError, an odd header: damaged input, never a traceback
        raise NpzError(f"{name}: damaged archive ({type(exc).__name__}: {_clip(str(exc))})") from None


def _directory_within(f, name, max_bytes: int | None) -> None:
    """NpzError when the zip directory itself (which zipfile reads whole, one object per member) lists more
    members than a request of max_bytes could carry claims for: each costs it at least MEMBER_MIN_BYTES."""
    if max_bytes is None:
        return
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - _EOCD_MAX))
    tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        return  # zipfile says what is wrong with it
    entries, cd_size = struct.unpack("<HL", tail[at + 10:at + 16])
    if (entries == 0xFFFF or cd_size == 0xFFFFFFFF) and at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":
        f.seek(struct.unpack("<Q", tail[at - 12:at - 4])[0])  # the zip64 end record, where the locator says
        record = f.read(56)
        if len(record) == 56 and record[:4] == b"PK\x06\x06":
            entries, cd_size = struct.unpack("<QQ", record[32:48])
    if entries > max_bytes // MEMBER_MIN_BYTES or cd_size > max_bytes * _CD_PER_REQUEST_BYTE:
        raise NpzError(f"{name}: its zip directory lists {entries} members in {cd_size} bytes, more than a request "
                       f"of at most {max_bytes} bytes (max_message_bytes) can carry")


def _members(path, infos: list, max_bytes: int | None) -> list:
    """(name, ZipInfo) of every member, checked from the zip directory alone: nothing inflated yet."""
    seen, out, declared = set(), [], 0
    for info in infos:
        name = info.filename
        where = f"{path}: member '{_clip(name)}'"
        if not name.endswith(NPY_SUFFIX):
            raise NpzError(f"{where}: not an .npy array (an .npz holds NAME.npy members; np.savez writes them)")
        if name in seen:
            raise NpzError(f"{where}: named twice in the archive")
        if info.flag_bits & 0x1:
            raise NpzError(f"{where}: encrypted")
        seen.add(name)
        out.append((name, info))
        declared += info.file_size
    # the data goes into the request whole, each number as 4 or 8 bytes: what is read is at most twice that
    # (a float128 carried as float64), plus each member's header
    if max_bytes is not None and declared > _read_cap(max_bytes) + len(out) * (HEADER_MAX + _PREFIX_MAX):
        raise NpzError(f"{path}: its members hold {declared} bytes (the zip directory says), more than a request "
                       f"of at most {max_bytes} bytes (max_message_bytes) can carry")
    return out


def _read_cap(max_bytes: int) -> int:
    """The most data bytes worth reading for a request of max_bytes: 16-byte numbers (float128) become 8."""
    return 2 * max_bytes


class _Budget:
    """What the members read so far have used of max_elements and max_bytes (as carried in the request)."""

    def __init__(self, path, max_elements, max_bytes):
        self.path, self.max_elements, self.max_bytes = path, max_elements, max_bytes
        self.elements = self.bytes = 0

    def take(self, where: str, shape: tuple, dtype: np.dtype) -> None:
        n = math.prod(shape)
        self.elements += n
        self.bytes += n * (4 if dtype == np.float32 else 8)
        if self.max_elements is not None and self.elements > self.max_elements:
            raise NpzError(f"{where}: declares shape {list(shape)}, {n} elements: the archive's arrays reach "
                           f"{self.elements}, over the limit of {self.max_elements} (max_elements)")
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            raise NpzError(f"{where}: declares shape {list(shape)} of {dtype}: the archive's arrays reach "
                           f"{self.bytes} bytes in a request, over the limit of {self.max_bytes} (max_message_bytes)")


def _member(path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: _Budget) -> np.ndarray:
    where = f"{path}: member '{_clip(info.filename)}'"
    with archive.open(info) as stream:
        shape, fortran, dtype, header_len = _header(where, stream)
        budget.take(where, shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if info.file_size != header_len + nbytes:
            raise NpzError(f"{where}: the zip directory says {info.file_size} bytes, its .npy header "
                           f"{header_len} + {nbytes} of data")
        data = _read_exactly(where, stream, nbytes)
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def _header(where: str, stream) -> tuple:
    """(shape, fortran_order, dtype, header length in bytes) of the .npy member open in `stream`, through
    numpy's header reader (literal_eval of at most HEADER_MAX characters); NpzError for anything else."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(stream)
        reader = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f".npy format version {version[0]}.{version[1]} (1.0 and 2.0 are read)")
        shape, fortran, dtype = reader(stream, max_header_size=HEADER_MAX)
    except NpzError:
        raise
    except Exception as exc:  # ValueError, SyntaxError, tokenize's errors: a header that is not numpy's
        raise NpzError(f"{where}: not an .npy array ({_clip(str(exc) or type(exc).__name__)})") from None
    if any(d < 0 for d in shape):
        raise NpzError(f"{where}: declares shape {_clip(str(list(shape)), 80)}, with a negative dimension")
    if dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise NpzError(f"{where}: holds {_clip(str(dtype), 80)} values, not numbers")
    return tuple(shape), bool(fortran), dtype, stream.tell()


def _read_exactly(where: str, stream, nbytes: int) -> bytearray:
    """nbytes from the member, in chunks (inflating at most a chunk more than is kept), then one byte more
    to see that the member ends there (which also has zipfile check its CRC)."""
    data = bytearray(nbytes)
    view, got = memoryview(data), 0
    while got < nbytes:
        chunk = stream.read(min(_CHUNK, nbytes - got))
        if not chunk:
            raise NpzError(f"{where}: cut short ({got} of {nbytes} data bytes)")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    if stream.read(1):
        raise NpzError(f"{where}: holds more data than its .npy header declares")
    return data
