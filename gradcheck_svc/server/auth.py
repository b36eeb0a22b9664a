"""Optional bearer-token authentication (`authorization: Bearer <token>`).

Health checks and reflection stay open: load balancers and grpcurl need them
without a secret. The token is compared in constant time.
"""
from __future__ import annotations

import hmac
import logging

import grpc

log = logging.getLogger("gradcheck.server")

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _deny_like(handler: grpc.RpcMethodHandler, method: str, counter) -> grpc.RpcMethodHandler:
    async def deny(request, context):
        # counted and logged (method and peer, never the token that was sent)
        counter.labels(method=method).inc()
        log.warning("authentication failed", extra={"fields": {"method": method, "peer": context.peer(),
                                                               "code": "UNAUTHENTICATED"}})
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(deny, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str, failures):
        self._expected = f"Bearer {token}".encode()
        self._failures = failures  # a prometheus Counter labelled by method

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        given = next((v for k, v in details.invocation_metadata or () if k == "authorization"), "")
        given = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given, self._expected):
            return handler
        return _deny_like(handler, details.method.rsplit("/", 1)[-1][:64], self._failures)
