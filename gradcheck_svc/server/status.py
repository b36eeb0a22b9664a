"""The one place that maps errors to gRPC status codes.

GraphError, OptionError (and any other user error) -> INVALID_ARGUMENT with a
google.rpc.BadRequest field violation naming the node or field; LimitError, a
MemoryError and a full queue -> RESOURCE_EXHAUSTED; BackendUnavailable -> FAILED_PRECONDITION;
the server's per-request time limit -> DEADLINE_EXCEEDED; a worker process
that died, and anything unexpected -> INTERNAL, with no traceback.

Every failure also carries trailing metadata `gradcheck-error-kind` (invalid,
limit, busy, unavailable, timeout, worker_died, internal) and, when known,
`gradcheck-error-field`, so a client without googleapis protos can tell a bad
graph from a busy server and name the node.
"""
from __future__ import annotations

import asyncio
from urllib.parse import quote
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gradcheck.v1 import service_pb2

from ..errors import GradcheckError
from ..limits import over_time_message
from ..outcome import OverLimit, grpc_status, outcome_of
from .pool import PoolBusy, WorkerDied

KIND_KEY = "gradcheck-error-kind"
FIELD_KEY = "gradcheck-error-field"


@dataclass(frozen=True)
class Failure:
    code: grpc.StatusCode
    kind: str
    message: str
    field: str | None = None  # the node or field at fault (BadRequest violation)

    def rich_status(self) -> grpc.Status:
        """A grpc.Status carrying a google.rpc.Status (with BadRequest details when a field is known)."""
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        if self.field is not None:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=self.field, description=self.message)]))
            status.details.append(detail)
        grpc_status = rpc_status.to_status(status)
        # metadata values must be printable ASCII: the field (a node name) is percent-encoded
        extra = ((KIND_KEY, self.kind),) + (((FIELD_KEY, quote(self.field, safe=" '")),) if self.field else ())
        return grpc_status._replace(trailing_metadata=(*grpc_status.trailing_metadata, *extra))

    def stream_error(self) -> service_pb2.VerifyError:
        return service_pb2.VerifyError(code=self.code.value[0], message=self.message, field=self.field or "",
                                       kind=self.kind)


def failure_for(exc: BaseException, time_limit: float | None = None) -> Failure:
    if isinstance(exc, (GradcheckError, MemoryError)):  # a verification's outcome: the table's gRPC column
        return outcome_failure(outcome_of(exc))
    if isinstance(exc, PoolBusy):
        return Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", str(exc))
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "timeout", over_time_message(time_limit))
    if isinstance(exc, WorkerDied):
        return Failure(grpc.StatusCode.INTERNAL, "worker_died", str(exc))
    return Failure(grpc.StatusCode.INTERNAL, "internal", "internal error (details are in the server log)")


def outcome_failure(outcome) -> Failure:
    """A Refused or OverLimit outcome (outcome.py) as its status: code and kind by outcome.CHANNELS."""
    code, kind = grpc_status(outcome)
    if isinstance(outcome, OverLimit) and outcome.which == "memory":  # a limit of the memory there is, not a fault
        return Failure(grpc.StatusCode[code], kind, "the request needs more memory than the server has", "request")
    field = None if isinstance(outcome, OverLimit) and outcome.which == "time" else outcome.field
    return Failure(grpc.StatusCode[code], kind, outcome.message, field)
