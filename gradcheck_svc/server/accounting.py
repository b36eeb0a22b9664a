"""One log line and one metric per request, whatever path it ends by: answered, refused, failed,
cancelled while it arrived, or read from a stream that ended before it began.

A request is opened as an `Accounting` when it is read (or, for Verify, when the call arrives) and
closed exactly once: by the `with` around its work, or by whoever drops it unstarted (the stream's
task group). Closing logs the line and counts the request with the code it ended with.
"""
from __future__ import annotations

import logging
import time

from google.protobuf.message import DecodeError

from gradcheck.v1 import service_pb2

from ..text import clip
from .metrics import Metrics

log = logging.getLogger("gradcheck.server")


class CallInfo:
    """What the log and the metrics need from a call, read when the call starts.

    A call's context must not be touched once the call has ended (gRPC's core frees it: calling
    peer() then crashed the server), and a stream's items outlive it when the client goes away."""

    __slots__ = ("peer", "deadline", "slack")

    def __init__(self, context):
        self.peer = context.peer()
        remaining = context.time_remaining()
        self.deadline = None if remaining is None else time.monotonic() + remaining
        # the client's deadline ends the call a little before the server's copy of it (grpc-timeout is
        # measured from the client's send, the server's deadline from receipt of the headers): a cancel
        # this close to the deadline is the deadline (a loaded machine delays the headers by tens of ms)
        self.slack = 0.0 if remaining is None else min(1.0, 0.1 + 0.01 * remaining)

    def ended_code(self) -> str:
        """Why a call ended early: the client's deadline passed, or it cancelled (or went away)."""
        if self.deadline is not None and time.monotonic() >= self.deadline - self.slack:
            return "DEADLINE_EXCEEDED"
        return "CANCELLED"


def parse_or_none(payload: bytes | None):
    if payload is None:
        return None
    try:
        return service_pb2.VerifyRequest.FromString(payload)
    except DecodeError:
        return None


def _what(request) -> dict:
    """What the request log says of the request's graph: its name and size, or for an ONNX model
    (imported in the worker, so unnamed here) its size in bytes."""
    if request is None:
        return {"graph": None, "nodes": None}
    if request.onnx_model:
        return {"graph": None, "onnx_model_bytes": len(request.onnx_model)}
    return {"graph": clip(request.graph.name), "nodes": len(request.graph.nodes)}


class Ledger:
    """The requests open now (shutdown waits for none) and the one place a request is logged and counted."""

    def __init__(self, metrics: Metrics):
        self.metrics, self.active = metrics, 0

    def open(self, method: str, call: CallInfo, payload: bytes | None = None) -> "Accounting":
        return Accounting(self, method, call, payload)

    def record(self, method: str, call: CallInfo, request, outcome: dict, seconds: float) -> None:
        self.metrics.request(method, outcome.get("code", "UNKNOWN"), seconds)
        log.info("request", extra={"fields": {
            "method": method, "peer": call.peer, "id": clip(request.id) if request else None,
            **_what(request), "duration_ms": round(seconds * 1000, 3), **outcome}})


class Accounting:
    """One request's account. `with` it around the work (the clock starts there); set `request` once it is
    parsed and `outcome` ({"code": ..., more log fields}) as it ends. Without an outcome it ended early:
    cancelled, or past the client's deadline. close() is idempotent."""

    __slots__ = ("ledger", "method", "call", "payload", "request", "outcome", "t0", "closed")

    def __init__(self, ledger: Ledger, method: str, call: CallInfo, payload: bytes | None):
        self.ledger, self.method, self.call, self.payload = ledger, method, call, payload
        self.request, self.outcome, self.t0, self.closed = None, None, None, False
        ledger.active += 1

    def __enter__(self) -> "Accounting":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.ledger.active -= 1
        if self.request is None:  # the answer names the request it could parse (a stream item's id)
            self.request = parse_or_none(self.payload)
        seconds = 0.0 if self.t0 is None else time.perf_counter() - self.t0
        self.ledger.record(self.method, self.call, self.request, self.outcome or {"code": self.call.ended_code()},
                           seconds)
