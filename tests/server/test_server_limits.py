"""Limits, queueing, deadlines, cancellation and dying workers, on a one-worker server with small limits."""
from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from gradcheck_client import Client, VerifyError
from gradcheck_core.tracer import Tracer
from grpc_helpers import module_server, seed_graph, slow_graph, wait_for

# long enough that a loaded machine cannot free the worker mid-test by timeout; the server's time limit itself
# (DEADLINE_EXCEEDED, kind "timeout", the limit named, the worker free after it) is tested on a server whose
# limit is 2 s: test_limits_parity.py's max_request_seconds case
TIME_LIMIT = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1", "--max-queue", "0", "--max-nodes", "20",
                             "--max-elements", "200000", "--max-message-mb", "4", "--max-symbolic-budget", "10",
                             "--max-request-seconds", str(TIME_LIMIT))


@pytest.fixture(scope="module")
def client(server):
    with Client(server.target, timeout=60, retries=0) as c:
        yield c


def _in_background(fn):
    box = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as exc:  # handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_too_many_nodes(client):
    t = Tracer("long")
    x = t.param("x", 1.0)
    for _ in range(21):
        x = x * 1.0
    with pytest.raises(VerifyError) as info:
        client.verify(t.graph(x))
    err = info.value
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.kind == "limit" and err.invalid_input
    assert err.message == "nodes: graph has 21 nodes, the limit is 20"


def test_too_many_elements(client):
    t = Tracer("big")
    loss = t.param("x", np.ones(250_000)).sum()
    with pytest.raises(VerifyError) as info:
        client.verify(t.graph(loss))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.kind == "limit"
    # the amount the graph needs beside the limit (the node that took it over is named)
    assert info.value.message == "node 'sum_1': graph holds 250001 elements (inputs and node outputs), the limit is 200000"


def test_message_too_large(client):
    t = Tracer("huge")
    loss = t.param("x", np.ones(600_000)).sum()  # ~4.8 MB of doubles, over the 4 MB limit
    with pytest.raises(VerifyError) as info:
        client.verify(t.graph(loss))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_symbolic_budget_over_the_servers_cap(client):
    with pytest.raises(VerifyError) as info:
        client.verify(seed_graph(), symbolic_budget=11)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.field == "options.symbolic_budget"


def test_deadline_mid_verification_frees_the_worker(server, client):
    restarts = server.metric("gradcheck_worker_restarts_total")
    [old] = server.worker_pids()
    with pytest.raises(VerifyError) as info:
        client.verify(slow_graph(), fd_mode="full", timeout=0.5)
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # the one worker was busy with a ~20 s job: it is served now only because the work was stopped
    assert client.verify(seed_graph(), timeout=15).passed
    assert server.metric("gradcheck_worker_restarts_total") == restarts + 1
    assert old not in server.worker_pids()


def test_queue_full_is_refused_at_once_and_cancel_frees_the_worker(server, client):
    channel = grpc.insecure_channel(server.target)
    from gradcheck.v1 import service_pb2, service_pb2_grpc

    stub = service_pb2_grpc.GradCheckServiceStub(channel)
    slow = stub.Verify.future(service_pb2.VerifyRequest(
        graph=slow_graph(), options=service_pb2.VerifyOptions(fd_mode="full")), timeout=60)
    server.wait_in_flight(1)
    with pytest.raises(VerifyError) as info:
        client.verify(seed_graph())
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.kind == "busy"
    assert not info.value.invalid_input
    slow.cancel()  # the cancel reaches the server on its own time: the place is free once it has
    wait_for(lambda: server.metric("gradcheck_in_flight") == 0, what="the cancelled call to free its place")
    assert client.verify(seed_graph(), timeout=15).passed
    channel.close()


def test_killed_worker_fails_its_request_and_the_server_keeps_serving(server, client):
    import os
    import signal

    t, box = _in_background(lambda: client.verify(slow_graph(), fd_mode="full"))
    server.wait_in_flight(1)
    [pid] = server.worker_pids()
    os.kill(pid, signal.SIGKILL)
    t.join(30)
    err = box.get("error")
    assert isinstance(err, VerifyError), box
    assert err.code == grpc.StatusCode.INTERNAL and err.kind == "worker_died"
    assert "killed by SIGKILL" in err.message and "Traceback" not in err.message
    assert client.verify(seed_graph(), timeout=15).passed
    assert pid not in server.worker_pids()


def test_a_long_stream_gets_backpressure_not_refusals(client):
    """Six graphs on one stream to a server with one worker and no queue: all are verified."""
    reports = list(client.verify_many([seed_graph()] * 6))
    assert sorted(r.id for r in reports) == [str(i) for i in range(6)]
    assert all(r.passed for r in reports)
