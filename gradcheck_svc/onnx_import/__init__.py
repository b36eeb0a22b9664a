"""ONNX models in: `import_onnx(path or bytes, ImportOptions) -> gradcheck.v1.Graph`.

The only package that imports `onnx` (the optional extra `onnx`: pip install '.[onnx]' in a checkout);
nothing imports it until an ONNX model arrives. model.py reads and checks the
file, importer.py walks the graph (parameters, inputs, loss), converters.py
maps each ONNX op type onto registry ops.
"""
from __future__ import annotations

from ..errors import GraphError
from ..extras import install_hint


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise GraphError(f"ONNX models need the 'onnx' package: {install_hint('onnx')}",
                         field="model") from None


def import_onnx(source, options=None, name: str = "", budget=None, where: str = "model"):
    """source: a path or the model's bytes. Returns a gradcheck.v1.Graph message (validate with load_graph).
    budget: a FoldBudget (what import-time folding may compute; default: the default limits'); where: what
    an error about bytes names (a path names itself)."""
    _require_onnx()
    from pathlib import Path

    from .folding import FoldBudget
    from .importer import import_model
    from .model import read_model

    budget = budget or FoldBudget()
    model = read_model(source, where=where, max_elements=budget.max_elements)
    if not name and isinstance(source, (str, Path)):
        name = Path(source).stem
    return import_model(model, options, name, budget)


def embed_beside(data: bytes, base_dir, field: str, max_elements: int | None = None) -> bytes:
    """A serialized TensorProto from a file the user named, its external data (if any) read from
    base_dir and embedded: the bytes then name no file, as a request's must."""
    import onnx

    from .tensors import load_beside, uses_external

    t = onnx.TensorProto()
    try:
        t.ParseFromString(data)
    except Exception:
        return data  # parse_tensor says what is wrong with it
    if not uses_external(t):
        return data
    load_beside(t, base_dir, field, max_elements)
    return t.SerializeToString()


def options_from_proto(msg, allow_nonfinite: bool = False):
    """gradcheck.v1.OnnxImport -> ImportOptions (tensors arrive as serialized TensorProtos; one that
    names a file is refused before anything is read; one holding NaN/Inf unless allow_nonfinite: the
    user's data is checked here, the model's own constants are part of its function)."""
    _require_onnx()
    from .importer import DEFAULT_PARAMS, ImportOptions
    from .tensors import parse_data

    return ImportOptions(
        params=msg.params or DEFAULT_PARAMS,
        inputs={name: parse_data(data, f"onnx.inputs[{name}]", allow_nonfinite)
                for name, data in msg.inputs.items()},
        input_seed=msg.input_seed, output=msg.loss_output or None, loss=msg.loss or "sum",
        cotangent=parse_data(msg.cotangent, "onnx.cotangent", allow_nonfinite) if msg.cotangent else None,
        cotangent_seed=msg.cotangent_seed)


def graph_from_request(request, limits=None):
    """The Graph message a VerifyRequest describes: its graph, or its ONNX model imported within
    the request's limits (a ServerLimits; default: the defaults)."""
    if not request.onnx_model:
        return request.graph
    from .folding import FoldBudget

    budget = FoldBudget.from_limits(limits) if limits is not None else None
    return import_onnx(request.onnx_model, options_from_proto(request.onnx, request.options.allow_nonfinite),
                       budget=budget)
