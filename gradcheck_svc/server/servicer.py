"""GradCheckService: thin. Parse, hand the bytes to the worker pool, map the outcome.

Verify and VerifyStream take raw request bytes (no deserializer in the method
handler) so that a malformed payload becomes INVALID_ARGUMENT here, not an
opaque error inside gRPC, and so the worker receives the bytes untouched.

Verify is served as a client-streaming method (the wire format of a unary call is
the same): its handler runs when the call arrives, so a busy server refuses
before it receives and parses up to max_message_bytes, and a call whose deadline
passes or that is cancelled while its request is still arriving is logged and
counted like any other. Every Verify call and VerifyStream item is logged and
counted exactly once, with the code it ended with.
"""
from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gradcheck.v1 import service_pb2

from .. import __version__, errors
from ..limits import check_request_size
from ..text import clip
from .config import ServerConfig
from .metrics import Metrics
from .pool import WorkerPool
from .status import failure_for

SERVICE = "gradcheck.v1.GradCheckService"
EMPTY_REQUEST_WAIT = 0.2  # seconds a Verify call without a request message waits for its cancellation
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


async def _ready(payload: bytes) -> bytes:
    return payload


def _parse_or_none(payload: bytes):
    try:
        return service_pb2.VerifyRequest.FromString(payload)
    except DecodeError:
        return None


def _request_id(request) -> str:
    """The client's tag, echoed unchanged in the response (it correlates stream items)."""
    return request.id if request is not None else ""


def _what(request) -> dict:
    """What the request log says of the request's graph: its name and size, or for an ONNX model
    (imported in the worker, so unnamed here) its size in bytes."""
    if request is None:
        return {"graph": None, "nodes": None}
    if request.onnx_model:
        return {"graph": None, "onnx_model_bytes": len(request.onnx_model)}
    return {"graph": clip(request.graph.name), "nodes": len(request.graph.nodes)}


def _error_from_worker(result: tuple) -> Exception:
    if result[0] == "error":
        _, cls_name, reason, node, field = result
        cls = getattr(errors, cls_name, errors.GradcheckError)
        return cls(reason, node=node, field=field)
    return RuntimeError(f"internal error in worker ({result[1]})")


def list_ops_response() -> service_pb2.ListOpsResponse:
    """The registry, described: generated from gradcheck_svc.ops, never a hand-kept list."""
    from ..ops import OPSET_VERSION, all_ops
    from ..ops.describe import describe

    ops = []
    for op in all_ops():
        d = describe(op)
        d["variadic"] = d["arity"] == "n"
        d["arity"] = 0 if d["variadic"] else d["arity"]
        d["formula"] = d["formula"] or ""
        ops.append(json_format.ParseDict(d, service_pb2.OpInfo(), ignore_unknown_fields=True))
    return service_pb2.ListOpsResponse(opset_version=OPSET_VERSION, ops=ops)


def server_info(config: ServerConfig) -> service_pb2.ServerInfo:
    from ..backend import cuda_available
    from ..batch.store import code_version
    from ..ops import OPSET_VERSION
    from ..oracles import ORACLES

    cuda = cuda_available()
    from ..limits import LIMITS

    return service_pb2.ServerInfo(
        version=__version__, opset_version=OPSET_VERSION,
        backends=[service_pb2.BackendInfo(name="numpy", device="cpu", available=True),
                  service_pb2.BackendInfo(name="cupy", device="cuda", available=cuda)],
        devices=["cpu", "cuda"] if cuda else ["cpu"],
        oracles=list(ORACLES),
        limits=service_pb2.Limits(**{spec.name: getattr(config.limits, spec.name) for spec in LIMITS}),
        workers=config.workers, auth_required=config.token is not None, code_version=code_version())


