"""A bounded soak (127.0.0.1 only; it stops by itself): 32 concurrent clients mixing good, failing,
invalid, cancelled and deadline-exceeded requests over unary and stream calls.

Asserts: the server never crashes, in-flight returns to 0, every request is counted, no process is
left behind, and the server's memory grows by less than 10% after warm-up."""
from __future__ import annotations

import threading
import time

import grpc
import psutil

from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_core.client import make_request
from grpc_helpers import ServerProcess, seed_graph, slow_graph, stray_processes, wait_for

CLIENTS = 32
ROUNDS = 5  # after one warm-up round
SLOW = make_request(slow_graph(width=48, layers=3), id="slow", fd_mode="full")


def _requests(k: int):
    good = make_request(seed_graph(), id=f"good{k}")
    failing = make_request(seed_graph(), id=f"fail{k}", faults=["z:scale:3"])
    invalid = service_pb2.VerifyRequest(id=f"bad{k}", graph=seed_graph())
    invalid.graph.nodes[0].op = "mull"
    return good, failing, invalid


def _one_client(k: int, stub, errors: list, counts: dict, lock) -> None:
    good, failing, invalid = _requests(k)
    kind = k % 6
    try:
        if kind == 0:
            assert stub.Verify(good, timeout=60).report.verdict == "pass"
        elif kind == 1:
            assert stub.Verify(failing, timeout=60).report.verdict == "fail"
        elif kind == 2:
            try:
                stub.Verify(invalid, timeout=60)
                raise AssertionError("an invalid graph was accepted")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.code()
        elif kind == 3:
            items = list(stub.VerifyStream(iter([good, failing, invalid]), timeout=60))
            kinds = sorted("error" if i.HasField("error") else i.report.verdict for i in items)
            assert kinds == ["error", "fail", "pass"], kinds
        elif kind == 4:  # cancelled mid-way (or while queued)
            call = stub.VerifyStream(iter([good, SLOW]), timeout=60)
            time.sleep(0.2)
            call.cancel()
        else:  # deadline exceeded
            try:
                stub.Verify(SLOW, timeout=0.3)
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # a full queue is a fair answer under load
            errors.append(f"client {k}: {exc.code()} {exc.details()}")
    except Exception as exc:  # noqa: BLE001 - reported by the test thread
        errors.append(f"client {k}: {type(exc).__name__}: {exc}")
    with lock:
        counts[kind] = counts.get(kind, 0) + 1


def _round(target: str) -> tuple[list, dict]:
    channels = [grpc.insecure_channel(target) for _ in range(4)]
    stubs = [service_pb2_grpc.GradCheckServiceStub(c) for c in channels]
    errors, counts, lock = [], {}, threading.Lock()
    threads = [threading.Thread(target=_one_client, args=(k, stubs[k % 4], errors, counts, lock))
               for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c in channels:
        c.close()
    assert not any(t.is_alive() for t in threads), "a client hung"
    return errors, counts


def test_soak(tmp_path):
    server = ServerProcess("--workers", "2", "--max-queue", "64", log_path=tmp_path / "log")
    started = time.time()
    try:
        proc = psutil.Process(server.pid)
        errors, _ = _round(server.target)  # warm-up: imports, caches, first workers replaced
        wait_for(lambda: server.metric("gradcheck_in_flight") == 0, timeout=60, what="warm-up drained")
        rss0 = proc.memory_info().rss
        for _ in range(ROUNDS):
            more, counts = _round(server.target)
            errors += more
            assert server.proc.poll() is None, "the server died"
            assert counts == {k: CLIENTS // 6 + (k < CLIENTS % 6) for k in range(6)}
        wait_for(lambda: server.metric("gradcheck_in_flight") == 0, timeout=60, what="in-flight back to 0")
        rss1 = proc.memory_info().rss
        assert errors == []
        assert server.metric("gradcheck_requests_total", code="INTERNAL") == 0
        assert server.metric("gradcheck_requests_total") >= (ROUNDS + 1) * CLIENTS
        assert server.metric("gradcheck_requests_total", code="CANCELLED") > 0
        assert server.metric("gradcheck_requests_total", code="DEADLINE_EXCEEDED") > 0
        assert rss1 < 1.10 * rss0, (rss0, rss1)
        assert len(server.worker_pids()) == 2
    finally:
        assert server.stop() == 0
    assert stray_processes(started) == []
