"""ONNX bytes or files -> a checked ModelProto, or one GraphError line.

Checks, in order: the bytes decode as a ModelProto that has a graph (a
truncated or non-ONNX file fails here); the default-domain opset is within
SUPPORTED_OPSETS; no tensor names a file, except in a model file named on the
command line, whose data files are read from beside it (tensors.py says how);
onnx.checker accepts the model.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import GraphError
from .tensors import load_beside, refuse_external, refuse_unknown_types

SUPPORTED_OPSETS = range(6, 26)  # default domain ("" / "ai.onnx"), inclusive of 6..25


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_model(source, *, where: str = "model", max_elements: int | None = None):
    """source: a path or the model's bytes. Returns a ModelProto with external data loaded (a path
    only; bytes that name a file are refused). max_elements: the most one external tensor may hold."""
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
    # before the checker, which would look at the named files itself
    if base_dir is None:
        refuse_external(model, where)
    else:
        load_beside(model, base_dir, where, max_elements)
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx.checker.ValidationError and friends
        raise GraphError(f"invalid ONNX model: {_one_line(exc)}", field=where) from None
    refuse_unknown_types(model, where)
    return model


def default_opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1
