"""`gradcheck-svc serve`: start the server, run until SIGTERM/SIGINT, drain, exit.

Shutdown: health turns NOT_SERVING at once (load balancers stop sending),
new RPCs are refused, in-flight ones get `grace_seconds` to finish, then the
workers are stopped.
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..errors import OptionError
from .auth import BearerTokenInterceptor
from .config import ServerConfig
from .metrics import Metrics, configure_logging
from .pool import WorkerPool
from .servicer import SERVICE, GradCheckServicer

log = logging.getLogger("gradcheck.server")


def _credentials(config: ServerConfig):
    if config.tls_cert is None:
        return None
    return grpc.ssl_server_credentials([(config.tls_key.read_bytes(), config.tls_cert.read_bytes())])


def _check_port_free(host: str, port: int, address: str) -> None:
    """Say "port in use" in one line before gRPC core logs its own multi-line complaint."""
    if port == 0:
        return
    try:
        socket.create_server((host, port)).close()
    except OSError:
        raise OptionError(f"cannot listen on {address} (address in use or not available)", field="--port") from None


async def serve(config: ServerConfig, *, install_signals: bool = True) -> None:
    metrics = Metrics()
    pool = WorkerPool(config.workers, config.limits.max_queue, config.limits)
    size = config.limits.max_message_bytes
    server = grpc.aio.server(
        interceptors=[BearerTokenInterceptor(config.token)] if config.token else None,
        options=[("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size),
                 ("grpc.so_reuseport", 0)])  # a port in use is an error, not a silently shared port
    servicer = GradCheckServicer(config, pool, metrics)
    server.add_generic_rpc_handlers((servicer.handlers(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    address = f"{config.host}:{config.port}"
    _check_port_free(config.host, config.port, address)
    creds = _credentials(config)
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OptionError(f"cannot listen on {address} (address in use or not available)", field="--port")
    await pool.start()
    httpd = metrics.serve_http(config.host, config.metrics_port) if config.metrics_port is not None else None
    await server.start()
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    stop = asyncio.Event()
    if install_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    # one machine-readable line on stdout: scripts and tests read the bound ports from it
    print(json.dumps({"event": "listening", "host": config.host, "port": port, "tls": creds is not None,
                      "auth": config.token is not None, "workers": config.workers,
                      "metrics_port": httpd.server_address[1] if httpd else None,
                      "worker_pids": pool.pids}), flush=True)
    log.info("serving", extra={"fields": {"port": port, "workers": config.workers}})
    try:
        await stop.wait()
    finally:
        log.info("shutting down", extra={"fields": {"in_flight": pool.pending, "grace_s": config.grace_seconds}})
        await health_servicer.enter_graceful_shutdown()
        await server.stop(config.grace_seconds)
        await pool.close()
        if httpd:
            httpd.shutdown()
        log.info("stopped", extra={"fields": {}})


def run(config: ServerConfig) -> int:
    configure_logging()
    asyncio.run(serve(config))
    return 0
