"""`gradcheck-svc serve`: start the server, run until SIGTERM/SIGINT, drain, exit.

The server runs in an empty private directory of its own (a fresh temporary one), so that no
relative path can reach the operator's files.

Shutdown: health turns NOT_SERVING at once (load balancers stop sending),
new RPCs are refused, in-flight ones get `grace_seconds` to finish, then the
workers are stopped.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import ssl
import tempfile

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..config import ServerConfig
from ..errors import OptionError
from .auth import BearerTokenInterceptor
from .metrics import Metrics, configure_logging
from .pool import WorkerPool
from .servicer import SERVICE, GradCheckServicer

log = logging.getLogger("gradcheck.server")

MAX_STREAMS_PER_CONNECTION = 100


def _read_pem(path, flag: str, marker: str, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OptionError(f"cannot read {path}: {exc.strerror or exc}", field=flag) from None
    if b"-----BEGIN " not in data or marker.encode() not in data:
        raise OptionError(f"{path} is not a PEM {what}", field=flag)
    return data


def _credentials(config: ServerConfig):
    """TLS credentials, each file checked first: gRPC's core only says that listening failed."""
    if config.tls_cert is None:
        return None
    cert = _read_pem(config.tls_cert, "--tls-cert", "CERTIFICATE-----", "certificate")
    key = _read_pem(config.tls_key, "--tls-key", "PRIVATE KEY-----", "private key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc).lower():
            raise OptionError(f"{config.tls_key} is not the key of the certificate in {config.tls_cert}",
                              field="--tls-key") from None
        raise OptionError(f"cannot load {config.tls_cert} with {config.tls_key}: {exc.reason or exc}",
                          field="--tls-cert") from None
    return grpc.ssl_server_credentials([(key, cert)])


def bare_host(host: str) -> str:
    """'[::1]' -> '::1' (the form sockets and the metrics server take)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def grpc_address(host: str, port: int) -> str:
    """host:port as gRPC takes it: IPv6 literals in brackets."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_port_free(host: str, port: int, address: str) -> None:
    """Say "port in use" in one line before gRPC core logs its own multi-line complaint."""
    try:
        infos = socket.getaddrinfo(bare_host(host), port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OptionError(f"cannot resolve host '{host}': {exc.strerror}", field="--host") from None
    if port == 0:
        return
    family, *_, sockaddr = infos[0]
    try:
        socket.create_server(sockaddr[:2], family=family).close()
    except OSError:
        raise OptionError(f"cannot listen on {address} (address in use or not available)", field="--port") from None


def _grpc_server(config: ServerConfig, metrics: Metrics):
    """The gRPC server, its token check and transport limits set, no service added yet."""
    size = config.limits.max_message_bytes
    return grpc.aio.server(
        interceptors=[BearerTokenInterceptor(config.token, metrics.auth_failures)] if config.token else None,
        # the transport admits twice the limit so that the servicer, not the transport, refuses an
        # over-size request: its answer then carries the `limit` kind and names the field
        options=[("grpc.max_receive_message_length", 2 * size + 2**20), ("grpc.max_send_message_length", size),
                 ("grpc.so_reuseport", 0),  # a port in use is an error, not a silently shared port
                 # streams open at once on one connection (HTTP/2 SETTINGS): a client's further calls wait
                 # for one to end, so that unauthenticated health Watch streams cannot pile up without bound
                 ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION)])


def _bind(server, config: ServerConfig) -> tuple[int, object]:
    """Bind the service's port (and check the metrics port is free): (the bound port, the TLS
    credentials or None); an OptionError naming --port if it cannot listen."""
    address = grpc_address(config.host, config.port)
    creds = _credentials(config)
    _check_port_free(config.host, config.port, address)
    if config.metrics_port:
        _check_port_free(config.host, config.metrics_port, grpc_address(config.host, config.metrics_port))
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OptionError(f"cannot listen on {address} (address in use or not available)", field="--port")
    return port, creds


async def _shut_down(config: ServerConfig, server, health_servicer, servicer, pool, httpd) -> None:
    """Drain within the grace period, let cancelled calls log their lines, then stop the workers and
    the metrics endpoint; "stopped" is the last line."""
    log.info("shutting down", extra={"fields": {"in_flight": pool.pending, "grace_s": config.grace_seconds}})
    await health_servicer.enter_graceful_shutdown()
    await server.stop(config.grace_seconds)
    # calls cancelled at the end of the grace log their line as they unwind: let them, so that
    # "stopped" is the last line and every request is accounted for
    for _ in range(200):
        if servicer.active == 0:
            break
        await asyncio.sleep(0.01)
    await pool.close()
    if httpd:
        httpd.shutdown()
    log.info("stopped", extra={"fields": {}})


async def serve(config: ServerConfig, *, install_signals: bool = True) -> None:
    metrics = Metrics()
    pool = WorkerPool(config.workers, config.limits.max_queue, config.limits,
                      on_restart=metrics.worker_restarts.inc)
    server = _grpc_server(config, metrics)
    servicer = GradCheckServicer(config, pool, metrics)
    server.add_generic_rpc_handlers((servicer.handlers(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    port, creds = _bind(server, config)
    await pool.start()
    httpd = metrics.serve_http(bare_host(config.host), config.metrics_port) if config.metrics_port is not None \
        else None
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
        await _shut_down(config, server, health_servicer, servicer, pool, httpd)


def run(config: ServerConfig) -> int:
    configure_logging()
    # no request names a file (onnx_import/tensors.py refuses them); should anything still open a
    # relative path, it finds an empty directory of the server's own, never the operator's
    config = dataclasses.replace(config, tls_cert=config.tls_cert and config.tls_cert.resolve(),
                                 tls_key=config.tls_key and config.tls_key.resolve())
    home = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="gradcheck-serve-") as empty:  # mode 0700
        os.chdir(empty)
        try:
            asyncio.run(serve(config))
        finally:
            os.chdir(home if os.path.isdir(home) else "/")
    return 0
