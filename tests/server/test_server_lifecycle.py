"""Every way a call can end early, on a one-worker server: the server keeps serving, the request is
counted with its true code, the worker doing it is replaced, and no process outlives the request.

(A VerifyStream ending while an item was in the pool used to kill the whole server with SIGSEGV:
the request's log line read context.peer() after gRPC had freed the call.)
"""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import numpy as np
import pytest

from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_client import Client
from gradcheck_core.client import make_request
from gradcheck_core.tracer import Tracer
from grpc_helpers import (ROOT, ServerProcess, _env, hard_simplify_graph, module_server, seed_graph, slow_graph,
                          stray_processes, wait_for)

LIMIT_BYTES = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1", "--max-message-bytes", str(LIMIT_BYTES),
                             "--max-request-seconds", "60")


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(server.target)
    yield service_pb2_grpc.GradCheckServiceStub(channel)
    channel.close()


def slow_request(rid: str = "slow") -> service_pb2.VerifyRequest:
    return make_request(slow_graph(), id=rid, fd_mode="full")


def _code_count(server, method: str, code: str) -> float:
    return server.metric("gradcheck_requests_total", method=method, code=code)


def assert_recovered(server, started: float, method: str, code: str, before: float, old_worker: int) -> None:
    """The request is counted with `code`, its worker was replaced, nothing it started survives,
    and the server answers the next request."""
    wait_for(lambda: _code_count(server, method, code) == before + 1, what=f"{method} counted as {code}")
    wait_for(lambda: server.metric("gradcheck_in_flight") == 0, what="in-flight back to 0")
    assert server.proc.poll() is None, "the server died"
    with Client(server.target, timeout=30, retries=0) as c:
        assert c.verify(seed_graph()).passed
    assert old_worker not in server.worker_pids() and len(server.worker_pids()) == 1
    assert stray_processes(started, server.pid) == []


def _begin(server):
    [worker] = server.worker_pids()
    return time.time(), worker


def test_stream_cancelled_by_the_client(server, stub):
    started, worker = _begin(server)
    before = _code_count(server, "VerifyStream", "CANCELLED")
    call = stub.VerifyStream(iter([slow_request()]), timeout=60)
    server.wait_in_flight(1)
    call.cancel()
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    assert_recovered(server, started, "VerifyStream", "CANCELLED", before, worker)


def test_stream_deadline_is_counted_as_deadline_not_cancel(server, stub):
    started, worker = _begin(server)
    before = _code_count(server, "VerifyStream", "DEADLINE_EXCEEDED")
    with pytest.raises(grpc.RpcError) as info:
        list(stub.VerifyStream(iter([slow_request()]), timeout=1.5))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_recovered(server, started, "VerifyStream", "DEADLINE_EXCEEDED", before, worker)


