"""gradcheck: a gradient verification service.

Kept light on purpose: importing the package must not pull in NumPy, SymPy,
gRPC or CuPy; each subpackage imports what it needs.
"""
__version__ = "0.1.0"
