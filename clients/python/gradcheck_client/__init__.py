"""Python client for the gradcheck service (gRPC).

Client / AsyncClient talk to a server; Report is a plain result object;
graphio loads and saves graph files; tracer records graphs from Python code.
Depends only on grpcio, protobuf and numpy.
"""
__version__ = "0.1.0"

from .client import AsyncClient, Client, VerifyError  # noqa: E402
from .graphio import GraphFileError, load_graph, save_graph  # noqa: E402
from .onnx_options import OnnxModel  # noqa: E402
from .report import Finding, GradientMismatch, Parameter, Report  # noqa: E402
from .tracer import Tracer, ops  # noqa: E402

__all__ = ["AsyncClient", "Client", "Finding", "GradientMismatch", "GraphFileError", "OnnxModel", "Parameter", "Report",
           "Tracer", "VerifyError", "load_graph", "ops", "save_graph"]
