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

import grpc
from google.protobuf import json_format

from gradcheck.v1 import service_pb2

from .. import __version__, errors
from ..config import ServerConfig
from ..limits import check_request_size
from .accounting import Accounting, CallInfo, Ledger, parse_or_none
from .metrics import Metrics
from .pool import WorkerPool
from .status import failure_for
from .tasks import BoundedTasks

SERVICE = "gradcheck.v1.GradCheckService"
EMPTY_REQUEST_WAIT = 0.2  # seconds a Verify call without a request message waits for its cancellation
log = logging.getLogger("gradcheck.server")


async def _ready(payload: bytes) -> bytes:
    return payload


def _error_from_worker(result: tuple) -> Exception:
    if result[0] == "error":
        _, cls_name, reason, node, field = result
        cls = getattr(errors, cls_name, errors.GradcheckError)
        return cls(reason, node=node, field=field)
    return RuntimeError(f"internal error in worker ({result[1]})")


async def _parsed_or_abort(message_type, payload: bytes, context):
    """The request message, or the call ended INVALID_ARGUMENT (kind "invalid", field "request")."""
    from google.protobuf.message import DecodeError

    try:
        return message_type.FromString(payload)
    except DecodeError:
        error = errors.GraphError(f"malformed {message_type.__name__}: not a valid protobuf message", field="request")
        await context.abort_with_status(failure_for(error).rich_status())


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
    from ..store.records import code_version
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
        self.ledger = Ledger(metrics)  # every request's one log line and one count
        self._ops = None
        self._info = server_info(config)
        metrics.gauge("gradcheck_in_flight", "Verifications running, queued or being received",
                      lambda: pool.pending)
        metrics.gauge("gradcheck_workers", "Worker processes", lambda: pool.size)

    @property
    def active(self) -> int:
        """Requests not yet logged (shutdown waits for 0)."""
        return self.ledger.active

    # -- one verification, shared by Verify and VerifyStream --------------------------

    async def _verify_one(self, entry: Accounting, receive):
        """-> (response bytes or None, Failure or None), accounted in `entry` (logged when it closes).

        `receive()` gives the request's bytes: for Verify it reads them from the call, after a place
        in the pool is taken (a busy server refuses without reading them); for a VerifyStream item it
        has them already (the stream's own backpressure bounds what it reads), and the busy check
        still comes before they are parsed.

        Never touches the call's context: a stream's context may be gone (client cancel, deadline,
        disconnect) while its items are still in the pool, and gRPC's core frees it with the call."""
        with entry:
            try:
                result = await self._run(entry, receive)
            except asyncio.CancelledError:  # the client's deadline or cancel: entry says which as it closes
                raise
            except Exception as exc:
                if entry.request is None:  # a stream item's answer names its id
                    entry.request = parse_or_none(entry.payload)
                failure = failure_for(exc, self.config.limits.max_request_seconds)
                if failure.kind == "internal":
                    log.error("internal error", exc_info=exc)
                entry.outcome = {"code": failure.code.name, "error": failure.message}
                return None, failure
            _, response, verdict, causes = result
            entry.outcome = {"code": "OK", "verdict": verdict, "findings": causes}
            self.metrics.verdict(verdict, causes)
            return response, None

    async def _run(self, entry: Accounting, receive) -> tuple:
        """The request read (within a place in the pool), parsed, checked and run by a worker: its result."""
        with self.pool.admitted():
            payload = await receive()
            if payload is None:
                raise errors.GraphError("malformed VerifyRequest: no request message", field="request")
            # parsed even when over the limit (the transport admits 2x): the answer carries its id
            entry.request = parse_or_none(payload)
            check_request_size(len(payload), self.config.limits.max_message_bytes)
            if entry.request is None:
                raise errors.GraphError("malformed VerifyRequest: not a valid protobuf message", field="request")
            # the server's own time limit; the client's deadline or cancel arrives as CancelledError
            # (grpc.aio cancels this task), and either way pool.run kills the worker doing the work
            result = await asyncio.wait_for(self.pool.run(payload), self.config.limits.max_request_seconds)
        if result[0] != "ok":
            raise _error_from_worker(result)
        return result

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

        response, failure = await self._verify_one(self.ledger.open("Verify", call), receive)
        if failure is not None:
            await context.abort_with_status(failure.rich_status())
        return response

    async def verify_stream(self, requests, context):
        """Reports go out as each verification finishes, in completion order.

        The items run as a bounded task group: at most `workers` of one stream in the pool, further
        requests read only as earlier ones finish, so a client streaming thousands of graphs gets
        backpressure (gRPC flow control), not RESOURCE_EXHAUSTED for the items beyond the queue. Each
        item read is accounted from then on: answered, or dropped unstarted when the stream ends."""
        call = CallInfo(context)
        done: asyncio.Queue = asyncio.Queue()
        group = BoundedTasks(self.pool.size)

        async def one(entry: Accounting):
            response, failure = await self._verify_one(entry, lambda: _ready(entry.payload))
            if failure is not None:
                rid = entry.request.id if entry.request is not None else ""
                response = service_pb2.VerifyResponse(id=rid, error=failure.stream_error()).SerializeToString()
            await done.put(response)

        async def reader():
            async for payload in requests:
                entry = self.ledger.open("VerifyStream", call, payload)
                await group.spawn(one(entry), entry.close)

        read = asyncio.create_task(reader())
        getter = None
        try:
            while True:
                live = group.live()
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
            for t in (read, getter):
                if t is not None:
                    t.cancel()
            group.cancel()

    async def list_ops(self, payload: bytes, context) -> service_pb2.ListOpsResponse:
        await _parsed_or_abort(service_pb2.ListOpsRequest, payload, context)
        if self._ops is None:
            self._ops = list_ops_response()
        return self._ops

    async def get_server_info(self, payload: bytes, context) -> service_pb2.ServerInfo:
        await _parsed_or_abort(service_pb2.GetServerInfoRequest, payload, context)
        return self._info

    def handlers(self) -> grpc.GenericRpcHandler:
        ser = lambda m: m.SerializeToString()  # noqa: E731
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Verify": grpc.stream_unary_rpc_method_handler(self.verify),  # see the module's doc
            "VerifyStream": grpc.stream_stream_rpc_method_handler(self.verify_stream),
            # raw bytes, parsed in the handler: a malformed request is INVALID_ARGUMENT, as Verify's is (gRPC's
            # own deserializer answered UNKNOWN "Unexpected DecodeError")
            "ListOps": grpc.unary_unary_rpc_method_handler(self.list_ops, response_serializer=ser),
            "GetServerInfo": grpc.unary_unary_rpc_method_handler(self.get_server_info, response_serializer=ser),
        })

