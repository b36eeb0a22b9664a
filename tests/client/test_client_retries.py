"""The clients' retries are gRPC's retry policy: against a real gRPC server on loopback that
answers UNAVAILABLE a set number of times, both clients retry exactly UNAVAILABLE, as often as
asked, and never a stream whose response has begun."""
from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import grpc
import pytest

from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_client import AsyncClient, Client, VerifyError


class Flaky(service_pb2_grpc.GradCheckServiceServicer):
    """Fails the first `failures` calls of each method with `code`, then answers."""

    def __init__(self, failures: int, code=grpc.StatusCode.UNAVAILABLE):
        self.failures, self.code = failures, code
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def _count(self, method: str) -> int:
        with self.lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            return self.calls[method]

    def GetServerInfo(self, request, context):
        if self._count("GetServerInfo") <= self.failures:
            context.abort(self.code, "not yet")
        return service_pb2.ServerInfo(version="flaky")

    def VerifyStream(self, request_iterator, context):
        ids = [r.id for r in request_iterator]
        n = self._count("VerifyStream")
        if n <= self.failures:
            context.abort(self.code, "not yet")
        for i in ids:
            yield service_pb2.VerifyResponse(id=i, error=service_pb2.VerifyError(code=3, kind="invalid",
                                                                                  message=f"attempt {n}"))


class StreamBreaksAfterOneItem(Flaky):
    def VerifyStream(self, request_iterator, context):
        list(request_iterator)
        self._count("VerifyStream")
        yield service_pb2.VerifyResponse(id="0", error=service_pb2.VerifyError(code=3, message="first"))
        context.abort(grpc.StatusCode.UNAVAILABLE, "gone mid-stream")


@pytest.fixture
def serve():
    servers = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_pb2_grpc.add_GradCheckServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None)


def _info_sync(target, **kw):
    with Client(target, timeout=10, backoff=0.01, **kw) as c:
        return c.server_info()


def _info_async(target, **kw):
    async def go():
        async with AsyncClient(target, timeout=10, backoff=0.01, **kw) as c:
            return await c.server_info()
    return asyncio.run(go())


@pytest.mark.parametrize("info", [_info_sync, _info_async], ids=["sync", "async"])
def test_unavailable_is_retried_until_answered(serve, info):
    flaky = Flaky(failures=3)
    assert info(serve(flaky), retries=4)["version"] == "flaky"
    assert flaky.calls["GetServerInfo"] == 4


@pytest.mark.parametrize("info", [_info_sync, _info_async], ids=["sync", "async"])
def test_retries_run_out(serve, info):
    flaky = Flaky(failures=10)
    with pytest.raises(VerifyError) as exc:
        info(serve(flaky), retries=2)
    assert exc.value.code == grpc.StatusCode.UNAVAILABLE and exc.value.message == "not yet"
    assert flaky.calls["GetServerInfo"] == 3


@pytest.mark.parametrize("info", [_info_sync, _info_async], ids=["sync", "async"])
def test_no_retries(serve, info):
    flaky = Flaky(failures=1)
    with pytest.raises(VerifyError):
        info(serve(flaky), retries=0)
    assert flaky.calls["GetServerInfo"] == 1


@pytest.mark.parametrize("info", [_info_sync, _info_async], ids=["sync", "async"])
def test_other_codes_are_answers_not_retried(serve, info):
    flaky = Flaky(failures=1, code=grpc.StatusCode.RESOURCE_EXHAUSTED)
    with pytest.raises(VerifyError) as exc:
        info(serve(flaky), retries=4)
    assert exc.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert flaky.calls["GetServerInfo"] == 1


def _stream_sync(target, graphs):
    with Client(target, timeout=10, backoff=0.01) as c:
        return list(c.verify_many(graphs, raise_errors=False))


def _stream_async(target, graphs):
    async def go():
        async with AsyncClient(target, timeout=10, backoff=0.01) as c:
            return [item async for item in c.verify_many(graphs, raise_errors=False)]
    return asyncio.run(go())


GRAPHS = {"a": {"name": "a"}, "b": {"name": "b"}}


@pytest.mark.parametrize("stream", [_stream_sync, _stream_async], ids=["sync", "async"])
def test_a_stream_refused_before_its_first_answer_is_replayed_whole(serve, stream):
    flaky = Flaky(failures=2)
    items = stream(serve(flaky), GRAPHS)
    assert flaky.calls["VerifyStream"] == 3
    assert sorted((e.id, e.message) for e in items) == [("a", "attempt 3"), ("b", "attempt 3")]


@pytest.mark.parametrize("stream", [_stream_sync, _stream_async], ids=["sync", "async"])
def test_a_stream_that_has_begun_is_not_retried(serve, stream):
    broken = StreamBreaksAfterOneItem(failures=0)
    with pytest.raises(VerifyError) as exc:
        stream(serve(broken), GRAPHS)
    assert exc.value.code == grpc.StatusCode.UNAVAILABLE and exc.value.message == "gone mid-stream"
    assert broken.calls["VerifyStream"] == 1
