"""torch.onnx's exporters, as the torch-and-ONNX tests (test_bert_torch, test_onnx_constant_subgraphs_torch)
call them."""
from __future__ import annotations

import io
import warnings

import pytest


def _torchlib_ops_once() -> None:
    """Each dynamo export builds its op registry from onnxscript's torchlib, whose get_torchlib_ops() parses
    the source of ~500 functions again each time (their function_ir, for a domain name): ~1 s of each export's
    ~2.5 s. The list it returns is only read (registration.py builds a fresh registry from it each export), and
    torchlib's functions do not change in a test process: made once, the exports are the same, byte for byte."""
    import functools

    try:
        from onnxscript._framework_apis import torch_2_11 as apis  # what torch 2.13's exporter calls
    except ImportError:  # another onnxscript: exported as it comes
        return
    if not hasattr(apis.get_torchlib_ops, "cache_info"):
        apis.get_torchlib_ops = functools.cache(apis.get_torchlib_ops)


_DYNAMO: dict = {}  # key -> (the dynamo export before its optimizer, the same after it)


def export_onnx(model, args, exporter: str, key=None) -> bytes:
    """The model exported to ONNX bytes by torch's "legacy" exporter, or by "dynamo" (with its optimizer) or
    "dynamo-unoptimized" (skipped without onnxscript).

    `key`: a name for exactly this model and these args (what a seeded builder returns), under which the dynamo
    export is made once per process for both dynamo exporters: torch.onnx.export(dynamo=True) with its
    optimizer is the export without it, then ONNXProgram.optimize() (torch/onnx/_internal/exporter/_core.py;
    with no input or output names to rename after it), so one export gives both, byte for byte -- seconds
    each spared, the optimizer itself taking a tenth of a second."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            f = io.BytesIO()
            torch.onnx.export(model, args, f, dynamo=False)
            return f.getvalue()
        pytest.importorskip("onnxscript")
        if key in _DYNAMO:
            return _DYNAMO[key][exporter == "dynamo"]
        import logging

        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        _torchlib_ops_once()
        program = torch.onnx.export(model, args, dynamo=True, optimize=False, verbose=False)
        plain = program.model_proto.SerializeToString()
        if key is None and exporter != "dynamo":
            return plain
        program.optimize()
        both = (plain, program.model_proto.SerializeToString())
        if key is not None:
            _DYNAMO[key] = both
        return both[exporter == "dynamo"]