class GradCheckServicer:
    def __init__(self, config: ServerConfig, pool: WorkerPool, metrics: Metrics):
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self._ops = None
        self._info = server_info(config)
        self.active = 0  # calls of Verify/VerifyStream items not yet logged (shutdown waits for 0)
        metrics.gauge("gradcheck_in_flight", "Verifications running, queued or being received",
                      lambda: pool.pending)
        metrics.gauge("gradcheck_workers", "Worker processes", lambda: pool.size)

    # -- one verification, shared by Verify and VerifyStream --------------------------

    async def _verify_one(self, receive, call: "CallInfo", method: str, received: bytes | None = None):
        """-> (response bytes or None, Failure or None, request id).

        `receive()` gives the request's bytes: for Verify it reads them from the call, after a place
        in the pool is taken (a busy server refuses without reading them); for a VerifyStream item it
        has them already as `received` (the stream's own backpressure bounds what it reads), and the
        busy check still comes before they are parsed (then only for the id the busy answer carries).

        Never touches the call's context: a stream's context may be gone (client cancel, deadline,
        disconnect) while its items are still in the pool, and gRPC's core frees it with the call.
        Everything the log needs was read into `call` when the call started."""
        t0 = time.perf_counter()
        request = None
        outcome: dict = {}
        self.active += 1
        try:
            try:
                with self.pool.admitted():
                    payload = await receive()
                    if payload is None:
                        raise errors.GraphError("malformed VerifyRequest: no request message", field="request")
                    # parsed even when over the limit (the transport admits 2x): the answer carries its id
                    request = _parse_or_none(payload)
                    check_request_size(len(payload), self.config.limits.max_message_bytes)
                    if request is None:
                        raise errors.GraphError("malformed VerifyRequest: not a valid protobuf message",
                                                field="request")
                    # the server's own time limit; the client's deadline or cancel arrives as CancelledError
                    # (grpc.aio cancels this task), and either way pool.run kills the worker doing the work
                    result = await asyncio.wait_for(self.pool.run(payload), self.config.limits.max_request_seconds)
                if result[0] != "ok":
                    raise _error_from_worker(result)
            except asyncio.CancelledError:
                outcome = {"code": call.ended_code()}
                raise
            except Exception as exc:
                if request is None and received is not None:  # a stream item's answer names its id
                    request = _parse_or_none(received)
                failure = failure_for(exc, self.config.limits.max_request_seconds)
                if failure.kind == "internal":
                    log.error("internal error", exc_info=exc)
                outcome = {"code": failure.code.name, "error": failure.message}
                return None, failure, _request_id(request)
            _, response, verdict, causes = result
            outcome = {"code": "OK", "verdict": verdict, "findings": causes}
            self.metrics.verdict(verdict, causes)
            return response, None, request.id
        finally:
            self.active -= 1
            self._account(method, call, request, outcome, time.perf_counter() - t0)

    def _account(self, method: str, call: "CallInfo", request, outcome: dict, seconds: float) -> None:
        """The one log line and the one count of a request."""
        self.metrics.request(method, outcome.get("code", "UNKNOWN"), seconds)
        log.info("request", extra={"fields": {
            "method": method, "peer": call.peer, "id": clip(request.id) if request else None,
            **_what(request), "duration_ms": round(seconds * 1000, 3), **outcome}})

    # -- RPCs ---------------------------------------------------------------------------

    async def verify(self, requests, context) -> bytes:
        call = CallInfo(context)

        async def receive():
            payload = await context.read()
            if payload is not grpc.aio.EOF:
                return payload
            # No message: a client that sent none, or far likelier a call that is ending -- its deadline
            # or a cancel arrives as end-of-request a moment before gRPC cancels this task. Give the
            # cancellation that moment, so that the call is logged with its true code.
            await asyncio.sleep(EMPTY_REQUEST_WAIT)
            if context.cancelled() or call.ended_code() == "DEADLINE_EXCEEDED":
                raise asyncio.CancelledError()
            return None

        response, failure, _ = await self._verify_one(receive, call, "Verify")
        if failure is not None:
            await context.abort_with_status(failure.rich_status())
        return response

    async def verify_stream(self, requests, context):
        """Reports go out as each verification finishes, in completion order.

        One stream keeps at most `workers` items in the pool; further requests are read only as
        earlier ones finish, so a client streaming thousands of graphs gets backpressure (gRPC flow
        control), not RESOURCE_EXHAUSTED for the items beyond the queue."""
        call = CallInfo(context)
        done: asyncio.Queue = asyncio.Queue()
        tasks: set[asyncio.Task] = set()
        slots = asyncio.Semaphore(self.pool.size)

        async def one(payload: bytes, started: list):
            started.append(True)
            try:
                response, failure, rid = await self._verify_one(lambda: _ready(payload), call, "VerifyStream",
                                                                received=payload)
            finally:
                slots.release()
            if failure is not None:
                response = service_pb2.VerifyResponse(id=rid, error=failure.stream_error()).SerializeToString()
            await done.put(response)

        def ended(task: asyncio.Task, payload: bytes, started: list) -> None:
            tasks.discard(task)
            if not started:  # cancelled with the stream before it began: still a request, logged once
                slots.release()
                self._account("VerifyStream", call, _parse_or_none(payload), {"code": call.ended_code()}, 0.0)

        async def reader():
            async for payload in requests:
                try:
                    await slots.acquire()
                except asyncio.CancelledError:  # the stream ended with this item read but not begun
                    self._account("VerifyStream", call, _parse_or_none(payload), {"code": call.ended_code()}, 0.0)
                    raise
                started: list = []
                t = asyncio.create_task(one(payload, started))
                tasks.add(t)
                t.add_done_callback(lambda t, payload=payload, started=started: ended(t, payload, started))

        read = asyncio.create_task(reader())
        getter = None
        try:
            while True:
                live = {t for t in tasks if not t.done()}
                if done.empty() and read.done() and not live:
                    read.result()  # surface a broken request stream
                    return
                getter = asyncio.create_task(done.get())
                await asyncio.wait({getter, *live, *(() if read.done() else (read,))},
                                   return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
        finally:  # client gone or cancelled: stop the work (frees the workers)
            for t in (read, getter, *tasks):
                if t is not None:
                    t.cancel()

    async def list_ops(self, request, context) -> service_pb2.ListOpsResponse:
        if self._ops is None:
            self._ops = list_ops_response()
        return self._ops

    async def get_server_info(self, request, context) -> service_pb2.ServerInfo:
        return self._info

    def handlers(self) -> grpc.GenericRpcHandler:
        ser = lambda m: m.SerializeToString()  # noqa: E731
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Verify": grpc.stream_unary_rpc_method_handler(self.verify),  # see the module's doc
            "VerifyStream": grpc.stream_stream_rpc_method_handler(self.verify_stream),
            "ListOps": grpc.unary_unary_rpc_method_handler(
                self.list_ops, request_deserializer=service_pb2.ListOpsRequest.FromString,
                response_serializer=ser),
            "GetServerInfo": grpc.unary_unary_rpc_method_handler(
                self.get_server_info, request_deserializer=service_pb2.GetServerInfoRequest.FromString,
                response_serializer=ser),
        })

