"""Python client for the gradcheck service (gRPC).

Client / AsyncClient talk to a server; Report is a plain result object;
graphio loads and saves graph files; tracer records graphs from Python code.
Depends only on grpcio, protobuf and numpy.

These names live in gradcheck_core (the package below both this client and the service, shipped in
this distribution); this package adds the `gradcheck` CI command (cli.py) and the torch front end
(torch/), and reaches gradcheck_svc only inside their in-process entry points.
"""
__version__ = "0.1.0"

import importlib

# Names resolve on first use (PEP 562): `gradcheck_core.graphio` or `.options` alone (the
# server's graph decoder, its CLI) must not pay for importing grpc through `.client`.
_LAZY = {
    "AsyncClient": "client", "Client": "client", "VerifyError": "client",
    "GraphFileError": "graphio", "load_graph": "graphio", "save_graph": "graphio",
    "Finding": "report", "GradientMismatch": "report", "Parameter": "report", "Report": "report",
    "Tracer": "tracer", "ops": "tracer", "OnnxModel": "onnx_options", "check": "check_call",
    "assert_gradients": "check_call",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gradcheck_core.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

__all__ = ["AsyncClient", "Client", "assert_gradients", "check",
           "Finding", "GradientMismatch", "GraphFileError", "OnnxModel", "Parameter", "Report",
           "Tracer", "VerifyError", "load_graph", "ops", "save_graph"]
