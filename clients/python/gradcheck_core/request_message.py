"""The VerifyRequest message of a graph (or an ONNX model) and options: what a client sends, and what
the in-process modes hand to gradcheck_svc/request.py. Protobuf only, no gRPC: `gradcheck-svc verify`
and `gradcheck verify` without a server build requests without loading grpc."""
from __future__ import annotations

from pathlib import Path

from gradcheck.v1 import service_pb2

from .errors import InvalidInput
from .graphio import to_graph
from .onnx_options import OnnxModel, is_onnx
from .options import OPTIONS
from .outputs.text import clip

OPTION_FIELDS = tuple(f.name for f in service_pb2.VerifyOptions.DESCRIPTOR.fields)
LIST_OPTIONS = tuple(o.name for o in OPTIONS if o.repeated)  # faults: one item per use of its repeatable flag


class OptionValueError(InvalidInput, ValueError):
    """An option's value that its VerifyOptions field cannot hold (a seed beyond int64, a string count)."""


def options_message(opts: dict) -> service_pb2.VerifyOptions:
    """The VerifyOptions of option values; one that does not fit its field is refused naming it (protobuf's
    own ValueError, "Value out of range: ...", names no field)."""
    try:
        return service_pb2.VerifyOptions(**opts)
    except (ValueError, TypeError):
        for name, value in opts.items():
            try:
                service_pb2.VerifyOptions(**{name: value})
            except (ValueError, TypeError) as exc:
                raise OptionValueError(f"options.{name}: {clip(repr(value), 60)} does not fit the field "
                                       f"({clip(str(exc), 120)})") from None
        raise


def as_list(name: str, value) -> list:
    """A list option's items: one string is one item, as one use of its repeatable flag is (list("z:zero") was
    its characters, each refused as a fault of its own); a value that is neither is refused naming the option."""
    if isinstance(value, (str, bytes)):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise OptionValueError(f"options.{name}: {clip(repr(value), 60)} is not a list of strings "
                               "(or one string)") from None


def make_request(graph, id: str = "", **options) -> service_pb2.VerifyRequest:
    unknown = sorted(set(options) - set(OPTION_FIELDS))
    if unknown:
        raise TypeError(f"unknown verify option(s) {unknown}; expected some of {list(OPTION_FIELDS)}")
    opts = {k: v for k, v in options.items() if v is not None}
    for name in LIST_OPTIONS:
        if name in opts:
            opts[name] = as_list(name, opts[name])
    if isinstance(graph, (str, Path)) and not str(graph).lstrip().startswith("{") and is_onnx(graph):
        graph = OnnxModel.from_file(graph)  # a model file: its bytes, external data embedded (onnx_files.py)
    if isinstance(graph, OnnxModel):  # the server imports it; its claims travel in the (otherwise empty) graph
        request = service_pb2.VerifyRequest(id=id, onnx_model=graph.data, onnx=graph.options,
                                            options=options_message(opts))
        if graph.claims is not None:
            request.graph.claimed.CopyFrom(graph.claims)
        return request
    return service_pb2.VerifyRequest(id=id, graph=to_graph(graph), options=options_message(opts))
