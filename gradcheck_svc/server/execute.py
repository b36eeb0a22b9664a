"""One verification, message in, message out: VerifyRequest -> VerifyResponse.

This is what a worker process runs for each request, and what the client's CI
command runs in-process when no server is given. It speaks protobuf messages
but not gRPC. Conversion of the report is one line each way: the proto Report
mirrors Report.to_dict() field for field (same snake_case names), so the
standard JSON mapping converts it.
"""
from __future__ import annotations

import dataclasses

from google.protobuf import json_format

from gradcheck.v1 import service_pb2

from ..engine import parse_fault
from ..errors import LimitError, OptionError
from ..graph import validate
from ..oracles.finite_diff import MODES as FD_MODES
from ..oracles.finite_diff import FDOptions
from ..verify import VerifyOptions, verify
from ..verify.report import Report
from .config import ServerLimits


def options_from_proto(pb: service_pb2.VerifyOptions, limits: ServerLimits) -> VerifyOptions:
    mode = pb.fd_mode or "auto"
    if mode not in FD_MODES:
        raise OptionError(f"unknown fd_mode '{mode}' (expected one of {', '.join(FD_MODES)})",
                          field="options.fd_mode")
    if pb.directions < 0:
        raise OptionError("directions must be positive", field="options.directions")
    if pb.seed < 0:
        raise OptionError(f"seed must be 0 or more, got {pb.seed}", field="options.seed")
    if len(pb.faults) > limits.max_faults:  # before parsing them
        raise LimitError(f"{len(pb.faults)} faults, the limit is {limits.max_faults}", field="options.faults")
    options = VerifyOptions(
        dtype=pb.dtype or None, device=pb.device or "cpu",
        fd=FDOptions(mode=mode, directions=pb.directions or FDOptions.directions, seed=pb.seed),
        faults=tuple(parse_fault(f) for f in pb.faults),
        atol=pb.atol if pb.HasField("atol") else None, rtol=pb.rtol if pb.HasField("rtol") else None)
    # the server's defaults never exceed its limits; what the client asks for is checked
    options.symbolic = dataclasses.replace(
        options.symbolic, max_elements=pb.symbolic_budget or min(options.symbolic.max_elements,
                                                                  limits.max_symbolic_budget),
        max_edges=min(options.symbolic.max_edges, limits.max_symbolic_partials))
    if pb.HasField("symbolic"):
        options.symbolic = dataclasses.replace(options.symbolic, enabled=pb.symbolic)
    if pb.HasField("localize"):
        options.localize = pb.localize
    if pb.checkpoint:
        options.checkpoint = pb.checkpoint
    if pb.integrity:  # checked with the other engine options, in verify.run_engine
        options.integrity = pb.integrity
    if pb.allow_inplace_hazards:
        options.allow_inplace_hazards = True
    check_option_limits(options, limits)
    return options


def check_option_limits(options: VerifyOptions, limits: ServerLimits, flag_names: bool = False) -> None:
    """LimitError for an option over its cap, naming the request field (or, from the CLI, the flag)."""
    checks = (("directions", options.fd.directions if options.fd.mode != "full" else 0, limits.max_directions,
               "--directions", "max_directions"),
              ("symbolic_budget", options.symbolic.max_elements, limits.max_symbolic_budget,
               "--symbolic-max-elements", "max_symbolic_budget"),
              ("symbolic_partials", options.symbolic.max_edges, limits.max_symbolic_partials,
               "--symbolic-max-partials", "max_symbolic_partials"),
              ("faults", len(options.faults), limits.max_faults, "--fault", "max_faults"))
    for name, value, limit, flag, limit_name in checks:
        if value > limit:
            hint = f" (raise it with --{limit_name.replace('_', '-')})" if flag_names else ""
            raise LimitError(f"{value} is over the limit of {limit}{hint}",
                             field=flag if flag_names else f"options.{name}")


def report_to_proto(report: Report) -> service_pb2.Report:
    msg = json_format.ParseDict(report.to_dict(), service_pb2.Report(), ignore_unknown_fields=True)
    msg.text = report.to_text()
    return msg


def verify_request(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None
                   ) -> service_pb2.VerifyResponse:
    """Validate the graph against the limits, verify it, return the tagged report.

    Raises GradcheckError for anything the user can fix."""
    limits = limits or ServerLimits()
    options = options_from_proto(request.options, limits)
    graph = validate(request.graph, limits.graph, allow_nonfinite=request.options.allow_nonfinite)
    report = verify(graph, options)
    return service_pb2.VerifyResponse(id=request.id, report=report_to_proto(report))
