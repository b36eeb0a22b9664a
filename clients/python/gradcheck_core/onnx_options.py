"""How an ONNX model becomes a graph: the import options, defined once.

Each row is one field of the OnnxImport message (service.proto) and one flag
of `gradcheck-svc import-onnx`, `gradcheck-svc verify MODEL.onnx` and
`gradcheck verify MODEL.onnx`. Tensor files (--input, --cotangent) travel as
the bytes of a serialized onnx.TensorProto; the server parses them, so the
client never imports onnx.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InvalidInput
from .options import Option, add_flag

if TYPE_CHECKING:  # protobuf costs ~15 ms to import: only a model's import options need it
    from gradcheck.v1 import service_pb2

ONNX_SUFFIX = ".onnx"


ONNX_FLAGS: tuple[Option, ...] = (  # the rows of options.py's kind; each name is an OnnxImport field
    Option("params", "which values become parameters: comma-separated weights (float initializers of "
           "rank >= 1; scalar ones, masks (|entry| >= 1e30), rotary cos/sin tables and a dynamo export's folded "
           "constants stay constants), initializers (all float ones), "
           "inputs, constants (values "
           "nodes make at import time, e.g. ConstantOfShape weights), all, none, or value names",
           default="weights", metavar="SPEC"),
    Option("inputs", "a graph input's value from a TensorProto file (repeatable; default: generated from "
           "--input-seed)", metavar="NAME=FILE.pb", flag="--input", repeated=True),
    Option("input_seed", "seed for graph inputs not given (uniform in [0, 1); default 0)", type=int, default=0,
           metavar="N"),
    Option("loss_output", "the model output the loss reduces (default: the first)", metavar="NAME"),
    Option("loss", "reduce the output to the scalar loss by sum, mean, or cotangent (sum of output * "
           "cotangent)", default="sum", choices=("sum", "mean", "cotangent")),
    Option("cotangent", "the cotangent as a TensorProto file (default: standard normal from --cotangent-seed)",
           metavar="FILE.pb"),
    Option("cotangent_seed", "seed for the cotangent (default 0)", type=int, default=0, metavar="N"),
)


def add_onnx_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ONNX import (models given as .onnx)")
    for o in ONNX_FLAGS:
        add_flag(group, o, "onnx_" + o.name)


def is_onnx(path) -> bool:
    return str(path).lower().endswith(ONNX_SUFFIX)


class OnnxFlagError(InvalidInput, ValueError):
    """A bad --input / --cotangent argument (one line)."""


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OnnxFlagError(f"{flag}: cannot read '{path}': {exc.strerror or exc}") from None


def refuse_unused_onnx_flags(args, paths) -> None:
    """OnnxFlagError where an ONNX import flag is given and none of the paths is an ONNX model: the flag
    would change nothing (a graph's own values are verified), and an ignored --input looks honoured."""
    if any(is_onnx(p) for p in paths):
        return
    for o in ONNX_FLAGS:
        if getattr(args, "onnx_" + o.name, None) is not None:
            raise OnnxFlagError(f"{o.cli_flag}: applies to ONNX models (.onnx) only, and no path given is one")


def onnx_import_message(args) -> service_pb2.OnnxImport:
    """The OnnxImport message from parsed flags (tensor files read as bytes, unparsed)."""
    from gradcheck.v1 import service_pb2

    msg = service_pb2.OnnxImport()
    for f in ONNX_FLAGS:
        value = getattr(args, "onnx_" + f.name, None)
        if value is None:
            continue
        if f.name == "inputs":
            for item in value:
                name, sep, path = item.partition("=")
                if not sep or not name or not path:
                    raise OnnxFlagError(f"--input: '{item}' is not NAME=FILE.pb")
                msg.inputs[name] = _read(path, "--input")
        elif f.name == "cotangent":
            msg.cotangent = _read(value, "--cotangent")
        else:
            setattr(msg, f.name, value)
    return msg


@dataclass
class OnnxModel:
    """An ONNX model to verify: its file's bytes and how to import it (and the gradients claimed for it,
    graph.proto's Claims, keyed by initializer or torch names: gradcheck_svc/onnx_import/claim_names.py)."""

    data: bytes
    options: service_pb2.OnnxImport
    claims: object = None  # graph_pb2.Claims | None

    @classmethod
    def from_file(cls, path, options: service_pb2.OnnxImport | None = None, **limits) -> "OnnxModel":
        """The model at `path`, its external data (files beside it) embedded: what every door sends
        (onnx_files.py). limits: max_elements / max_bytes, checked before a data file is read.
        Raises OSError (the file) or onnx_files.OnnxFileError (its data)."""
        from .onnx_files import model_bytes

        if options is None:
            from gradcheck.v1 import service_pb2

            options = service_pb2.OnnxImport()
        return cls(model_bytes(path, **limits), options)
