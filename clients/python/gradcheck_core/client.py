"""Client and AsyncClient for GradCheckService.

    from gradcheck_client import Client
    with Client("localhost:50051") as c:
        c.verify("model.json", fd_mode="full").raise_for_mismatch()

Retries of the unary methods are gRPC's own (a retryPolicy in the channel's
service config): only UNAVAILABLE (server not up yet, connection reset) is
retried, with exponential backoff; everything else is an answer and is raised
at once as VerifyError. A stream is replayed by verify_many itself, on the
same terms, only before its first answer (gRPC's policy on the stream let a
call outlive its deadline when the server died mid-request). A gradient
mismatch is not an error: it is a Report.

Every call ends: `timeout` bounds a call with all its attempts, and a watchdog
of our own cancels a call that gRPC has not ended GRACE seconds after its
deadline (a dead, stopped or half-open server), or a stream that has had no
answer for `idle_timeout` seconds.
"""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

import grpc

from gradcheck.v1 import service_pb2, service_pb2_grpc

from .npz_bounded import CLIENT_MESSAGE_BYTES
from .report import Report, message_to_dict
from .request_message import OPTION_FIELDS, make_request  # noqa: F401 (re-exported: its earlier home)
from .token import TokenError, token_problem

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GradCheckService"].full_name  # gradcheck.v1.GradCheckService
KIND_KEY, FIELD_KEY = "gradcheck-error-kind", "gradcheck-error-field"  # the server's error trailers
INVALID_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                 grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class VerifyError(Exception):
    """The server refused or failed a request.

    code: grpc.StatusCode; kind: the server's error kind (invalid, limit, busy,
    unavailable, timeout, worker_died, internal, or "transport" when no server
    answered); field: the node or field at fault when known; id: the request's id."""

    def __init__(self, code: grpc.StatusCode, message: str, kind: str = "", field: str = "", id: str = ""):
        self.code, self.message, self.kind, self.field, self.id = code, message, kind, field, id
        super().__init__(f"{code.name}: {message}")

    @property
    def invalid_input(self) -> bool:
        """The request itself is at fault (bad graph, bad option, over a limit, bad token)."""
        return self.code in INVALID_CODES or self.kind == "limit"

    @classmethod
    def from_rpc(cls, err: grpc.RpcError, id: str = "") -> "VerifyError":
        meta = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else {}
        kind = meta.get(KIND_KEY, "")
        code = err.code()
        if not kind and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            kind = "transport"
        elif not kind and code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            kind = "limit"  # a message over a transport's size limit (the server's answers carry a kind)
        return cls(code, err.details() or code.name, kind, unquote(meta.get(FIELD_KEY, "")), id=id)

    @classmethod
    def from_stream_item(cls, item: service_pb2.VerifyResponse) -> "VerifyError":
        e = item.error
        code = next((c for c in grpc.StatusCode if c.value[0] == e.code), grpc.StatusCode.UNKNOWN)
        return cls(code, e.message, e.kind, e.field, item.id)


def _requests(graphs, options) -> list[service_pb2.VerifyRequest]:
    """graphs: an iterable of graphs or (id, graph) pairs, or a dict id -> graph; ids default to the index."""
    items = graphs.items() if isinstance(graphs, dict) else graphs
    out = []
    for i, g in enumerate(items):
        gid, graph = g if isinstance(g, tuple) else (str(i), g)
        out.append(make_request(graph, id=str(gid), **options))
    return out