def test_unary_deadline_is_counted_as_deadline(server, stub):
    started, worker = _begin(server)
    before = _code_count(server, "Verify", "DEADLINE_EXCEEDED")
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(slow_request(), timeout=1.5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_recovered(server, started, "Verify", "DEADLINE_EXCEEDED", before, worker)


CLIENT_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import grpc
    from gradcheck.v1 import service_pb2_grpc
    from gradcheck_core.client import make_request
    from grpc_helpers import slow_graph
    stub = service_pb2_grpc.GradCheckServiceStub(grpc.insecure_channel({target!r}))
    for item in stub.VerifyStream(iter([make_request(slow_graph(), id="s", fd_mode="full")]), timeout=120):
        pass
""")


def test_stream_client_process_killed(server):
    started, worker = _begin(server)
    before = _code_count(server, "VerifyStream", "CANCELLED")
    script = CLIENT_SCRIPT.format(tests=str(ROOT / "tests"), target=server.target)
    proc = subprocess.Popen([sys.executable, "-c", script], env=_env())
    try:
        server.wait_in_flight(1)
    finally:
        proc.kill()
        proc.wait(10)
    assert_recovered(server, started, "VerifyStream", "CANCELLED", before, worker)


# The command as a terminal's foreground job starts it: SIGINT raising KeyboardInterrupt. A process inherits an
# ignored SIGINT through exec, and Python then leaves it ignored (as every program does): a suite started as
# `pytest ... &` from a script, whose shell ignores SIGINT in background jobs, would otherwise give the command
# a Ctrl-C it cannot see, and the test would wait out the server's 60 s limit (exit 3).
_AS_A_FOREGROUND_JOB = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "


def _ci_command(server, tmp_path, *extra):
    path = tmp_path / "slow.pb"
    path.write_bytes(slow_graph().SerializeToString())
    return subprocess.Popen([sys.executable, "-c", _AS_A_FOREGROUND_JOB + "import sys; "
                             "from gradcheck_client.cli import main; sys.exit(main())",
                             "verify", str(path), "--server", server.target, "--fd", "full",
                             *extra], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ci_command_timeout_expires(server, tmp_path):
    started, worker = _begin(server)
    before = _code_count(server, "VerifyStream", "DEADLINE_EXCEEDED")
    proc = _ci_command(server, tmp_path, "--timeout", "1.5")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "DEADLINE_EXCEEDED" in out and "Traceback" not in err  # docs/ci.md
    assert_recovered(server, started, "VerifyStream", "DEADLINE_EXCEEDED", before, worker)


def test_ci_command_interrupted_with_ctrl_c(server, tmp_path):
    started, worker = _begin(server)
    before = _code_count(server, "VerifyStream", "CANCELLED")
    running = server.metric("gradcheck_in_flight")
    proc = _ci_command(server, tmp_path)
    server.wait_in_flight(running + 1)  # this command's stream, not one still ending before it
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)  # a hang fails; a machine at load 20 only takes longer
    assert proc.returncode == 130 and "Traceback" not in err
    assert_recovered(server, started, "VerifyStream", "CANCELLED", before, worker)


def _big_request(n: int, rid: str) -> service_pb2.VerifyRequest:
    t = Tracer(f"big_{rid}")
    return make_request(t.graph(t.param("x", np.ones(n)).sum()), id=rid)


def test_oversize_item_after_a_running_one_is_refused_alone(server, stub):
    """Over the server's limit (but within what the transport admits): that item gets a `limit`
    error naming the request; the running item before it completes."""
    medium = make_request(slow_graph(width=24, layers=2), id="first", fd_mode="full")
    big = _big_request(LIMIT_BYTES // 8 + 1000, "second")
    assert LIMIT_BYTES < big.ByteSize() < 2 * LIMIT_BYTES
    items = {r.id: r for r in stub.VerifyStream(iter([medium, big]), timeout=120)}
    assert items["first"].report.verdict == "pass"
    err = items["second"].error
    assert err.kind == "limit" and err.field == "request" and err.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert f"the limit is {LIMIT_BYTES}" in err.message


def test_item_beyond_the_transport_limit_ends_the_stream_not_the_server(server, stub):
    started, worker = _begin(server)
    before = _code_count(server, "VerifyStream", "CANCELLED")
    huge = _big_request(3 * LIMIT_BYTES // 8, "huge")
    call = stub.VerifyStream(iter([slow_request("first"), huge]), timeout=60)
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_recovered(server, started, "VerifyStream", "CANCELLED", before, worker)


def test_cancel_during_the_simplify_check_leaves_no_process(server, stub):
    started, worker = _begin(server)
    before = _code_count(server, "Verify", "CANCELLED")
    future = stub.Verify.future(service_pb2.VerifyRequest(id="expr", graph=hard_simplify_graph()), timeout=60)
    server.wait_in_flight(1)
    time.sleep(0.8)  # past the engine and the oracles: sympy.simplify is running
    future.cancel()
    assert_recovered(server, started, "Verify", "CANCELLED", before, worker)


def test_sigterm_with_a_stream_item_running_past_the_grace(tmp_path):
    server = ServerProcess("--workers", "1", "--grace", "1", log_path=tmp_path / "log")
    started = time.time()
    channel = grpc.insecure_channel(server.target)
    stub = service_pb2_grpc.GradCheckServiceStub(channel)
    box = {}

    def consume():
        try:
            list(stub.VerifyStream(iter([slow_request()]), timeout=60))
        except grpc.RpcError as exc:
            box["code"] = exc.code()

    t = threading.Thread(target=consume)
    t.start()
    try:
        server.wait_in_flight(1)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        t.join(30)
    finally:
        channel.close()
        server.stop()
    assert box["code"] in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    events = [(r["msg"], r.get("code")) for r in server.log_lines()]
    assert events[-3:] == [("shutting down", None), ("request", "CANCELLED"), ("stopped", None)]
    assert stray_processes(started) == []  # workers and forkserver went with the server
