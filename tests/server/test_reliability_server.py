"""Nothing a client or a scraper does kills the server (issue 35 item 1), on a real `gradcheck-svc serve`:

- HTTP clients of the metrics port that hang up before reading the answer (two used to kill the server
  with SIGPIPE, silently), never send a request, or scrape at once; the server still answers Verify;
- a worker replaced after the multiprocessing resource tracker died (its probe of the dead tracker's
  pipe was the same SIGPIPE);
- health `Watch` streams on one connection are bounded: past the limit, a stream waits for one to end.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcheck_client import Client
from gradcheck_svc.server.main import MAX_STREAMS_PER_CONNECTION
from grpc_helpers import module_server, seed_graph, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def _verify_still_served(server) -> None:
    assert server.proc.poll() is None, f"the server died (exit status {server.proc.returncode})"
    with Client(server.target, timeout=60, retries=0) as c:
        assert c.verify(seed_graph()).passed
    assert server.proc.poll() is None


def _log_text(server) -> str:
    return Path(server.log_path).read_text()


def _hang_up_early(port: int, reset: bool) -> None:
    """GET /metrics, then close before reading a byte (reset: with an RST, as a killed scraper does)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    if reset:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_scrapers_that_hang_up_do_not_kill_the_server(server):
    port = server.info["metrics_port"]
    for k in range(8):
        _hang_up_early(port, reset=k % 2 == 0)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]  # send nothing
    for s in silent:
        s.close()
    for _ in range(20):  # a loop of scrapes, each a whole, parseable answer
        assert server.metric("gradcheck_workers") == 1
    answers, errors = [], []

    def scrape():
        try:
            for _ in range(5):
                answers.append(server.metric("gradcheck_workers"))
        except Exception as exc:  # noqa: BLE001 -- collected, asserted below
            errors.append(exc)
    threads = [threading.Thread(target=scrape) for _ in range(4)]  # concurrent scrapes, within the bound
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and answers == [1.0] * 20
    _verify_still_served(server)
    assert "Traceback" not in _log_text(server)


def _resource_tracker(server_pid: int) -> int:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (d / "cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if ppid == server_pid and b"resource_tracker" in cmd:
                return int(d.name)
    raise AssertionError("the server has no resource tracker child")


def test_a_worker_is_replaced_after_the_resource_tracker_died(server):
    os.kill(_resource_tracker(server.pid), signal.SIGKILL)
    [worker] = server.worker_pids()
    restarts = server.metric("gradcheck_worker_restarts_total")
    os.kill(worker, signal.SIGKILL)  # an idle worker dies: the pool starts another, which probes the tracker
    wait_for(lambda: server.metric("gradcheck_worker_restarts_total") == restarts + 1, timeout=60,
             what="the worker replaced")
    wait_for(lambda: len(server.worker_pids()) == 1 and worker not in server.worker_pids(), timeout=60,
             what="a new worker")
    _verify_still_served(server)
    # multiprocessing's warning that it relaunched the tracker is a JSON log line like the others
    said = [line for line in _log_text(server).splitlines() if "resource_tracker" in line]
    assert said and all(json.loads(line)["level"] == "warning" for line in said)


def test_watch_streams_on_one_connection_are_bounded(server):
    channel = grpc.insecure_channel(server.target)
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        streams = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=300)
                   for _ in range(MAX_STREAMS_PER_CONNECTION)]
        for s in streams:  # each is open and has had its first answer
            assert next(s).status == health_pb2.HealthCheckResponse.SERVING
        extra = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=300)
        first = []
        reader = threading.Thread(target=lambda: first.append(next(extra).status), daemon=True)
        reader.start()
        reader.join(2)
        assert first == [], "a stream past the per-connection limit was served at once"
        streams[0].cancel()  # one ends: the waiting stream takes its place
        reader.join(120)
        assert first == [health_pb2.HealthCheckResponse.SERVING]
        for s in [*streams[1:], extra]:
            s.cancel()
    finally:
        channel.close()
    _verify_still_served(server)


def test_a_printing_command_ends_quietly_when_its_reader_is_gone():
    """`gradcheck-svc ops | head`: the short-lived printing commands keep SIGPIPE's default (serve ignores it)."""
    import subprocess
    import sys

    from grpc_helpers import ROOT, _env

    proc = subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", "ops", "--long"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(None), cwd=ROOT)
    proc.stdout.close()  # no reader: its first write gets SIGPIPE
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGPIPE and err == b""
