"""Prometheus metrics (prometheus_client) and the per-request log line.

The server's own registry (not the process-global default, so tests can run
several servers in one process) with process and platform metrics, and the
counters, gauges and the latency histogram the server updates. Exposition and
the HTTP thread are prometheus_client's.
"""
from __future__ import annotations

import json
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.requests = Counter("gradcheck_requests", "Verifications by method and status code "
                                "(DEADLINE_EXCEEDED: the client's deadline or the server's limit; "
                                "CANCELLED: the client cancelled or went away)", ["method", "code"], registry=r)
        self.latency = Histogram("gradcheck_request_duration_seconds", "Request latency by method", ["method"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.verdicts = Counter("gradcheck_verdicts", "Reports by verdict", ["verdict"], registry=r)
        self.findings = Counter("gradcheck_findings", "Findings by cause", ["cause"], registry=r)
        self.auth_failures = Counter("gradcheck_auth_failures", "Calls refused for a missing or wrong bearer "
                                     "token, by method", ["method"], registry=r)
        self.worker_restarts = Counter("gradcheck_worker_restarts", "Worker processes replaced (died, "
                                       "cancelled, timed out)", registry=r)

    def gauge(self, name: str, text: str, read) -> None:
        """A gauge read at scrape time from `read()`."""
        Gauge(name, text, registry=self.registry).set_function(read)

    def request(self, method: str, code: str, seconds: float) -> None:
        self.requests.labels(method=method, code=code).inc()
        self.latency.labels(method=method).observe(seconds)

    def verdict(self, verdict: str, causes) -> None:
        self.verdicts.labels(verdict=verdict).inc()
        for cause in causes:
            self.findings.labels(cause=cause).inc()

    def serve_http(self, host: str, port: int):
        """Serve /metrics on a daemon thread; returns the HTTP server (its server_address has the port)."""
        httpd, _thread = start_http_server(port, addr=host, registry=self.registry)
        return httpd


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: the record's `fields` plus time, level and message."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(), "msg": record.getMessage()}
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)  # server log only, never to clients
        return json.dumps(line, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger("gradcheck")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
