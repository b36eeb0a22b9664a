"""Prometheus metrics (text exposition format) and the per-request log line.

A tiny registry on purpose: counters, gauges and one histogram family are all
the server needs, served by a stdlib HTTP thread at /metrics. Updates come
from the event loop, reads from the HTTP thread, hence the lock.
"""
from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _labels(pairs) -> str:
    if not pairs:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in pairs)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(pairs, esc)) + "}"


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple, float]] = {}
        self._gauges: dict[str, callable] = {}
        self._hist: dict[tuple, list] = {}  # (method,) -> [bucket counts..., sum, count]
        self._help: dict[str, tuple[str, str]] = {}

    def _declare(self, name: str, kind: str, text: str) -> None:
        self._help.setdefault(name, (kind, text))

    def inc(self, name: str, text: str, value: float = 1.0, **labels) -> None:
        self._declare(name, "counter", text)
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[key] = series.get(key, 0.0) + value

    def gauge(self, name: str, text: str, read) -> None:
        """A gauge read at scrape time from `read()`."""
        self._declare(name, "gauge", text)
        self._gauges[name] = read

    def observe_latency(self, method: str, seconds: float) -> None:
        self._declare("gradcheck_request_duration_seconds", "histogram", "Request latency by method")
        with self._lock:
            h = self._hist.setdefault((method,), [0] * (len(LATENCY_BUCKETS) + 2))
            h[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1  # per-bucket, cumulated at render
            h[-2] += seconds
            h[-1] += 1

    def render(self) -> str:
        out = []
        with self._lock:
            for name, series in sorted(self._counters.items()):
                kind, text = self._help[name]
                out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                out += [f"{name}{_labels(k)} {v:g}" for k, v in sorted(series.items())]
            for name, read in sorted(self._gauges.items()):
                kind, text = self._help[name]
                out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {read():g}"]
            if self._hist:
                name = "gradcheck_request_duration_seconds"
                out += [f"# HELP {name} {self._help[name][1]}", f"# TYPE {name} histogram"]
                for (method,), h in sorted(self._hist.items()):
                    cum = 0
                    for le, n in zip((*LATENCY_BUCKETS, "+Inf"), h[:-2]):
                        cum += n
                        out.append(f'{name}_bucket{{method="{method}",le="{le}"}} {cum}')
                    out.append(f'{name}_sum{{method="{method}"}} {h[-2]:g}')
                    out.append(f'{name}_count{{method="{method}"}} {h[-1]}')
        return "\n".join(out) + "\n"

    def serve_http(self, host: str, port: int) -> ThreadingHTTPServer:
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # scrapes are not worth a log line each
                pass

        httpd = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True, name="metrics-http").start()
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