def _read(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def _stream_outcome(item, raise_errors: bool):
    """One VerifyStream item: its Report, or its VerifyError (raised when raise_errors)."""
    if item.WhichOneof("outcome") == "report":
        return Report.from_proto(item.report, id=item.id)
    err = VerifyError.from_stream_item(item)
    if raise_errors:
        raise err
    return err


MAX_ATTEMPTS = 5  # gRPC caps a retry policy's maxAttempts at 5
UNARY_METHODS = tuple(m.name for m in service_pb2.DESCRIPTOR.services_by_name["GradCheckService"].methods
                      if not m.client_streaming and not m.server_streaming)
GRACE = 1.0  # seconds past a call's deadline before the watchdog ends a call gRPC has not ended


def service_config(retries: int, backoff: float) -> str:
    """gRPC's own retry policy for the unary methods only: only UNAVAILABLE (server not up yet,
    connection reset, draining) is retried, with exponential backoff and gRPC's jitter; everything
    else is an answer. The stream is left out: verify_many replays it itself (stream_attempts)."""
    if retries <= 0:
        return json.dumps({})
    policy = {"maxAttempts": min(retries + 1, MAX_ATTEMPTS),
              "initialBackoff": f"{max(backoff, 0.001):.6f}s",
              "maxBackoff": f"{max(backoff, 0.001) * 2 ** retries:.6f}s",
              "backoffMultiplier": 2,
              "retryableStatusCodes": ["UNAVAILABLE"]}
    names = [{"service": SERVICE, "method": m} for m in UNARY_METHODS]
    return json.dumps({"methodConfig": [{"name": names, "retryPolicy": policy}]})


class _Watch:
    """The time a call may take: `timeout` in all (gRPC's deadline, which the watchdog enforces GRACE
    seconds later should gRPC not), and for a stream `idle` seconds between answers."""

    def __init__(self, timeout: float | None, idle: float | None = None):
        self.timeout, self.idle = timeout, idle
        self.start = self.last = time.monotonic()
        self.fired = False

    def remaining(self) -> float | None:
        """gRPC's deadline for the next attempt."""
        return None if self.timeout is None else max(0.0, self.start + self.timeout - time.monotonic())

    def answered(self) -> None:
        self.last = time.monotonic()

    def _ends(self) -> list[tuple[float, float]]:
        ends = [] if self.timeout is None else [(self.start + self.timeout + GRACE, self.timeout)]
        return ends + ([] if self.idle is None else [(self.last + self.idle, self.idle)])

    def left(self) -> float | None:
        """Seconds until the watchdog ends the call (None: never)."""
        ends = self._ends()
        return None if not ends else min(ends)[0] - time.monotonic()

    def error(self) -> VerifyError:
        seconds = min(self._ends())[1]
        return VerifyError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {seconds:g} s", kind="transport")


class _Watchdog(threading.Thread):
    """Cancels a blocking client's call once its _Watch runs out; stop() when the call has ended."""

    def __init__(self, watch: _Watch, call):
        super().__init__(daemon=True, name="gradcheck-call-watchdog")
        self.watch, self.call = watch, call
        self.cond = threading.Condition()
        self.stopped = False
        self.start()

    def run(self) -> None:
        with self.cond:
            while not self.stopped:
                left = self.watch.left()
                if left is not None and left <= 0:
                    self.watch.fired = True
                    break
                self.cond.wait(left)
        if self.watch.fired:
            self.call.cancel()

    def answered(self) -> None:
        with self.cond:
            self.watch.answered()
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()


def _replay(err: grpc.RpcError, answered: bool, attempt: int, attempts: int, watch: _Watch,
            backoff: float) -> float | None:
    """Seconds to wait before replaying a failed stream, or None: only UNAVAILABLE before any answer
    (the same terms as gRPC's policy for the unary methods), and only within the call's time."""
    if answered or err.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 >= attempts:
        return None
    delay = random.uniform(0, backoff * 2 ** attempt)  # gRPC's own jitter: uniform up to the backoff
    left = watch.remaining()
    return delay if left is None or delay < left else None


@contextmanager
def _answers(id: str = ""):
    """A failed call (after gRPC's retries) as VerifyError, for both clients."""
    try:
        yield
    except grpc.RpcError as err:
        raise VerifyError.from_rpc(err, id) from None


class _Core:
    """Everything the two clients share: the channel's arguments (credentials, message limits,
    gRPC's retry policy), the call metadata, building requests and converting answers.
    Client and AsyncClient add only the channel type and how they wait."""

    def __init__(self, target: str, token: str | None = None, tls: bool = False, root_certificates=None,
                 timeout: float | None = 60.0, retries: int = 4, backoff: float = 0.1,
                 max_message_bytes: int = CLIENT_MESSAGE_BYTES):
        self.target = target
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.stream_attempts = min(retries + 1, MAX_ATTEMPTS) if retries > 0 else 1
        if token and token_problem(token):
            raise TokenError(token_problem(token))
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._creds = grpc.ssl_channel_credentials(_read(root_certificates)) if tls or root_certificates else None
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.enable_retries", 1),
                         ("grpc.service_config", service_config(retries, backoff))]
        if target.startswith("dns:"):
            # dns:///gradcheck-headless:50051 resolves to every server pod (a headless Service);
            # round_robin spreads calls over all of them instead of pinning one connection to one pod
            self._options.append(("grpc.lb_policy_name", "round_robin"))

    def _channel(self, channels):
        """A channel from grpc (blocking) or grpc.aio (asyncio), which spell the same factories alike."""
        if self._creds:
            return channels.secure_channel(self.target, self._creds, options=self._options)
        return channels.insecure_channel(self.target, options=self._options)

    def _timeout(self, timeout) -> float | None:
        return self.timeout if timeout is ... else timeout

    def _call_args(self, timeout) -> dict:
        return {"timeout": self._timeout(timeout), "metadata": self._metadata}

    @staticmethod
    def _report(response: service_pb2.VerifyResponse) -> Report:
        """The answer's Report; an `error` outcome (or none) is the server's VerifyError, its message kept,
        never read as an empty report."""
        if response.WhichOneof("outcome") is None:
            raise VerifyError(grpc.StatusCode.UNKNOWN, "the server answered neither a report nor an error",
                              "internal", id=response.id)
        return _stream_outcome(response, raise_errors=True)

    @staticmethod
    def _ops(response: service_pb2.ListOpsResponse) -> list[dict]:
        return [message_to_dict(op) for op in response.ops]


