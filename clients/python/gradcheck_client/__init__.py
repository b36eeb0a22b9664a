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
    "Tracer": "tracer", "ops": "tracer", "OnnxModel": "onnx_options",
}
# this package's own: check() verifies in process (gradcheck-svc) unless server= is given (checking.py)
_OWN = {"check": "checking", "assert_gradients": "checking"}


def __getattr__(name):
    if name in _OWN:
        module = f"{__name__}.{_OWN[name]}"
    elif name in _LAZY:
        module = f"gradcheck_core.{_LAZY[name]}"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_OWN))

__all__ = ["AsyncClient", "Client", "assert_gradients", "check",
           "Finding", "GradientMismatch", "GraphFileError", "OnnxModel", "Parameter", "Report",
           "Tracer", "VerifyError", "load_graph", "ops", "save_graph"]
