"""Prometheus metrics (prometheus_client) and the per-request log line.

The server's own registry (not the process-global default, so tests can run
several servers in one process) with process and platform metrics, and the
counters, gauges and the latency histogram the server updates. Exposition is
prometheus_client's; the HTTP server around it is ours, because a scrape port is open to
any client and nothing it does may reach the server: a client that closes early, never
sends its request or never reads the answer costs one thread for at most
SCRAPE_TIMEOUT_S, at most MAX_SCRAPES connections are served at once (more are closed at
once), and every error ends in one log line, never a traceback on stderr (SIGPIPE is
ignored by `serve`: a write to a closed socket is an error here, not the process's death).
"""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import MetricsHandler
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

log = logging.getLogger("gradcheck.metrics")

SCRAPE_TIMEOUT_S = 10.0  # a connection's socket timeout: reading the request and writing the answer
MAX_SCRAPES = 8  # connections served at once; Prometheus scrapes one at a time

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
        httpd = MetricsHTTPServer(host, port, self.registry)
        threading.Thread(target=httpd.serve_forever, daemon=True, name="gradcheck-metrics").start()
        return httpd


class _ScrapeHandler(MetricsHandler):
    timeout = SCRAPE_TIMEOUT_S  # socketserver sets it on the connection: a stalled peer is dropped

    def log_message(self, format, *args):  # http.server's own complaints (timeouts, bad request lines)
        log.debug("metrics: " + format % args)


class MetricsHTTPServer(ThreadingHTTPServer):
    """prometheus_client's handler, behind the bounds above."""

    daemon_threads = True

    def __init__(self, host: str, port: int, registry, max_connections: int = MAX_SCRAPES):
        family, *_, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(sockaddr[:2], type("ScrapeHandler", (_ScrapeHandler,), {"registry": registry}))

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):  # as many scrapes as it serves already: closed unread
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        """The peer went away or stalled (or the exposition failed): one line, and the server goes on."""
        import sys

        exc = sys.exc_info()[1]
        log.warning("metrics request failed", extra={"fields": {"peer": str(client_address[0]),
                                                                 "error": f"{type(exc).__name__}: {exc}"}})


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
    # Python's warnings too (multiprocessing relaunching a resource tracker that died, say): JSON lines,
    # like every other line of the server's log, not a two-line warning among them
    logging.captureWarnings(True)
    for name in ("gradcheck", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
