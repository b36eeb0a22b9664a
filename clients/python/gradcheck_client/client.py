"""Client and AsyncClient for GradCheckService.

    from gradcheck_client import Client
    with Client("localhost:50051") as c:
        c.verify("model.json", fd_mode="full").raise_for_mismatch()

Retries: only UNAVAILABLE (server not up yet, connection reset) is retried,
with exponential backoff; everything else is an answer and is raised at once
as VerifyError. A gradient mismatch is not an error: it is a Report.
"""
from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from urllib.parse import unquote

import grpc

from gradcheck.v1 import service_pb2, service_pb2_grpc

from .graphio import to_graph
from .onnx_options import OnnxModel
from .report import Report, message_to_dict

KIND_KEY, FIELD_KEY = "gradcheck-error-kind", "gradcheck-error-field"  # the server's error trailers
OPTION_FIELDS = tuple(f.name for f in service_pb2.VerifyOptions.DESCRIPTOR.fields)
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


def make_request(graph, id: str = "", **options) -> service_pb2.VerifyRequest:
    unknown = sorted(set(options) - set(OPTION_FIELDS))
    if unknown:
        raise TypeError(f"unknown verify option(s) {unknown}; expected some of {list(OPTION_FIELDS)}")
    opts = {k: v for k, v in options.items() if v is not None}
    if "faults" in opts:
        opts["faults"] = list(opts["faults"])
    if isinstance(graph, OnnxModel):  # the server imports it
        return service_pb2.VerifyRequest(id=id, onnx_model=graph.data, onnx=graph.options,
                                         options=service_pb2.VerifyOptions(**opts))
    return service_pb2.VerifyRequest(id=id, graph=to_graph(graph), options=service_pb2.VerifyOptions(**opts))


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


class _Base:
    def __init__(self, target: str, token: str | None = None, tls: bool = False, root_certificates=None,
                 timeout: float | None = 60.0, retries: int = 4, backoff: float = 0.1,
                 max_message_bytes: int = 16 * 2**20):
        self.target = target
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._creds = grpc.ssl_channel_credentials(_read(root_certificates)) if tls or root_certificates else None
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes)]

    def _delay(self, attempt: int) -> float:
        return self.backoff * 2**attempt * (0.5 + random.random() / 2)  # jitter spreads reconnect storms

    def _give_up(self, err: grpc.RpcError, attempt: int, started: bool = False) -> bool:
        """Only a server that is not reachable yet is retried, and never a stream that already began."""
        return started or err.code() != grpc.StatusCode.UNAVAILABLE or attempt == self.retries


def _stream_outcome(item, raise_errors: bool):
    """One VerifyStream item: its Report, or its VerifyError (raised when raise_errors)."""
    if item.WhichOneof("outcome") == "report":
        return Report.from_proto(item.report, id=item.id)
    err = VerifyError.from_stream_item(item)
    if raise_errors:
        raise err
    return err


class Client(_Base):
    """Blocking client. `timeout` is the per-call deadline in seconds (None: none)."""

    def __init__(self, target: str, **kwargs):
        super().__init__(target, **kwargs)
        make = grpc.secure_channel if self._creds else grpc.insecure_channel
        args = (self._creds,) if self._creds else ()
        self.channel = make(target, *args, options=self._options)
        self.stub = service_pb2_grpc.GradCheckServiceStub(self.channel)

    def _call(self, method, request, timeout, id=""):
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as err:
                if self._give_up(err, attempt):
                    raise VerifyError.from_rpc(err, id) from None
                time.sleep(self._delay(attempt))

    def verify(self, graph, *, id: str = "", timeout: float | None = ..., **options) -> Report:
        """Verify one graph (a Graph message, a .json/.pb path, or a JSON dict)."""
        request = make_request(graph, id, **options)
        response = self._call(self.stub.Verify, request, self.timeout if timeout is ... else timeout, id)
        return Report.from_proto(response.report, id=response.id)

    def verify_many(self, graphs, *, timeout: float | None = None, raise_errors: bool = True, **options):
        """Stream graphs to the server; yield Reports as each finishes (completion order, `report.id`
        tells which). With raise_errors=False a failed item yields its VerifyError instead of raising."""
        requests = _requests(graphs, options)
        for attempt in range(self.retries + 1):
            started = False
            try:
                for item in self.stub.VerifyStream(iter(requests), timeout=timeout, metadata=self._metadata):
                    started = True
                    yield _stream_outcome(item, raise_errors)
                return
            except grpc.RpcError as err:
                if self._give_up(err, attempt, started):
                    raise VerifyError.from_rpc(err) from None
                time.sleep(self._delay(attempt))

    def list_ops(self) -> list[dict]:
        resp = self._call(self.stub.ListOps, service_pb2.ListOpsRequest(), self.timeout)
        return [message_to_dict(op) for op in resp.ops]

    def server_info(self) -> dict:
        return message_to_dict(self._call(self.stub.GetServerInfo, service_pb2.GetServerInfoRequest(), self.timeout))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncClient(_Base):
    """asyncio client (grpc.aio), same methods as Client, awaitable."""

    def __init__(self, target: str, **kwargs):
        super().__init__(target, **kwargs)
        make = grpc.aio.secure_channel if self._creds else grpc.aio.insecure_channel
        args = (self._creds,) if self._creds else ()
        self.channel = make(target, *args, options=self._options)
        self.stub = service_pb2_grpc.GradCheckServiceStub(self.channel)

    async def _call(self, method, request, timeout, id=""):
        for attempt in range(self.retries + 1):
            try:
                return await method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as err:
                if self._give_up(err, attempt):
                    raise VerifyError.from_rpc(err, id) from None
                await asyncio.sleep(self._delay(attempt))

    async def verify(self, graph, *, id: str = "", timeout: float | None = ..., **options) -> Report:
        request = make_request(graph, id, **options)
        response = await self._call(self.stub.Verify, request, self.timeout if timeout is ... else timeout, id)
        return Report.from_proto(response.report, id=response.id)

    async def verify_many(self, graphs, *, timeout: float | None = None, raise_errors: bool = True, **options):
        requests = _requests(graphs, options)
        for attempt in range(self.retries + 1):
            started = False
            try:
                async for item in self.stub.VerifyStream(iter(requests), timeout=timeout, metadata=self._metadata):
                    started = True
                    yield _stream_outcome(item, raise_errors)
                return
            except grpc.RpcError as err:
                if self._give_up(err, attempt, started):
                    raise VerifyError.from_rpc(err) from None
                await asyncio.sleep(self._delay(attempt))

    async def list_ops(self) -> list[dict]:
        resp = await self._call(self.stub.ListOps, service_pb2.ListOpsRequest(), self.timeout)
        return [message_to_dict(op) for op in resp.ops]

    async def server_info(self) -> dict:
        return message_to_dict(await self._call(self.stub.GetServerInfo, service_pb2.GetServerInfoRequest(),
                                                self.timeout))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
