"""Python client for the gradcheck service (gRPC)."""
__version__ = "0.1.0"
