"""Clients that end (issue 21 item 3): whatever the server does -- killed mid-request, stopped
(SIGSTOP), a listening socket that never speaks HTTP/2, nobody listening -- every client call ends
within its timeout (plus the client's GRACE) and the CI command exits 3, saying once which address
it tried and how to set another. Real servers on loopback; the margins are generous (a loaded
machine), the point is that nothing waits for ever or for the old multiple of the timeout."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest

import forked_cli
from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_client import AsyncClient, Client, VerifyError, save_graph
from gradcheck_core.client import SERVICE, UNARY_METHODS, service_config
from grpc_helpers import ROOT, ServerProcess, _env, descendants, seed_graph, slow_graph

MARGIN = 15  # seconds past the timeout a run may take on a loaded machine (the old hang was minutes)
CODE = "import sys; from gradcheck_client.cli import main; sys.exit(main(sys.argv[1:]))"


def _ci(graph, target, timeout, **env):
    return subprocess.Popen([sys.executable, "-c", CODE, "verify", str(graph), "--server", target, "--fd", "full",
                             "--timeout", str(timeout)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(env), cwd=ROOT)


def _finish(proc, limit):
    """(exit code, stdout, stderr, seconds since `proc` started): fails if it runs past `limit`."""
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the CI command was still running {limit} s after it started") from None
    return proc.returncode, out, err


def _assert_said_once(err: str, target: str, from_env: bool = False):
    lines = [line for line in err.splitlines() if line.startswith("gradcheck: error:")]
    assert len(lines) == 1, err
    assert target in lines[0] and "--server" in lines[0] and "GRADCHECK_SERVER" in lines[0]
    assert ("from $GRADCHECK_SERVER" in lines[0]) == from_env
    assert "Traceback" not in err


@pytest.fixture
def slow_pb(tmp_path):
    path = tmp_path / "slow.pb"
    save_graph(slow_graph(), path)  # tens of seconds of full finite differences
    return path


@pytest.fixture
def server(tmp_path):
    s = ServerProcess("--workers", "1", log_path=tmp_path / "server.log")
    yield s
    for pid in (s.pid, *descendants(s.pid)):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    s.stop(timeout=30)


def test_server_killed_mid_request(server, slow_pb):
    timeout = 30
    proc = _ci(slow_pb, server.target, timeout)
    server.wait_in_flight(1)
    for pid in (server.pid, *descendants(server.pid)):  # the whole tree, as an OOM kill or a node loss would
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    code, out, err = _finish(proc, timeout + MARGIN)
    assert code == 3, (out, err)
    # a dead server is seen at once (connection reset, then refused), not at the deadline
    assert time.monotonic() - killed < timeout
    _assert_said_once(err, server.target)
    assert out.count("not verified: no answer from the server") == 1


def test_server_stopped_mid_request(server, slow_pb):
    timeout = 5
    proc = _ci(slow_pb, server.target, timeout)
    server.wait_in_flight(1)
    os.kill(server.pid, signal.SIGSTOP)  # hung: the connection stays open, nothing answers
    stopped = time.monotonic()
    code, out, err = _finish(proc, timeout + MARGIN + 30)
    assert code == 3, (out, err)
    assert time.monotonic() - stopped < timeout + MARGIN
    _assert_said_once(err, server.target)
    assert "DEADLINE_EXCEEDED" in out


class SilentListener:
    """A TCP port that accepts connections and never says a word (no HTTP/2 settings, no answer);
    `first_accept` is when the first connection came (time.monotonic())."""

    def __init__(self):
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.srv.settimeout(0.1)
        self.target = f"127.0.0.1:{self.srv.getsockname()[1]}"
        self.held, self.first_accept = [], None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                self.held.append(self.srv.accept()[0])
            except OSError:
                continue
            self.first_accept = self.first_accept or time.monotonic()

    def close(self):
        self.stop.set()
        self.thread.join()
        for c in self.held:
            c.close()
        self.srv.close()


@pytest.fixture
def silent():
    s = SilentListener()
    yield s
    s.close()


@pytest.fixture
def silent_listener(silent):
    return silent.target


def test_listener_that_never_speaks_http2(silent, tmp_path):
    timeout, n = 3, 5
    graphs = [tmp_path / f"g{i}.json" for i in range(n)]
    for g in graphs:
        save_graph(seed_graph(), g)
    # five graphs: the run ends once no answer has come for --timeout, not after 5 x --timeout
    proc = subprocess.Popen([sys.executable, "-c", CODE, "verify", *map(str, graphs), "--timeout", str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env({"GRADCHECK_SERVER": silent.target}), cwd=ROOT)
    code, out, err = _finish(proc, n * timeout + MARGIN)
    assert code == 3, (out, err)
    assert silent.first_accept is not None
    assert time.monotonic() - silent.first_accept < timeout + 8 < n * timeout
    _assert_said_once(err, silent.target, from_env=True)
    assert out.count("not verified: no answer from the server") == n


def test_nobody_listening_is_said_once_with_the_address(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{s.getsockname()[1]}"
    graphs = [tmp_path / f"g{i}.json" for i in range(3)]
    for g in graphs:
        save_graph(seed_graph(), g)
    proc = subprocess.Popen([sys.executable, "-c", CODE, "verify", *map(str, graphs), "--server", target,
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            cwd=ROOT)
    code, out, err = _finish(proc, 60)
    assert code == 3
    _assert_said_once(err, target)
    assert "Connection refused" in err
    assert [d["status"] for d in json.loads(out)] == ["error"] * 3


# --- the library clients, every method, against a silent listener -------------------------------


# the silent listener never answers, so any timeout is certainly reached: a short one proves the same
SILENT_TIMEOUT = 0.5


def _calls(client):
    return {"verify": lambda: client.verify(seed_graph()),
            "verify_many": lambda: list(client.verify_many([seed_graph()] * 2, timeout=SILENT_TIMEOUT)),
            "server_info": client.server_info}


@pytest.mark.parametrize("method", ["verify", "verify_many", "server_info"])
def test_sync_client_calls_end_at_their_timeout(silent_listener, method):
    with Client(silent_listener, timeout=SILENT_TIMEOUT) as c:
        start = time.monotonic()
        with pytest.raises(VerifyError) as info:
            _calls(c)[method]()
    assert time.monotonic() - start < SILENT_TIMEOUT + MARGIN
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and info.value.kind == "transport"


@pytest.mark.parametrize("method", ["verify", "verify_many", "server_info"])
def test_async_client_calls_end_at_their_timeout(silent_listener, method):
    async def go():
        async with AsyncClient(silent_listener, timeout=SILENT_TIMEOUT) as c:
            if method == "verify_many":
                return [r async for r in c.verify_many([seed_graph()] * 2, timeout=SILENT_TIMEOUT)]
            return await getattr(c, method)(*([seed_graph()] if method == "verify" else []))

    start = time.monotonic()
    with pytest.raises(VerifyError) as info:
        asyncio.run(go())
    assert time.monotonic() - start < SILENT_TIMEOUT + MARGIN
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and info.value.kind == "transport"


class AnswersOnceThenHangs(service_pb2_grpc.GradCheckServiceServicer):
    def __init__(self):
        self.release = threading.Event()

    def VerifyStream(self, request_iterator, context):
        ids = [r.id for r in request_iterator]
        yield service_pb2.VerifyResponse(id=ids[0], error=service_pb2.VerifyError(code=3, message="first"))
        self.release.wait(60)  # the second answer never comes (until the test ends)


@pytest.fixture
def hangs_after_one():
    servicer = AnswersOnceThenHangs()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GradCheckServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    servicer.release.set()
    server.stop(None)


def test_idle_timeout_ends_a_stream_that_stops_answering(hangs_after_one):
    got = []
    with Client(hangs_after_one, timeout=60) as c:
        start = time.monotonic()
        with pytest.raises(VerifyError) as info:
            for item in c.verify_many({"a": seed_graph(), "b": seed_graph()}, timeout=60, idle_timeout=2,
                                      raise_errors=False):
                got.append(item.id)
    assert got == ["a"]  # the answer that came is kept; the stream is not replayed once answered
    assert time.monotonic() - start < 2 + MARGIN
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and info.value.message == "no answer within 2 s"


def test_async_idle_timeout_ends_a_stream_that_stops_answering(hangs_after_one):
    got = []

    async def go():
        async with AsyncClient(hangs_after_one, timeout=60) as c:
            async for item in c.verify_many({"a": seed_graph(), "b": seed_graph()}, timeout=60, idle_timeout=2,
                                            raise_errors=False):
                got.append(item.id)

    with pytest.raises(VerifyError) as info:
        asyncio.run(go())
    assert got == ["a"]
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and info.value.kind == "transport"


def test_grpc_retry_policy_names_only_the_unary_methods():
    config = json.loads(service_config(4, 0.1))
    [method_config] = config["methodConfig"]
    names = {n["method"] for n in method_config["name"]}
    assert names == set(UNARY_METHODS) == {"Verify", "ListOps", "GetServerInfo"}
    assert all(n["service"] == SERVICE for n in method_config["name"])


def test_in_process_run_ends_at_its_timeout(tmp_path):
    """Without a server the CI command holds each graph to --timeout too, with the outcome a server's
    deadline has (exit 3); the graphs after it are still verified. The one limit must let the seed graph
    (symbolic check included: ~0.3 s in a loaded warm fork) finish on a loaded machine and stop the slow one
    on a fast machine: 5 s against minutes of full finite differences at width 128 (~4x width 96's tens of
    seconds). No server, no gRPC: the command runs in a fork of this process (tests/forked_cli.py), its own
    `main(argv)` with its pipes and exit status, without a second of interpreter start-up."""
    slow_pb = tmp_path / "slow.pb"
    save_graph(slow_graph(width=128), slow_pb)
    seed = tmp_path / "seed.json"
    save_graph(seed_graph(), seed)
    timeout = 5
    start = time.monotonic()
    proc = forked_cli.Forked("gradcheck_client.cli", ["verify", slow_pb, seed, "--fd", "full", "--timeout", timeout,
                                                      "--json"], env=_env(), cwd=ROOT)
    limit = 2 * timeout + MARGIN + 30  # the seed graph's symbolic check included
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:  # (killed by communicate)
        raise AssertionError(f"the CI command was still running {limit} s after it started") from None
    assert proc.returncode == 3, err
    slow, ok = json.loads(out)
    assert slow["status"] == "error" and ok["status"] == "pass"
    assert slow["error"] == ("DEADLINE_EXCEEDED: verification exceeded the per-request limit of 5 s "
                             "(raise it with --timeout)")
    assert time.monotonic() - start < limit
