"""ONNX bytes or files -> a checked ModelProto, or one GraphError line.

Checks, in order: the bytes decode as a ModelProto that has a graph (a
truncated or non-ONNX file fails here); the default-domain opset is within
SUPPORTED_OPSETS; tensors stored as external data are present next to the
model (a request's bytes cannot carry them); onnx.checker accepts the model.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import GraphError

SUPPORTED_OPSETS = range(6, 26)  # default domain ("" / "ai.onnx"), inclusive of 6..25


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_model(source, *, where: str = "model"):
    """source: a path or the model's bytes. Returns a ModelProto with external data loaded."""
    import onnx
    from google.protobuf.message import DecodeError

    base_dir = None
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise GraphError(f"cannot read ONNX model: {exc.strerror or exc}", field=str(path)) from None
        base_dir, where = path.parent, str(path)
    else:
        data = bytes(source)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise GraphError(f"not a valid ONNX model ({_one_line(exc)})", field=where) from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.graph.node:
        raise GraphError("not a valid ONNX model (no ir_version or no graph nodes; truncated?)", field=where)
    opset = default_opset(model)
    if opset not in SUPPORTED_OPSETS:
        raise GraphError(f"ONNX opset {opset} is outside the supported range "
                         f"{SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}", field=where)
    _load_external_data(model, base_dir, where)
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx.checker.ValidationError and friends
        raise GraphError(f"invalid ONNX model: {_one_line(exc)}", field=where) from None
    return model


def default_opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def _external_tensors(model):
    from onnx import TensorProto
    from onnx.external_data_helper import _get_all_tensors

    return [t for t in _get_all_tensors(model) if t.data_location == TensorProto.EXTERNAL]


def _load_external_data(model, base_dir, where: str) -> None:
    external = _external_tensors(model)
    if not external:
        return
    first = external[0].name
    location = next((e.value for e in external[0].external_data if e.key == "location"), "?")
    if base_dir is None:
        raise GraphError(f"tensor '{first}' is stored in an external file '{location}', which a request cannot "
                         "carry: save the model with its data inside (onnx.save(..., save_as_external_data=False))",
                         field=where)
    from onnx.external_data_helper import load_external_data_for_model

    for t in external:
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        target = (Path(base_dir) / loc).resolve()
        if not loc or Path(loc).is_absolute() or ".." in Path(loc).parts or not target.is_file():
            raise GraphError(f"external data file '{loc}' for tensor '{t.name}' is missing (looked in "
                             f"{base_dir})", field=where)
    try:
        load_external_data_for_model(model, str(base_dir))
    except Exception as exc:  # a short or unreadable data file
        raise GraphError(f"cannot load external data: {_one_line(exc)}", field=where) from None
