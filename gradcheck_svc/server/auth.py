"""Optional bearer-token authentication (`authorization: Bearer <token>`).

Health checks and reflection stay open: load balancers and grpcurl need them
without a secret. The token is compared in constant time.
"""
from __future__ import annotations

import hmac

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _deny_like(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def deny(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(deny, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        given = next((v for k, v in details.invocation_metadata or () if k == "authorization"), "")
        given = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given, self._expected):
            return handler
        return _deny_like(handler)
