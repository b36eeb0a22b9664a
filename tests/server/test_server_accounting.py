"""Issue 21 item 7: a busy server refuses before it reads a request, and every request, whatever
its end (ok, invalid, over a limit, busy, the client's deadline, the client's cancel, a deadline
that passes while the request is still arriving), is logged once and counted once with its true
code. A real one-worker server with no queue on loopback; raw gRPC calls where a client library
would not misbehave as needed."""
from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from gradcheck.v1 import service_pb2
from gradcheck_client import Client, VerifyError
from gradcheck_core.tracer import Tracer
from grpc_helpers import module_server, seed_graph, slow_graph, wait_for

METHOD = "/gradcheck.v1.GradCheckService/Verify"
MAX_BYTES = 2**20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1", "--max-queue", "0",
                             "--max-message-bytes", str(MAX_BYTES), "--max-nodes", "50")


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", 64 * MAX_BYTES)])
    yield ch
    ch.close()


def _codes(server) -> dict:
    return {s.labels["code"]: s.value for s in server.samples("gradcheck_requests_total")
            if s.labels["method"] == "Verify"}


def _verify_lines(server) -> list[dict]:
    return [line for line in server.log_lines() if line.get("msg") == "request" and line.get("method") == "Verify"]


class Ledger:
    """The server's Verify log lines and per-code counters, before and after: what was added."""

    def __init__(self, server):
        self.server = server
        self.lines, self.codes = len(_verify_lines(server)), _codes(server)

    def added(self, expected: int) -> tuple[list[dict], dict]:
        wait_for(lambda: len(_verify_lines(self.server)) >= self.lines + expected, what="the request log lines")
        wait_for(lambda: sum(_codes(self.server).values()) >= sum(self.codes.values()) + expected,
                 what="the request counters")
        lines = _verify_lines(self.server)[self.lines:]
        now = _codes(self.server)
        return lines, {c: now[c] - self.codes.get(c, 0) for c in now if now[c] != self.codes.get(c, 0)}


def _stalled(channel, timeout: float):
    """A Verify call whose request never arrives: headers sent, no message, the request side left
    open (a client-streaming call on the same method: the bytes on the wire are a unary call's
    before its message)."""
    release = threading.Event()

    def nothing():
        release.wait(60)
        return
        yield  # pragma: no cover -- a generator that never yields

    call = channel.stream_unary(METHOD).future(nothing(), timeout=timeout)
    return call, release


def _idle(server):
    wait_for(lambda: server.metric("gradcheck_in_flight") == 0, what="the server to be idle")


