"""Server settings and limits, with safe defaults. Kept beside the server package, not in it: both CLIs
(cli.py's serve, batch/cli.py's --token-file) read them without importing the server."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import OptionError
from .limits import ServerLimits

DEFAULT_TOKEN_ENV = "GRADCHECK_TOKEN"


def default_workers() -> int:
    """CPUs this process may use: its affinity mask and its cgroup's CPU quota (a container's
    os.cpu_count() is the node's, not the pod's limit)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by the cgroup (v2 cpu.max, or v1 cfs quota/period); None if unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    workers: int = field(default_factory=default_workers)
    limits: ServerLimits = field(default_factory=ServerLimits)
    token: str | None = None  # bearer token; None: no auth
    tls_cert: Path | None = None
    tls_key: Path | None = None
    metrics_port: int | None = None  # Prometheus text on http://host:metrics_port/metrics
    grace_seconds: float = 30.0  # SIGTERM: time in-flight requests get to finish


def read_token(token_file: str | None, token_env: str = DEFAULT_TOKEN_ENV) -> str | None:
    """The bearer token from a file (first line) or, failing that, an environment variable."""
    from gradcheck_core.token import token_problem

    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise OptionError(f"cannot read token file: {exc.strerror or exc}", field="--token-file") from None
        if not token:
            raise OptionError("token file is empty", field="--token-file")
        where = "--token-file"
    else:
        token, where = os.environ.get(token_env) or None, f"${token_env}"
    if token and token_problem(token):  # no client could send it: every request would be refused
        raise OptionError(token_problem(token), field=where)
    return token
