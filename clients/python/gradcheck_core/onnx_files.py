"""An ONNX model file the user named, as a request carries it: self-contained bytes.

A model may keep its tensors' bytes in files beside it (`data_location: EXTERNAL`, `external_data`
with a `location`: `onnx.save(..., save_as_external_data=True)`, the torch exporter's default for
big models). No request may name a file (the server refuses one that does), so the file's own
reader -- the client, the CI command, `gradcheck-svc verify` -- reads that data from beside the
model and embeds it (`model_bytes`): the same bytes are then verified in process and by a server,
and every limit (the request's bytes, its elements) measures the weights too.

Read under the rules of ONNX's checker: a relative location, no `..`, no symlink, a regular file
inside the model's directory, the length the tensor's dims and type need. Needs the `onnx` package
only for a model that names a data file (the exporter that wrote it needed it too).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InvalidInput

_TENSOR = "onnx.TensorProto"
_MARK = b"location"  # every external_data entry holds this key: a model without it names no file
PROTOBUF_MAX_BYTES = 2**31 - 1  # one serialized protobuf message, at most


class OnnxFileError(InvalidInput, ValueError):
    """A model file or its data that cannot be read as a request: one line. `limit` names the
    ServerLimits field it is over (a flag raises it), if any."""

    def __init__(self, reason: str, limit: str | None = None):
        super().__init__(reason)
        self.limit = limit


def _node_label(node) -> str:
    return f"node '{node.name}'" if node.name else f"the {node.op_type} node producing '{(node.output or ['?'])[0]}'"


def all_tensors(message):
    """(TensorProto, where) for every TensorProto inside `message` (a ModelProto, GraphProto,
    TensorProto ...), found by walking every message field: sparse tensors, attributes and
    subgraphs included, so no position can be missed. `where` names the innermost node, if any."""
    stack = [(message, None)]
    while stack:
        msg, where = stack.pop()
        if msg.DESCRIPTOR.full_name == _TENSOR:
            yield msg, where
            continue
        if msg.DESCRIPTOR.full_name == "onnx.NodeProto":
            where = _node_label(msg)
        for fd, value in msg.ListFields():
            if fd.message_type is None:
                continue
            for item in (value if fd.is_repeated else (value,)):
                stack.append((item, where))


def uses_external(t) -> bool:
    from onnx import TensorProto

    return t.data_location == TensorProto.EXTERNAL or len(t.external_data) > 0


def describe(t, where) -> str:
    name = f"tensor '{t.name}'" if t.name else "a tensor"
    return f"{name} in {where}" if where else name


def _elements(t, where_t: str) -> int:
    n = 1
    for d in t.dims:
        if d < 0:
            raise OnnxFileError(f"{where_t} has a negative dimension {d}")
        n *= d
    return n


def _data_bytes(t, where_t: str, n: int) -> int:
    """The number of bytes a tensor's data of n elements must have, from its type (before reading)."""
    from onnx import TensorProto, helper

    if t.data_type == TensorProto.STRING:
        raise OnnxFileError(f"{where_t}: string tensors cannot be stored as external data")
    packed = {getattr(TensorProto, k) for k in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, k)}
    if t.data_type in packed:
        return (n + 1) // 2
    try:
        return n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:
        raise OnnxFileError(f"{where_t} has an unknown data type {t.data_type}") from None


