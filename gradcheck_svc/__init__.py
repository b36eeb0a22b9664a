"""gradcheck: a gradient verification service.

Kept light on purpose: importing the package must not pull in NumPy, SymPy,
gRPC or CuPy; each subpackage imports what it needs.
"""
__version__ = "0.1.0"

import gradcheck_core  # noqa: F401,E402  (sets gRPC's fork-support default before any of ours imports gRPC)

# check(f, *args) and assert_gradients: resolved on first use (PEP 562), so `import gradcheck_svc` stays light
_LAZY = {"check": "check_call", "assert_gradients": "check_call"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
