"""Client and AsyncClient for GradCheckService.

    from gradcheck_client import Client
    with Client("localhost:50051") as c:
        c.verify("model.json", fd_mode="full").raise_for_mismatch()

Retries are gRPC's own (a retryPolicy in the channel's service config):
only UNAVAILABLE (server not up yet, connection reset) is retried, with
exponential backoff, never once a response has begun; everything else is an
answer and is raised at once as VerifyError. A gradient mismatch is not an
error: it is a Report. `timeout` bounds a call with all its attempts.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

import grpc

from gradcheck.v1 import service_pb2, service_pb2_grpc

from .graphio import to_graph
from .onnx_options import OnnxModel
from .report import Report, message_to_dict

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GradCheckService"].full_name  # gradcheck.v1.GradCheckService
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


def _stream_outcome(item, raise_errors: bool):
    """One VerifyStream item: its Report, or its VerifyError (raised when raise_errors)."""
    if item.WhichOneof("outcome") == "report":
        return Report.from_proto(item.report, id=item.id)
    err = VerifyError.from_stream_item(item)
    if raise_errors:
        raise err
    return err


MAX_ATTEMPTS = 5  # gRPC caps a retry policy's maxAttempts at 5


def service_config(retries: int, backoff: float) -> str:
    """gRPC's own retry policy for every method of the service: only UNAVAILABLE (server not up
    yet, connection reset, draining) is retried, with exponential backoff and gRPC's jitter;
    everything else is an answer. gRPC never retries a call once the server's response has
    begun (a stream that already yielded a report), and replays a stream's requests itself."""
    if retries <= 0:
        return json.dumps({})
    policy = {"maxAttempts": min(retries + 1, MAX_ATTEMPTS),
              "initialBackoff": f"{max(backoff, 0.001):.6f}s",
              "maxBackoff": f"{max(backoff, 0.001) * 2 ** retries:.6f}s",
              "backoffMultiplier": 2,
              "retryableStatusCodes": ["UNAVAILABLE"]}
    return json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": policy}]})


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
                 max_message_bytes: int = 16 * 2**20):
        self.target = target
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
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

    def _call_args(self, timeout) -> dict:
        return {"timeout": self.timeout if timeout is ... else timeout, "metadata": self._metadata}

    @staticmethod
    def _report(response: service_pb2.VerifyResponse) -> Report:
        return Report.from_proto(response.report, id=response.id)

    @staticmethod
    def _ops(response: service_pb2.ListOpsResponse) -> list[dict]:
        return [message_to_dict(op) for op in response.ops]


class Client(_Core):
    """Blocking client. `timeout` is the per-call deadline in seconds (None: none)."""

    def __init__(self, target: str, **kwargs):
        super().__init__(target, **kwargs)
        self.channel = self._channel(grpc)
        self.stub = service_pb2_grpc.GradCheckServiceStub(self.channel)

    def verify(self, graph, *, id: str = "", timeout: float | None = ..., **options) -> Report:
        """Verify one graph (a Graph message, a .json/.pb path, or a JSON dict)."""
        request = make_request(graph, id, **options)
        with _answers(id):
            return self._report(self.stub.Verify(request, **self._call_args(timeout)))

    def verify_many(self, graphs, *, timeout: float | None = None, raise_errors: bool = True, **options):
        """Stream graphs to the server; yield Reports as each finishes (completion order, `report.id`
        tells which). With raise_errors=False a failed item yields its VerifyError instead of raising."""
        requests = _requests(graphs, options)
        with _answers():
            for item in self.stub.VerifyStream(iter(requests), **self._call_args(timeout)):
                yield _stream_outcome(item, raise_errors)

    def list_ops(self) -> list[dict]:
        with _answers():
            return self._ops(self.stub.ListOps(service_pb2.ListOpsRequest(), **self._call_args(...)))

    def server_info(self) -> dict:
        with _answers():
            return message_to_dict(self.stub.GetServerInfo(service_pb2.GetServerInfoRequest(),
                                                           **self._call_args(...)))

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

    async def verify(self, graph, *, id: str = "", timeout: float | None = ..., **options) -> Report:
        request = make_request(graph, id, **options)
        with _answers(id):
            return self._report(await self.stub.Verify(request, **self._call_args(timeout)))

    async def verify_many(self, graphs, *, timeout: float | None = None, raise_errors: bool = True, **options):
        requests = _requests(graphs, options)
        with _answers():
            async for item in self.stub.VerifyStream(iter(requests), **self._call_args(timeout)):
                yield _stream_outcome(item, raise_errors)

    async def list_ops(self) -> list[dict]:
        with _answers():
            return self._ops(await self.stub.ListOps(service_pb2.ListOpsRequest(), **self._call_args(...)))

    async def server_info(self) -> dict:
        with _answers():
            return message_to_dict(await self.stub.GetServerInfo(service_pb2.GetServerInfoRequest(),
                                                                 **self._call_args(...)))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
