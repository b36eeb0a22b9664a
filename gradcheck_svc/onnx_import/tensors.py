"""Every TensorProto of a model or a request, and the one rule about files: no request names one.

A TensorProto may say that its bytes live in a file (`data_location: EXTERNAL`, `external_data`
with a `location`); ONNX's own helpers then open that path relative to the working directory, or
absolute. Bytes that arrive in a request are data: any tensor in them that names a file (an
input, the cotangent, an initializer, a sparse tensor, a node attribute, in any subgraph or
function) is refused before anything is read (`refuse_external`). Only a model file named on
the command line may keep its weights beside it (`load_beside`: the client's reader, which every
client uses to embed them in what it sends, gradcheck_core/onnx_files.py).
"""
from __future__ import annotations

from gradcheck_core.onnx_files import all_tensors, describe as _describe, uses_external  # noqa: F401

from ..errors import GraphError, LimitError


def refuse_external(message, field: str) -> None:
    """GraphError naming the first tensor inside `message` that names a file; nothing is opened."""
    for t, where in all_tensors(message):
        if uses_external(t):
            raise GraphError(f"{_describe(t, where)} refers to external data (a file); a request cannot name "
                             "a file: embed the data (onnx.save(..., save_as_external_data=False)), or send the model with the "
                             "gradcheck client (`gradcheck verify`, OnnxModel.from_file), which embeds it", field=field)


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


def parse_data(data: bytes, field: str, allow_nonfinite: bool = False):
    """parse_tensor of a tensor the user gave (an input's value, the cotangent): NaN/Inf refused unless
    allowed, as validation refuses them in a graph's inputs."""
    from ..graph.validate import refuse_nonfinite

    value = parse_tensor(data, field)
    if not allow_nonfinite and value.dtype.kind == "f":
        refuse_nonfinite(value, field)
    return value


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- the command line: a model's data files, beside it ---------------------------------------

def file_error(exc, field: str):
    """An OnnxFileError (the client's reader of a model's files) as the GradcheckError it is."""
    if exc.limit:
        return LimitError(str(exc), field=field, limit=exc.limit)
    return GraphError(str(exc), field=field)


def load_beside(message, base_dir, field: str, max_elements: int | None = None) -> None:
    """Load, into `message`, the external data of every tensor inside it from files in base_dir (the
    directory of the model or tensor file the user named): the core reader (gradcheck_core/
    onnx_files.py, which embeds it in what a client sends), its one-line refusals as GradcheckErrors."""
    from gradcheck_core.onnx_files import OnnxFileError, load_beside as load

    try:
        load(message, base_dir, max_elements)
    except OnnxFileError as exc:
        raise file_error(exc, field) from None
