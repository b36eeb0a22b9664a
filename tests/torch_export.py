"""torch.onnx's exporters, as the torch-and-ONNX tests (test_bert_torch, test_onnx_constant_subgraphs_torch)
call them."""
from __future__ import annotations

import io
import warnings

import pytest


def export_onnx(model, args, exporter: str) -> bytes:
    """The model exported to ONNX bytes by torch's "legacy" exporter, or by "dynamo" (with its optimizer) or
    "dynamo-unoptimized" (skipped without onnxscript)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            f = io.BytesIO()
            torch.onnx.export(model, args, f, dynamo=False)
            return f.getvalue()
        pytest.importorskip("onnxscript")
        import logging

        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        program = torch.onnx.export(model, args, dynamo=True, optimize=exporter == "dynamo", verbose=False)
        return program.model_proto.SerializeToString()