class Client(_Core):
    """Blocking client. `timeout` is the per-call deadline in seconds (None: none)."""

    def __init__(self, target: str, **kwargs):
        super().__init__(target, **kwargs)
        self.channel = self._channel(grpc)
        self.stub = service_pb2_grpc.GradCheckServiceStub(self.channel)

    def _unary(self, method, request, timeout, id: str = ""):
        """One unary call, ended by the watchdog should gRPC not end it at its deadline."""
        watch = _Watch(self._timeout(timeout))
        with _answers(id):
            future = method.future(request, **self._call_args(timeout))
            left = watch.left()
            try:
                return future.result(timeout=None if left is None else max(left, 0.0))
            except grpc.FutureTimeoutError:
                future.cancel()
                raise watch.error() from None
            except KeyboardInterrupt:  # Ctrl-C: the server stops the work too
                future.cancel()
                raise

    def verify(self, graph, *, id: str = "", timeout: float | None = ..., **options) -> Report:
        """Verify one graph (a Graph message, a .json/.pb path, or a JSON dict)."""
        request = make_request(graph, id, **options)
        return self._report(self._unary(self.stub.Verify, request, timeout, id))

    def verify_many(self, graphs, *, timeout: float | None = None, idle_timeout: float | None = None,
                    raise_errors: bool = True, **options):
        """Stream graphs to the server; yield Reports as each finishes (completion order, `report.id`
        tells which). With raise_errors=False a failed item yields its VerifyError instead of raising.
        `timeout` bounds the whole stream, `idle_timeout` the wait for each next answer."""
        requests = _requests(graphs, options)
        watch = _Watch(timeout, idle_timeout)
        for attempt in range(self.stream_attempts):
            answered = False
            call = self.stub.VerifyStream(iter(requests), timeout=watch.remaining(), metadata=self._metadata)
            dog = _Watchdog(watch, call)
            try:
                for item in call:
                    answered = True
                    dog.answered()
                    yield _stream_outcome(item, raise_errors)
                return
            except grpc.RpcError as err:
                if watch.fired:
                    raise watch.error() from None
                delay = _replay(err, answered, attempt, self.stream_attempts, watch, self.backoff)
                if delay is None:
                    raise VerifyError.from_rpc(err) from None
            finally:
                dog.stop()
                call.cancel()  # a no-op once it has ended; frees the server when the caller stops early
            time.sleep(delay)

    def list_ops(self) -> list[dict]:
        return self._ops(self._unary(self.stub.ListOps, service_pb2.ListOpsRequest(), ...))

    def server_info(self) -> dict:
        return message_to_dict(self._unary(self.stub.GetServerInfo, service_pb2.GetServerInfoRequest(), ...))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncClient(_Core):
    """asyncio client (grpc.aio), same methods as Client, awaitable."""

    def __init__(self, target: str, **kwargs):
        super().__init__(target, **kwargs)
        self.channel = self._channel(grpc.aio)
        self.stub = service_pb2_grpc.GradCheckServiceStub(self.channel)

    async def _unary(self, method, request, timeout, id: str = ""):
        watch = _Watch(self._timeout(timeout))
        with _answers(id):
            call = method(request, **self._call_args(timeout))
            left = watch.left()
            try:
                return await asyncio.wait_for(call, None if left is None else max(left, 0.0))
            except asyncio.TimeoutError:
                call.cancel()
                raise watch.error() from None

    async def verify(self, graph, *, id: str = "", timeout: float | None = ..., **options) -> Report:
        request = make_request(graph, id, **options)
        return self._report(await self._unary(self.stub.Verify, request, timeout, id))

    async def verify_many(self, graphs, *, timeout: float | None = None, idle_timeout: float | None = None,
                          raise_errors: bool = True, **options):
        requests = _requests(graphs, options)
        watch = _Watch(timeout, idle_timeout)
        for attempt in range(self.stream_attempts):
            answered = False
            call = self.stub.VerifyStream(iter(requests), timeout=watch.remaining(), metadata=self._metadata)
            try:
                while True:
                    left = watch.left()
                    try:
                        item = await asyncio.wait_for(call.read(), None if left is None else max(left, 0.0))
                    except asyncio.TimeoutError:
                        watch.fired = True
                        raise watch.error() from None
                    if item is grpc.aio.EOF:  # ended OK (read() raises the status of a failed stream)
                        return
                    answered = True
                    watch.answered()
                    yield _stream_outcome(item, raise_errors)
            except grpc.RpcError as err:
                delay = _replay(err, answered, attempt, self.stream_attempts, watch, self.backoff)
                if delay is None:
                    raise VerifyError.from_rpc(err) from None
            finally:
                call.cancel()
            await asyncio.sleep(delay)

    async def list_ops(self) -> list[dict]:
        return self._ops(await self._unary(self.stub.ListOps, service_pb2.ListOpsRequest(), ...))

    async def server_info(self) -> dict:
        return message_to_dict(await self._unary(self.stub.GetServerInfo, service_pb2.GetServerInfoRequest(), ...))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
