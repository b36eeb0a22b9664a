"""The one family of user-facing errors (below gradcheck_core.errors.InvalidInput).

Every problem a user can cause (a bad graph, a bad option, a request over a
limit) is a GradcheckError carrying the node or field it concerns and a
one-line reason. Exactly one place per front end maps them to an outcome:
cli.py to exit codes, server/ to gRPC status codes. Anything else that
escapes is an internal fault and is never shown as a traceback.
"""
from __future__ import annotations

from gradcheck_core.errors import InvalidInput

from .text import clip, cut_bytes


class GradcheckError(InvalidInput):
    """A user error -- invalid input (gradcheck_core.errors.InvalidInput: exit 2), never "gradients did not
    verify" (that is gradcheck_core.errors.GradientsNotVerified, e.g. gradcheck_client.torch.GradcheckError):
    `where` names the node or field, `reason` says what is wrong."""

    kind = "invalid"

    def __init__(self, reason: str, *, node: str | None = None, field: str | None = None):
        # names come from requests: bounded and escaped here, once, for every front end
        self.reason = cut_bytes(reason)
        self.node = None if node is None else clip(node)
        self.field = None if field is None else clip(field)
        super().__init__(self.message)

    def __reduce__(self):  # pickled whole (bounded.py's child sends it back): node, field, limit and all
        return _rebuild, (type(self), self.__dict__)

    @property
    def where(self) -> str | None:
        if self.node is not None:
            return f"node '{self.node}'"
        if self.field is not None:
            return self.field
        return None

    @property
    def message(self) -> str:
        """One line, at most MAX_MESSAGE_BYTES (reasons quote user strings; see text.py)."""
        return cut_bytes(f"{self.where}: {self.reason}" if self.where else self.reason)


def _rebuild(cls, state: dict) -> GradcheckError:
    exc = cls.__new__(cls)
    exc.__dict__.update(state)
    Exception.__init__(exc, exc.message)
    return exc


class GraphError(GradcheckError):
    """The graph is malformed: unknown op, bad attribute, shape mismatch, cycle..."""


class OptionError(GradcheckError):
    """A request or command-line option is invalid (bad --fault, unknown device...)."""


class LimitError(GradcheckError):
    """The request is valid but exceeds a configured limit; `limit` names it (limits.py's LIMITS name,
    e.g. "max_elements") where a flag raises it, so the command line can say which."""

    kind = "limit"

    def __init__(self, reason: str, *, node: str | None = None, field: str | None = None, limit: str | None = None):
        super().__init__(reason, node=node, field=field)
        self.limit = limit


class TimeLimitError(LimitError):
    """A verification ran past its time limit (in-process; the server answers DEADLINE_EXCEEDED)."""

    kind = "timeout"


class BackendUnavailable(GradcheckError):
    """The requested device/backend cannot be used on this machine."""

    kind = "unavailable"


class InplaceHazardError(GradcheckError):
    """The backward pass needs a saved value that an in-place node overwrote after it was saved."""