def _safe_path(base: Path, location: str, where_t: str) -> Path:
    """base/location, refused unless it is a regular file inside base reached without a symlink."""
    rel = Path(location)
    if not location or rel.is_absolute() or ".." in rel.parts or location.startswith(("/", "\\")) or "\\" in location:
        raise OnnxFileError(f"{where_t}: external data location '{location}' must be a file name relative to the "
                            "model's directory (no absolute path, no '..')")
    real_base = Path(os.path.realpath(base))
    target = real_base / rel
    if os.path.realpath(target) != os.path.normpath(target):  # some component is a symlink
        raise OnnxFileError(f"{where_t}: external data location '{location}' is a symbolic link (or passes "
                            "through one); it must be a plain file beside the model")
    try:
        st = os.stat(target, follow_symlinks=False)
    except OSError as exc:
        raise OnnxFileError(f"{where_t}: external data file '{location}' is missing (looked in {base}: "
                            f"{exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise OnnxFileError(f"{where_t}: external data '{location}' is not a regular file")
    return target


def _read_segment(path: Path, offset: int, size: int, where_t: str) -> bytes:
    # O_NONBLOCK: should the file have become a FIFO since it was checked, open does not wait
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise OnnxFileError(f"{where_t}: cannot open external data '{path.name}': {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OnnxFileError(f"{where_t}: external data '{path.name}' is not a regular file")
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise OnnxFileError(f"{where_t}: external data file '{path.name}' holds {len(data)} bytes from offset "
                            f"{offset}, the tensor needs {size}")
    return data


def _segments(message, max_elements: int | None) -> list:
    """(tensor, where, location, offset, size) of every tensor inside `message` that names a data file,
    checked before anything is read (their elements together within max_elements)."""
    out, elements = [], 0
    for t, where in all_tensors(message):
        if not uses_external(t):
            continue
        where_t = describe(t, where)
        info = {e.key: e.value for e in t.external_data}
        n = _elements(t, where_t)
        elements += n
        size = _data_bytes(t, where_t, n)
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else size
        except ValueError:
            raise OnnxFileError(f"{where_t}: external data offset/length are not integers") from None
        if offset < 0 or length != size:
            raise OnnxFileError(f"{where_t}: external data length {length} at offset {offset} does not fit "
                                f"its {size} bytes")
        out.append((t, where_t, info.get("location", ""), offset, size))
    if max_elements is not None and elements > max_elements:  # the graph holds them all, and more
        raise OnnxFileError(f"the model's external tensors alone hold {elements} elements, over the limit of "
                            f"{max_elements}", limit="max_elements")
    return out


def load_beside(message, base_dir, max_elements: int | None = None, max_bytes: int | None = None) -> int:
    """Load, into `message`, the external data of every tensor inside it from files in base_dir
    (the directory of the model or tensor file the user named), checked as _safe_path says; the
    tensors then hold their data (data_location DEFAULT), so nothing later opens a file. Returns how
    many tensors were loaded. max_bytes: refuse, before reading, data that alone is more (the request
    limit max_message_bytes; one protobuf message holds 2 GiB at most whatever it is)."""
    from onnx import TensorProto

    base = Path(base_dir)
    segments = _segments(message, max_elements)
    total = sum(s[-1] for s in segments)
    for limit, name in ((max_bytes, "max_message_bytes"), (PROTOBUF_MAX_BYTES, None)):
        if limit is not None and total > limit:
            raise OnnxFileError(f"the model's external data alone is {total} bytes, over the request limit of "
                                f"{limit}" + ("" if name else " (protobuf's largest message)"), limit=name)
    for t, where_t, location, offset, size in segments:
        t.raw_data = _read_segment(_safe_path(base, location, where_t), offset, size, where_t)
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT
    return len(segments)


def model_bytes(path, max_elements: int | None = None, max_bytes: int | None = None) -> bytes:
    """The bytes a request carries for the model file at `path`: the file's own, or, when its tensors
    name data files beside it, the model with that data embedded (OnnxFileError if it cannot be).
    Raises OSError if the file itself cannot be read. Without `onnx` installed the bytes go as they
    are (a model naming a file is then refused where it is imported, with the reason)."""
    path = Path(path)
    data = path.read_bytes()
    if _MARK not in data:
        return data
    try:
        import onnx
    except ImportError:
        return data
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # DecodeError: the importer says what is wrong with it
        return data
    if not load_beside(model, path.parent, max_elements, max_bytes):
        return data
    return model.SerializeToString()
