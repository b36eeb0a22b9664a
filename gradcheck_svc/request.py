"""The one request pipeline: a graph (or an ONNX model) plus options (plus claimed gradients, which travel
in the graph message: graph.proto's Claims) -> Report.

Every front end reaches `run_request`: the server's worker (server/worker.py), batch and screen
(batch/verifiers.py), a finite-difference shard (`prepare`, then verify/fd_shards.py), check()
(check_call.py, and the client's in-process modes) and both `verify` commands. Whatever arrives is
checked here the same way: the request's size, its options against the limits (the one mapping from
option values to VerifyOptions), the graph validated (an ONNX model imported first), then verified; what
it came to is returned as data (outcome.py), never raised.

It speaks protobuf messages (gradcheck.v1, no gRPC): a request is what a client would send.
"""
from __future__ import annotations

import dataclasses

from gradcheck.v1 import service_pb2
from gradcheck_core.options import BY_NAME, OPTIONS, target_of

from .backend import USER_DEVICES
from .engine import parse_fault
from .errors import LimitError, OptionError
from .graph import validate
from .limits import ServerLimits, check_request_size
from .oracles.fd_modes import FDMode
from .outcome import Internal, OverLimit, Refused, outcome_of
from .verify import VerifyOptions
from .verify.options import check
from .verify.run import verify_checked
from .verify.report import Report

__all__ = ["check_option_limits", "options_from_proto", "prepare", "proto_values", "run_request",
           "verify_options"]


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
    if get("device") not in USER_DEVICES:  # "strict" is a test-only backend, never served
        raise OptionError(f"unknown device '{get('device')}' (expected {' or '.join(USER_DEVICES)})",
                          field=field("device"))
    faults = values.get("faults") or ()
    if len(faults) > limits.max_faults:  # before parsing them
        raise LimitError(f"{len(faults)} faults, the limit is {limits.max_faults}"
                         + (" (raise it with --max-faults)" if hint else ""), field=field("faults"))
    options = VerifyOptions(faults=tuple(parse_fault(f) for f in faults))
    for o in OPTIONS:  # each to the field the table names (target_of): one mapping, no list kept here
        path = target_of(o)
        if o.name == "faults" or path[0] == "validate":  # parsed above; the graph's validation's
            continue
        value = get(o.name)
        if o.name == "symbolic_budget" and o.name not in values:  # the oracle's default, within the limit
            value = min(options.symbolic.max_elements, limits.max_symbolic_budget)
        _set(options, path, value)
    _set(options, ("symbolic", "max_edges"), min(options.symbolic.max_edges, limits.max_symbolic_partials))
    check(options, field)  # the one validation (verify/options.py); nothing below checks them again
    check_option_limits(options, limits, field, hint)
    return options


def _set(options: VerifyOptions, path: tuple, value) -> None:
    """options.a = value, or options.a.b = value (the oracles' options are frozen: replaced)."""
    if len(path) == 1:
        setattr(options, path[0], value)
    else:
        setattr(options, path[0], dataclasses.replace(getattr(options, path[0]), **{path[1]: value}))


def check_option_limits(options: VerifyOptions, limits: ServerLimits, field=lambda name: f"options.{name}",
                        hint: bool = False) -> None:
    """LimitError for an option over its cap, naming the field (or flag) and, from the CLI, the limit's flag.
    (Faults are counted before they are parsed, and the symbolic partials are capped, in verify_options.)"""
    for name, value, limit_name in (("directions", options.fd.count if options.fd.mode != FDMode.FULL else 0,
                                     "max_directions"),
                                    ("symbolic_budget", options.symbolic.max_elements, "max_symbolic_budget")):
        limit = getattr(limits, limit_name)
        if value > limit:
            more = f" (raise it with --{limit_name.replace('_', '-')})" if hint else ""
            raise LimitError(f"{value} is over the limit of {limit}{more}", field=field(name))


