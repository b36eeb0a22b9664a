"""The base class of traced values, for the modules the tracer uses (indexing, numpy_compose) to recognise
one without importing tracer.py (which imports them: no import cycle)."""


class Traced:
    """A traced value (tracer.Value is the one subclass)."""

    __slots__ = ()
