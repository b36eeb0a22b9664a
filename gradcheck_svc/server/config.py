"""Server settings and limits, with safe defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OptionError
from ..graph.validate import Limits

DEFAULT_TOKEN_ENV = "GRADCHECK_TOKEN"


@dataclass(frozen=True)
class ServerLimits:
    graph: Limits = field(default_factory=lambda: Limits(max_nodes=100_000, max_elements=10_000_000))
    max_message_bytes: int = 16 * 2**20  # one request or response
    max_symbolic_budget: int = 5_000  # scalar elements the symbolic oracle may expand
    max_request_seconds: float = 120.0  # per verification, whatever the client's deadline
    max_queue: int = 64  # requests waiting for a worker beyond the busy ones


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    workers: int = max(1, (os.cpu_count() or 1))
    limits: ServerLimits = field(default_factory=ServerLimits)
    token: str | None = None  # bearer token; None: no auth
    tls_cert: Path | None = None
    tls_key: Path | None = None
    metrics_port: int | None = None  # Prometheus text on http://host:metrics_port/metrics
    grace_seconds: float = 30.0  # SIGTERM: time in-flight requests get to finish


def read_token(token_file: str | None, token_env: str = DEFAULT_TOKEN_ENV) -> str | None:
    """The bearer token from a file (first line) or, failing that, an environment variable."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise OptionError(f"cannot read token file: {exc.strerror or exc}", field="--token-file") from None
        if not token:
            raise OptionError("token file is empty", field="--token-file")
        return token
    return os.environ.get(token_env) or None
