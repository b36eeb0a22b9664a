"""SIGTERM with a request in flight: health turns NOT_SERVING, the request completes, the server exits 0."""
from __future__ import annotations

import signal
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcheck_client import Client
from grpc_helpers import ServerProcess, slow_graph


def test_sigterm_drains_in_flight_requests(tmp_path):
    server = ServerProcess("--workers", "1", "--grace", "60", log_path=tmp_path / "log")
    try:
        box = {}

        def run():
            with Client(server.target, timeout=60) as c:
                # ~2.5 s of CPU (full finite differences) on this machine, against the few
                # milliseconds from "in flight" to the SIGTERM; a loaded machine slows both alike
                box["report"] = c.verify(slow_graph(width=40), fd_mode="full")

        worker = threading.Thread(target=run)
        worker.start()
        server.wait_in_flight(1)

        channel = grpc.insecure_channel(server.target)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        server.proc.send_signal(signal.SIGTERM)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()  # a watcher is an in-flight RPC too; let the drain finish without it
        channel.close()

        worker.join(60)
        assert box["report"].passed, "the in-flight request must complete normally"
        assert server.proc.wait(60) == 0
        events = [r["msg"] for r in server.log_lines()]
        assert events[-3:] == ["shutting down", "request", "stopped"]  # the request finished during the drain
        assert server.log_lines()[-3]["in_flight"] == 1 and server.log_lines()[-2]["code"] == "OK"
    finally:
        server.stop()
