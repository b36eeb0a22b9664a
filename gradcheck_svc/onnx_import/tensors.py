"""Every TensorProto of a model or a request, and the one rule about files: no request names one.

A TensorProto may say that its bytes live in a file (`data_location: EXTERNAL`, `external_data`
with a `location`); ONNX's own helpers then open that path relative to the working directory, or
absolute. Bytes that arrive in a request are data: any tensor in them that names a file (an
input, the cotangent, an initializer, a sparse tensor, a node attribute, in any subgraph or
function) is refused before anything is read (`refuse_external`). Only a model file named on
the command line may keep its weights beside it (`load_beside`), under the rules of ONNX's
checker: a relative location, no `..`, no symlink, a regular file inside the model's directory.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import GraphError, LimitError

_TENSOR = "onnx.TensorProto"


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


def _describe(t, where) -> str:
    name = f"tensor '{t.name}'" if t.name else "a tensor"
    return f"{name} in {where}" if where else name


def refuse_external(message, field: str) -> None:
    """GraphError naming the first tensor inside `message` that names a file; nothing is opened."""
    for t, where in all_tensors(message):
        if uses_external(t):
            raise GraphError(f"{_describe(t, where)} refers to external data (a file); a request cannot name "
                             "a file: embed the data (onnx.save(..., save_as_external_data=False))", field=field)


def _known(code: int) -> bool:
    from onnx import helper

    try:
        helper.tensor_dtype_to_np_dtype(code)
    except Exception:  # KeyError: a code ONNX does not define (or defines without a NumPy type)
        return False
    return True


def refuse_unknown_types(model, field: str) -> None:
    """GraphError naming the first tensor (initializer, Constant, attribute) or graph input whose data
    type is not one ONNX defines: the checker lets such a model through."""
    for t, where in all_tensors(model):
        if not _known(t.data_type):
            raise GraphError(f"{_describe(t, where)} has an unknown data type {t.data_type}", field=field)
    for vi in model.graph.input:
        kind = vi.type.WhichOneof("value")
        if kind == "tensor_type" and not _known(vi.type.tensor_type.elem_type):
            raise GraphError(f"input '{vi.name}' has an unknown element type {vi.type.tensor_type.elem_type}",
                             field=field)


def parse_tensor(data: bytes, field: str):
    """A serialized TensorProto from a request -> NumPy array; one that names a file is refused."""
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    try:
        t.ParseFromString(data)
    except Exception as exc:  # DecodeError
        raise GraphError(f"not a serialized TensorProto ({_one_line(exc)})", field=field) from None
    refuse_external(t, field)
    try:
        return numpy_helper.to_array(t)
    except Exception as exc:  # dims that do not match the data, an unknown data type
        raise GraphError(f"not a serialized TensorProto ({_one_line(exc)})", field=field) from None


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- the command line: a model's data files, beside it ---------------------------------------

def _data_bytes(t, where_t: str, field: str, max_elements: int | None) -> int:
    """The number of bytes a tensor's data must have, from its dims and type (before reading)."""
    from onnx import TensorProto, helper

    n = 1
    for d in t.dims:
        if d < 0:
            raise GraphError(f"{where_t} has a negative dimension {d}", field=field)
        n *= d
    if max_elements is not None and n > max_elements:
        raise LimitError(f"{where_t} holds {n} elements, the limit is {max_elements}", field=field,
                         limit="max_elements")
    if t.data_type == TensorProto.STRING:
        raise GraphError(f"{where_t}: string tensors cannot be stored as external data", field=field)
    packed = {getattr(TensorProto, k) for k in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, k)}
    if t.data_type in packed:
        return (n + 1) // 2
    try:
        return n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:
        raise GraphError(f"{where_t} has an unknown data type {t.data_type}", field=field) from None


def _safe_path(base: Path, location: str, where_t: str, field: str) -> Path:
    """base/location, refused unless it is a regular file inside base reached without a symlink."""
    rel = Path(location)
    if not location or rel.is_absolute() or ".." in rel.parts or location.startswith(("/", "\\")) or "\\" in location:
        raise GraphError(f"{where_t}: external data location '{location}' must be a file name relative to the "
                         "model's directory (no absolute path, no '..')", field=field)
    real_base = Path(os.path.realpath(base))
    target = real_base / rel
    if os.path.realpath(target) != os.path.normpath(target):  # some component is a symlink
        raise GraphError(f"{where_t}: external data location '{location}' is a symbolic link (or passes "
                         "through one); it must be a plain file beside the model", field=field)
    try:
        st = os.stat(target, follow_symlinks=False)
    except OSError as exc:
        raise GraphError(f"{where_t}: external data file '{location}' is missing (looked in {base}: "
                         f"{exc.strerror or exc})", field=field) from None
    if not stat.S_ISREG(st.st_mode):
        raise GraphError(f"{where_t}: external data '{location}' is not a regular file", field=field)
    return target


def _read_segment(path: Path, offset: int, size: int, where_t: str, field: str) -> bytes:
    # O_NONBLOCK: should the file have become a FIFO since it was checked, open does not wait
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise GraphError(f"{where_t}: cannot open external data '{path.name}': {exc.strerror or exc}",
                         field=field) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GraphError(f"{where_t}: external data '{path.name}' is not a regular file", field=field)
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise GraphError(f"{where_t}: external data file '{path.name}' holds {len(data)} bytes from offset "
                         f"{offset}, the tensor needs {size}", field=field)
    return data


def load_beside(message, base_dir, field: str, max_elements: int | None = None) -> None:
    """Load, into `message`, the external data of every tensor inside it from files in base_dir
    (the directory of the model or tensor file the user named), checked as _safe_path says; the
    tensors then hold their data (data_location DEFAULT), so nothing later opens a file."""
    from onnx import TensorProto

    base = Path(base_dir)
    for t, where in all_tensors(message):
        if not uses_external(t):
            continue
        where_t = _describe(t, where)
        info = {e.key: e.value for e in t.external_data}
        size = _data_bytes(t, where_t, field, max_elements)
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else size
        except ValueError:
            raise GraphError(f"{where_t}: external data offset/length are not integers", field=field) from None
        if offset < 0 or length != size:
            raise GraphError(f"{where_t}: external data length {length} at offset {offset} does not fit "
                             f"its {size} bytes", field=field)
        data = _read_segment(_safe_path(base, info.get("location", ""), where_t, field), offset, size,
                             where_t, field)
        t.raw_data = data
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT
