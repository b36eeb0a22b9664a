"""One verification, message in, message out: VerifyRequest -> VerifyResponse.

This is what a worker process runs for each request, and what the client's CI
command runs in-process when no server is given. It speaks protobuf messages
but not gRPC. Conversion of the report is one line each way: the proto Report
mirrors Report.to_dict() field for field (same snake_case names), so the
standard JSON mapping converts it.
"""
from __future__ import annotations

import dataclasses

from google.protobuf.descriptor import FieldDescriptor

from gradcheck.v1 import service_pb2
from gradcheck_client.options import BY_NAME, OPTIONS

from ..backend import USER_DEVICES
from ..engine import parse_fault
from ..errors import LimitError, OptionError
from ..graph import validate
from ..limits import check_request_size
from ..oracles.finite_diff import MODES as FD_MODES
from ..oracles.finite_diff import FDOptions
from ..oracles.symbolic import SymbolicOptions
from ..verify import VerifyOptions, verify
from ..verify.report import Report
from .config import ServerLimits


def proto_values(pb: service_pb2.VerifyOptions) -> dict:
    """The options a request sets, by name (proto3: a zero or empty field is unset, except the
    fields with presence, which are set when present)."""
    out = {}
    for o in OPTIONS:
        value = getattr(pb, o.name)
        has_presence = pb.DESCRIPTOR.fields_by_name[o.name].has_presence and not o.repeated
        if (pb.HasField(o.name) if has_presence else bool(value)):
            out[o.name] = list(value) if o.repeated else value
    return out


def options_from_proto(pb: service_pb2.VerifyOptions, limits: ServerLimits) -> VerifyOptions:
    return verify_options(proto_values(pb), limits)


def verify_options(values: dict, limits: ServerLimits, field=lambda name: f"options.{name}",
                   hint: bool = False) -> VerifyOptions:
    """The one mapping from option values (by OPTIONS name; unset ones absent) to VerifyOptions, for
    the server (`field` names options.X) and the CLI (`field` names the flag, `hint` says which
    --max-... flag raises a limit). Unset options take the defaults in OPTIONS, within the limits."""
    get = lambda name: values.get(name, BY_NAME[name].default)  # noqa: E731
    mode = get("fd_mode")
    if mode not in FD_MODES:
        raise OptionError(f"unknown fd_mode '{mode}' (expected one of {', '.join(FD_MODES)})",
                          field=field("fd_mode"))
    if get("device") not in USER_DEVICES:  # "strict" is a test-only backend, never served
        raise OptionError(f"unknown device '{get('device')}' (expected {' or '.join(USER_DEVICES)})",
                          field=field("device"))
    if get("directions") < 0:
        raise OptionError("directions must be positive", field=field("directions"))
    if get("seed") < 0:
        raise OptionError(f"seed must be 0 or more, got {get('seed')}", field=field("seed"))
    faults = values.get("faults") or ()
    if len(faults) > limits.max_faults:  # before parsing them
        raise LimitError(f"{len(faults)} faults, the limit is {limits.max_faults}"
                         + (" (raise it with --max-faults)" if hint else ""), field=field("faults"))
    symbolic = SymbolicOptions()
    symbolic = dataclasses.replace(
        symbolic, enabled=get("symbolic"),
        max_elements=values.get("symbolic_budget", min(symbolic.max_elements, limits.max_symbolic_budget)),
        max_edges=min(symbolic.max_edges, limits.max_symbolic_partials))
    options = VerifyOptions(
        dtype=get("dtype"), device=get("device"),
        fd=FDOptions(mode=mode, directions=get("directions"), seed=get("seed")),
        faults=tuple(parse_fault(f) for f in faults), atol=get("atol"), rtol=get("rtol"), symbolic=symbolic,
        localize=get("localize"), checkpoint=get("checkpoint"),
        integrity=get("integrity"),  # checked with the other engine options, in verify.run_engine
        allow_inplace_hazards=get("allow_inplace_hazards"), memory_timeline=get("memory_timeline"),
        optimizer=get("optimizer"), optimizer_dtype=get("optimizer_dtype"))
    check_option_limits(options, limits, field, hint)
    return options


def check_option_limits(options: VerifyOptions, limits: ServerLimits, field=lambda name: f"options.{name}",
                        hint: bool = False) -> None:
    """LimitError for an option over its cap, naming the field (or flag) and, from the CLI, the limit's flag.
    (Faults are counted before they are parsed, and the symbolic partials are capped, in verify_options.)"""
    for name, value, limit_name in (("directions", options.fd.directions if options.fd.mode != "full" else 0,
                                     "max_directions"),
                                    ("symbolic_budget", options.symbolic.max_elements, "max_symbolic_budget")):
        limit = getattr(limits, limit_name)
        if value > limit:
            more = f" (raise it with --{limit_name.replace('_', '-')})" if hint else ""
            raise LimitError(f"{value} is over the limit of {limit}{more}", field=field(name))


def report_to_proto(report: Report) -> service_pb2.Report:
    """The JSON report's values, field by field into the proto Report: one builder, so every
    JSON key reaches the proto under its name (tests/test_server.py checks it), without
    json_format.ParseDict, whose generic JSON-mapping parser cost more than verifying a small
    graph."""
    msg = service_pb2.Report()
    _fill(msg, report.to_dict())
    msg.text = report.to_text()
    return msg


_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}  # jsonnum's spellings
_MESSAGE, _FLOATS = FieldDescriptor.TYPE_MESSAGE, (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def _scalar(field, v):
    if field.type in _FLOATS:
        return _SPECIAL[v] if isinstance(v, str) else v
    return v


def _fill(msg, d: dict) -> None:
    """Set msg's fields from a dict shaped as the protobuf JSON mapping of msg (field names as
    keys; None: unset; keys without a field: ignored, as ParseDict(ignore_unknown_fields))."""
    fields = msg.DESCRIPTOR.fields_by_name
    for key, v in d.items():
        field = fields.get(key)
        if field is None or v is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target, value_field = getattr(msg, key), field.message_type.fields_by_name["value"]
            for k, item in v.items():
                if value_field.type == _MESSAGE:
                    _fill(target[k], item)
                else:
                    target[k] = _scalar(value_field, item)
        elif field.is_repeated:
            target = getattr(msg, key)
            if field.type == _MESSAGE:
                for item in v:
                    _fill(target.add(), item)
            else:
                target.extend([_scalar(field, item) for item in v])
        elif field.type == _MESSAGE and field.message_type.full_name == "google.protobuf.Struct":
            getattr(msg, key).update(v)
        elif field.type == _MESSAGE:
            _fill(getattr(msg, key), v)
        else:
            setattr(msg, key, _scalar(field, v))


def verify_report(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None,
                  on_phase=None, symbolic: dict | None = None) -> Report:
    """Validate the request's graph (or import its ONNX model) against the limits and verify it.
    on_phase(name) is told as each phase of the verification starts (in-process progress).

    `symbolic`: SymbolicOptions fields no request carries (the in-process CI command's budget flags).

    Raises GradcheckError for anything the user can fix."""
    limits = limits or ServerLimits()
    check_request_size(request.ByteSize(), limits.max_message_bytes)  # the server's own check, for in-process callers
    options = options_from_proto(request.options, limits)
    if symbolic:
        options.symbolic = dataclasses.replace(options.symbolic, **symbolic)
    message = request.graph
    if request.onnx_model:  # an ONNX model: imported here, in the worker, like any other decoding
        from ..onnx_import import graph_from_request

        message = graph_from_request(request, limits)
    graph = validate(message, limits.graph, allow_nonfinite=request.options.allow_nonfinite)
    # a MemoryError goes up as it is: the server's worker answers it RESOURCE_EXHAUSTED (a limit of that
    # process), while a batch shard exits 75 so that its Job retries it on a node with more memory
    return verify(graph, options, on_phase=on_phase)


def verify_request(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None,
                   on_phase=None, symbolic: dict | None = None) -> service_pb2.VerifyResponse:
    """verify_report, tagged with the request's id, as the response message."""
    return service_pb2.VerifyResponse(id=request.id, report=report_to_proto(
        verify_report(request, limits, on_phase, symbolic)))