def test_busy_is_answered_before_the_request_is_read(server, channel):
    """One worker, no queue, the worker busy: a request bigger than the transport would even accept
    (2x the limit) is refused as busy -- so it was not received, let alone parsed."""
    _idle(server)
    slow = channel.stream_unary(METHOD).future(iter([service_pb2.VerifyRequest(
        graph=slow_graph(), options=service_pb2.VerifyOptions(fd_mode="full")).SerializeToString()]), timeout=60)
    server.wait_in_flight(1)
    ledger = Ledger(server)
    t = Tracer("huge")
    big = service_pb2.VerifyRequest(id="big", graph=t.graph(t.param("x", np.ones(3 * MAX_BYTES // 8)).sum()))
    assert big.ByteSize() > 2 * MAX_BYTES + 2**20  # over the transport's own receive limit
    with Client(server.target, timeout=60, retries=0, max_message_bytes=64 * MAX_BYTES) as c:
        with pytest.raises(VerifyError) as info:
            c.verify(big.graph)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.kind == "busy"
    [line], codes = ledger.added(1)
    assert line["code"] == "RESOURCE_EXHAUSTED" and line["graph"] is None and line["id"] is None  # never parsed
    assert codes == {"RESOURCE_EXHAUSTED": 1}
    slow.cancel()
    _idle(server)


def test_deadline_while_the_request_arrives_is_logged_once_as_deadline(server, channel):
    _idle(server)
    ledger = Ledger(server)
    for _ in range(5):
        call, release = _stalled(channel, timeout=0.5)
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=30)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        release.set()
        _idle(server)
    lines, codes = ledger.added(5)
    assert [line["code"] for line in lines] == ["DEADLINE_EXCEEDED"] * 5
    assert codes == {"DEADLINE_EXCEEDED": 5}


def test_a_cancel_while_the_request_arrives_is_logged_once_as_cancelled(server, channel):
    _idle(server)
    ledger = Ledger(server)
    call, release = _stalled(channel, timeout=60)
    server.wait_in_flight(1)  # admitted, waiting for its request
    call.cancel()
    release.set()
    [line], codes = ledger.added(1)
    assert line["code"] == "CANCELLED" and codes == {"CANCELLED": 1}
    _idle(server)


def test_every_end_is_logged_and_counted_once_with_its_code(server):
    _idle(server)
    ledger = Ledger(server)
    t = Tracer("long")
    x = t.param("x", 1.0)
    for _ in range(51):
        x = x * 1.0
    bad = seed_graph()
    bad.nodes[0].op = "mull"
    with Client(server.target, timeout=60, retries=0) as c:
        assert c.verify(seed_graph(), id="ok").passed
        with pytest.raises(VerifyError) as invalid:
            c.verify(bad, id="invalid")
        with pytest.raises(VerifyError) as limit:
            c.verify(t.graph(x), id="limit")
        with pytest.raises(VerifyError) as deadline:
            c.verify(slow_graph(), id="deadline", fd_mode="full", timeout=0.5)
    assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert limit.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert deadline.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    lines, codes = ledger.added(4)
    assert [(line["id"], line["code"]) for line in lines] == [
        ("ok", "OK"), ("invalid", "INVALID_ARGUMENT"), ("limit", "RESOURCE_EXHAUSTED"),
        ("deadline", "DEADLINE_EXCEEDED")]
    assert codes == {"OK": 1, "INVALID_ARGUMENT": 1, "RESOURCE_EXHAUSTED": 1, "DEADLINE_EXCEEDED": 1}
    _idle(server)
    assert len(_verify_lines(server)) == ledger.lines + 4  # and nothing more arrives later


def test_a_stream_item_refused_as_busy_keeps_its_id(server, channel):
    """Stream items are admitted before they are parsed; a busy answer is still tagged with its id."""
    _idle(server)
    slow = channel.stream_unary(METHOD).future(iter([service_pb2.VerifyRequest(
        graph=slow_graph(), options=service_pb2.VerifyOptions(fd_mode="full")).SerializeToString()]), timeout=60)
    server.wait_in_flight(1)
    with Client(server.target, timeout=60, retries=0) as c:
        [item] = list(c.verify_many({"mine": seed_graph()}, raise_errors=False))
    assert isinstance(item, VerifyError) and item.kind == "busy" and item.id == "mine"
    slow.cancel()
    _idle(server)


def test_a_call_without_a_request_message_is_invalid(server, channel):
    """A client that ends its request side without sending a message (no unary client does) is told
    so -- after the moment a deadline or cancel would have taken to arrive, none did."""
    _idle(server)
    ledger = Ledger(server)
    with pytest.raises(grpc.RpcError) as info:
        channel.stream_unary(METHOD)(iter([]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "request: malformed VerifyRequest: no request message"
    [line], codes = ledger.added(1)
    assert line["code"] == "INVALID_ARGUMENT" and codes == {"INVALID_ARGUMENT": 1}


def _stream_lines(server) -> list[dict]:
    return [line for line in server.log_lines() if line.get("msg") == "request" and line.get("method") == "VerifyStream"]


def test_a_cancelled_stream_logs_each_item_it_read_once(server, channel):
    """One worker: item 'a' runs, 'b' (read ahead, when it has arrived) waits for the worker. The
    stream is cancelled: every item the server read is logged and counted once, CANCELLED."""
    from gradcheck.v1 import service_pb2_grpc

    from gradcheck_core.client import make_request

    _idle(server)
    lines_before = len(_stream_lines(server))
    cancelled_before = server.metric("gradcheck_requests_total", method="VerifyStream", code="CANCELLED")
    stub = service_pb2_grpc.GradCheckServiceStub(channel)
    call = stub.VerifyStream(iter([make_request(slow_graph(), id="a", fd_mode="full"),
                                   make_request(seed_graph(), id="b")]), timeout=60)
    server.wait_in_flight(1)
    call.cancel()
    wait_for(lambda: any(line["id"] == "a" for line in _stream_lines(server)[lines_before:]), what="item a's line")
    _idle(server)
    lines = _stream_lines(server)[lines_before:]
    ids = [line["id"] for line in lines]
    assert "a" in ids and sorted(ids) == sorted(set(ids)) and set(ids) <= {"a", "b"}
    assert all(line["code"] == "CANCELLED" for line in lines)
    counted = server.metric("gradcheck_requests_total", method="VerifyStream", code="CANCELLED") - cancelled_before
    assert counted == len(lines)
