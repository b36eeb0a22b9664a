"""ONNX models in: `import_onnx(path or bytes, ImportOptions) -> gradcheck.v1.Graph`.

The only package that imports `onnx` (the optional extra gradcheck-svc[onnx]);
nothing imports it until an ONNX model arrives. model.py reads and checks the
file, importer.py walks the graph (parameters, inputs, loss), converters.py
maps each ONNX op type onto registry ops.
"""
from __future__ import annotations

from ..errors import GraphError


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise GraphError("ONNX models need the 'onnx' package: pip install 'gradcheck-svc[onnx]'",
                         field="model") from None


def import_onnx(source, options=None, name: str = ""):
    """source: a path or the model's bytes. Returns a gradcheck.v1.Graph message (validate with load_graph)."""
    _require_onnx()
    from pathlib import Path

    from .importer import import_model
    from .model import read_model

    model = read_model(source)
    if not name and isinstance(source, (str, Path)):
        name = Path(source).stem
    return import_model(model, options, name)


def read_tensor(path, field: str = "inputs"):
    """A TensorProto file (.pb, as ONNX's test data) -> (name, NumPy array)."""
    _require_onnx()
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    try:
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        return t.name, numpy_helper.to_array(t)
    except OSError as exc:
        raise GraphError(f"cannot read tensor file '{path}': {exc.strerror or exc}", field=field) from None
    except Exception as exc:  # DecodeError, bad data
        raise GraphError(f"'{path}' is not a TensorProto file ({str(exc).splitlines()[0] if str(exc) else exc})",
                         field=field) from None


def is_onnx_path(path) -> bool:
    return str(path).lower().endswith(".onnx")


def options_from_proto(msg):
    """gradcheck.v1.OnnxImport -> ImportOptions (tensors arrive as serialized TensorProtos)."""
    _require_onnx()
    import onnx
    from onnx import numpy_helper

    from .importer import DEFAULT_PARAMS, ImportOptions

    def tensor(data: bytes, field: str):
        t = onnx.TensorProto()
        try:
            t.ParseFromString(data)
            return numpy_helper.to_array(t)
        except Exception as exc:
            raise GraphError(f"not a serialized TensorProto ({str(exc).splitlines()[0] if str(exc) else exc})",
                             field=field) from None

    return ImportOptions(
        params=msg.params or DEFAULT_PARAMS,
        inputs={name: tensor(data, f"onnx.inputs[{name}]") for name, data in msg.inputs.items()},
        input_seed=msg.input_seed, output=msg.loss_output or None, loss=msg.loss or "sum",
        cotangent=tensor(msg.cotangent, "onnx.cotangent") if msg.cotangent else None,
        cotangent_seed=msg.cotangent_seed)


def graph_from_request(request):
    """The Graph message a VerifyRequest describes: its graph, or its ONNX model imported."""
    if not request.onnx_model:
        return request.graph
    return import_onnx(request.onnx_model, options_from_proto(request.onnx))