def prepare(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None, *,
            options: VerifyOptions | None = None, message=None, hint: bool = False, size_checked: bool = False):
    """(Graph, VerifyOptions) of a request, checked: its size, its options against the limits (unless the
    caller mapped them already, `options`: the CLIs' flags, with budgets no request carries), its graph
    validated -- an ONNX model imported here, as in the worker, unless the caller imported it (`message`:
    the CLI reads external data beside the user's files). `hint`: a limit's error names its flag.
    `size_checked`: the caller measured the request against max_message_bytes already (the server, the
    bytes it received; a batch shard and the CLI, before a model is imported): once per request.

    Raises GradcheckError for anything the user can fix."""
    limits = limits or ServerLimits()
    _one_subject(request)
    if not size_checked:  # the server's own check, for in-process callers
        check_request_size(request.ByteSize(), limits.max_message_bytes, hint=hint)
    if options is None:
        options = options_from_proto(request.options, limits)
    if message is None:
        message = request.graph
        if request.onnx_model:
            from .onnx_import import graph_from_request

            message = graph_from_request(request, limits)
    if request.onnx_model and request.graph.HasField("claimed"):  # the model's claims: by initializer or torch name
        from gradcheck_core.claims import with_claims

        from .onnx_import.claim_names import onto_initializers
        from .onnx_import.importer import unheld_claims

        unheld, unnamed = unheld_claims(request.onnx_model, message, list(request.graph.claimed.gradients))
        message = with_claims(message, onto_initializers(message, request.graph.claimed, unheld, unnamed))
    graph = validate(message, limits.graph, allow_nonfinite=request.options.allow_nonfinite,
                     nonfinite_constants=bool(request.onnx_model))
    return graph, options


def _one_subject(request: service_pb2.VerifyRequest) -> None:
    """OptionError where a part of the request would be ignored: a graph beside an ONNX model (the model is
    verified; only its claims travel in `graph`), or import options for a graph (verified as it is)."""
    graph = request.graph
    if request.onnx_model and (graph.nodes or graph.inputs or graph.output):
        raise OptionError("set either graph or onnx_model, not both (with a model, graph carries only its "
                          "claimed gradients)", field="graph")
    if not request.onnx_model and request.onnx.ListFields():
        raise OptionError("import options apply to onnx_model, and the request has none (a graph is verified "
                          "as it is)", field="onnx")


def run_request(request: service_pb2.VerifyRequest, limits: ServerLimits | None = None, *, on_phase=None,
                symbolic: dict | None = None, options: VerifyOptions | None = None, message=None,
                hint: bool = False, fd_source=None,
                size_checked: bool = False) -> Report | Refused | OverLimit | Internal:
    """The pipeline: `prepare` the request, then verify it; its outcome as data, never raised (outcome.py:
    one table maps it to a gRPC status, an exit code, a batch record status). on_phase(name) is told as
    each phase starts (in-process progress); `symbolic`: SymbolicOptions fields no request carries (the
    in-process budget flags); fd_source: the parameters' finite differences from elsewhere
    (verify/fd_shards.py).

    A MemoryError is OverLimit("memory"): the server's worker answers it RESOURCE_EXHAUSTED (a limit of
    that process), while a batch shard exits 75 so that its Job retries it on a node with more memory."""
    try:
        graph, options = prepare(request, limits, options=options, message=message, hint=hint,
                                 size_checked=size_checked)
        if symbolic:
            options.symbolic = dataclasses.replace(options.symbolic, **symbolic)
        return verify_checked(graph, options, on_phase=on_phase, fd_source=fd_source)
    except Exception as exc:  # KeyboardInterrupt and SystemExit are not outcomes: they go up
        return outcome_of(exc)


def preload(symbolic: bool = True, graphs: int = 2) -> None:
    """Import what a verification would import lazily (SymPy and mpmath: about a second), before a caller
    forks the children that verify `graphs` graphs under a time limit (bounded.py). Each fresh child -- the
    one after a time-out too -- then starts warm: a graph's limit measures its verification, not the
    imports, and no graph's outcome depends on whether the graph before it timed out. Without the symbolic
    oracle nothing is loaded (those imports are what `--symbolic off` saves), nor for one graph: its one
    child imports SymPy itself when the oracle runs (within the graph's limit), and a graph over the
    oracle's budget (chain_256) never pays for it (a third of its command's time)."""
    if symbolic and graphs > 1:
        from .oracles import local_jacobian, symbolic as _symbolic  # noqa: F401
