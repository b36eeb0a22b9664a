"""What tracing raises and warns (the tracer and its NumPy and indexing layers share them)."""


class TracerError(ValueError):
    pass


class UnknownOpError(TracerError, AttributeError):
    """An op the server's registry lacks (an AttributeError too: `hasattr(ops, name)` works)."""


class TracerWarning(UserWarning):
    """A trace-time decision (a branch on data) is baked into the graph."""
