"""A bearer token's one rule, for every door that reads one (the client, its CLI, the server, a batch's
--server): without grpc, so that a command checks it before any channel is made."""
from __future__ import annotations

from .errors import InvalidInput


def token_problem(token: str) -> str | None:
    """Why `token` cannot be sent as a bearer token, or None: gRPC metadata carries printable ASCII only, and
    a newline (a token file of two lines) or a non-ASCII character failed every call with a multi-line log."""
    bad = next((c for c in token if not " " <= c <= "~"), None)
    if bad is None:
        return None
    return f"the token holds {bad!r}, which a request header cannot carry (one line of printable ASCII)"


class TokenError(InvalidInput, ValueError):
    """A bearer token that no request can carry (token_problem)."""
