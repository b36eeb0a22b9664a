"""The options table (gradcheck_core/options.py) is the one definition of every verification option:
the proto, both commands' parsers, the client's keywords, the server's defaults and the docs agree with it."""
from __future__ import annotations

import re

import pytest

from gradcheck.v1 import service_pb2
from gradcheck_core.client import OPTION_FIELDS
from gradcheck_core.options import OPTIONS
from grpc_helpers import ROOT


def test_every_proto_field_is_one_option():
    assert [f.name for f in service_pb2.VerifyOptions.DESCRIPTOR.fields] == [o.name for o in OPTIONS]
    assert set(OPTION_FIELDS) == {o.name for o in OPTIONS}  # the client's verify() keywords


def _verify_parser(module):
    parser = module.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["verify"]


@pytest.mark.parametrize("module", ["gradcheck_svc.cli", "gradcheck_client.cli"])
def test_both_commands_take_every_option_by_the_same_flags(module):
    import importlib

    verify = _verify_parser(importlib.import_module(module))
    by_flag = {flag: a for a in verify._actions for flag in a.option_strings}
    for o in OPTIONS:
        for flag in (*o.flags, *((o.negation,) if o.negation else ())):
            assert flag in by_flag and by_flag[flag].dest == o.name, (module, flag)


@pytest.mark.parametrize("module", ["gradcheck_svc.cli", "gradcheck_client.cli"])
def test_unset_flags_leave_the_option_unset(module):
    import importlib

    from gradcheck_core.options import values_from_args

    args = importlib.import_module(module).build_parser().parse_args(["verify", "g.json"])
    assert values_from_args(args) == {}
    args = importlib.import_module(module).build_parser().parse_args(
        ["verify", "g.json", "--fd", "full", "--symbolic-max-elements", "7", "--no-localize", "--fault", "z:nan",
         "--allow-nonfinite", "--symbolic", "off"])
    assert values_from_args(args) == {"fd_mode": "full", "symbolic_budget": 7, "localize": False,
                                      "faults": ["z:nan"], "allow_nonfinite": True, "symbolic": False}


def test_the_servers_defaults_are_the_tables():
    from gradcheck_svc.limits import ServerLimits
    from gradcheck_svc.request import options_from_proto

    v = options_from_proto(service_pb2.VerifyOptions(), ServerLimits())
    effective = {"fd_mode": v.fd.mode, "fd_method": v.fd.method, "device": v.device, "directions": v.fd.directions, "seed": v.fd.seed,
                 "symbolic_budget": v.symbolic.max_elements, "localize": v.localize, "checkpoint": v.checkpoint,
                 "integrity": v.integrity, "allow_inplace_hazards": v.allow_inplace_hazards,
                 "symbolic": v.symbolic.enabled, "dtype": v.dtype, "atol": v.atol, "rtol": v.rtol,
                 "faults": list(v.faults) or None, "allow_nonfinite": False,
                 "memory_timeline": v.memory_timeline, "memory_profile": v.memory_profile, "optimizer": v.optimizer,
                 "optimizer_dtype": v.optimizer_dtype}
    assert effective == {o.name: o.default for o in OPTIONS}


def test_the_readme_option_table_names_every_flag():
    table = ROOT.joinpath("README.md").read_text().split("`gradcheck-svc verify` options", 1)[1].split("\n\n")[1]
    flags = set(re.findall(r"`(--[a-z-]+)", table))
    assert {o.cli_flag for o in OPTIONS} <= flags, {o.cli_flag for o in OPTIONS} - flags


@pytest.mark.parametrize("command", ["batch", "screen"])
def test_batch_commands_take_the_same_option_flags(command):
    from gradcheck_svc import cli

    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices[command]
    by_flag = {flag: a for a in sub._actions for flag in a.option_strings}
    for o in OPTIONS:
        for flag in o.flags:
            assert flag in by_flag and by_flag[flag].dest == o.name, (command, flag)


# Flags only one `verify` command has, and why (README "Two front ends" says the same):
ONLY_IN_THE_CI_COMMAND = {
    # where to send the graphs: `gradcheck-svc verify` always verifies in its own process
    "--server", "--token-file", "--tls", "--ca-file", "--timeout",
}


# and only gradcheck-svc verify: one graph's finite differences split over the processes of a Job
# (verify/fd_shards.py) -- the CI command's verification may run in a server, which has no shards
ONLY_IN_THE_SERVICE_COMMAND = {"--fd-shard-count", "--fd-shard-index", "--fd-out", "--fd-from"}


def _flags(module) -> set:
    import importlib

    return {flag for a in _verify_parser(importlib.import_module(module))._actions for flag in a.option_strings}


def test_both_verify_commands_take_the_same_flags_but_the_listed_ones():
    svc, ci = _flags("gradcheck_svc.cli"), _flags("gradcheck_client.cli")
    assert svc - ci == ONLY_IN_THE_SERVICE_COMMAND, "only gradcheck-svc verify has these"
    assert ci - svc == ONLY_IN_THE_CI_COMMAND
    # the outputs, budgets and limits the README promises in both
    assert {"--format", "--json", "--html", "--junit", "--summary-md", "--memory-plot", "--symbolic-timeout",
            "--symbolic-max-partials", "--simplify-timeout", "--max-nodes", "--max-elements"} <= svc & ci


@pytest.mark.parametrize("module", ["gradcheck_svc.cli", "gradcheck_client.cli"])
def test_both_verify_commands_take_several_paths(module):
    import importlib

    args = importlib.import_module(module).build_parser().parse_args(["verify", "a.json", "b.pb", "dir/"])
    assert args.paths == ["a.json", "b.pb", "dir/"] and args.format == "text"


def test_the_in_process_budgets_defaults_are_the_oracles():
    from gradcheck_core.options import IN_PROCESS_OPTIONS

    from gradcheck_svc.in_process import symbolic_budgets
    from gradcheck_svc.oracles.symbolic import SymbolicOptions

    defaults = symbolic_budgets({o.name: o.default for o in IN_PROCESS_OPTIONS})
    assert defaults == {k: getattr(SymbolicOptions(), k) for k in defaults}


def test_every_option_names_the_field_it_sets():
    """One name per concept: an option's row names the verifier's field it sets (target), and
    request.verify_options sets exactly that field from it (no second mapping kept by hand)."""
    import dataclasses
    import inspect

    from gradcheck_core.options import IN_PROCESS_OPTIONS, OPTIONS, target_of

    from gradcheck_svc.graph.validate import validate
    from gradcheck_svc.limits import ServerLimits
    from gradcheck_svc.request import verify_options
    from gradcheck_svc.verify import VerifyOptions

    for o in (*OPTIONS, *IN_PROCESS_OPTIONS):
        path = target_of(o)
        if path[0] == "validate":
            assert path[1] in inspect.signature(validate).parameters, o.name
            continue
        obj = VerifyOptions()
        for part in path:
            assert part in {f.name for f in dataclasses.fields(obj)}, (o.name, path)
            obj = getattr(obj, part)
    # a value set through the table lands in the named field
    options = verify_options({"symbolic_budget": 123, "fd_mode": "full", "seed": 7, "symbolic": False},
                             ServerLimits())
    assert (options.symbolic.max_elements, options.fd.mode, options.fd.seed, options.symbolic.enabled) == \
        (123, "full", 7, False)


def test_fd_method_reaches_the_finite_differences_and_an_unknown_one_is_refused_by_name():
    from gradcheck_svc.errors import OptionError
    from gradcheck_svc.limits import ServerLimits
    from gradcheck_svc.request import options_from_proto, verify_options

    assert verify_options({"fd_method": "central"}, ServerLimits()).fd.method == "central"
    assert options_from_proto(service_pb2.VerifyOptions(fd_method="central"), ServerLimits()).fd.method == "central"
    with pytest.raises(OptionError) as exc:
        options_from_proto(service_pb2.VerifyOptions(fd_method="complex-step"), ServerLimits())
    assert exc.value.field == "options.fd_method" and "complex-step" in str(exc.value)


def test_an_integer_flag_is_bounded_by_its_proto_field(capsys):
    """Every integer option's wire_bits is its proto field's width, and a value beyond it is the flag's usage
    error (exit 2) -- it was the message's ValueError inside the run: an internal error, exit 3."""
    from gradcheck_core.onnx_options import ONNX_FLAGS
    from gradcheck_svc.cli import build_parser

    for message, rows in ((service_pb2.VerifyOptions, OPTIONS), (service_pb2.OnnxImport, ONNX_FLAGS)):
        for o in rows:
            f = message.DESCRIPTOR.fields_by_name[o.name]
            if f.type in (f.TYPE_INT32, f.TYPE_INT64):
                assert o.wire_bits == (32 if f.type == f.TYPE_INT32 else 64), o.name
    parser = build_parser()
    for flag, value in (("--directions", 2**31), ("--seed", 2**63), ("--input-seed", -(2**63) - 1)):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["verify", "g.json", flag, str(value)])
        assert exc.value.code == 2 and f"argument {flag}: {value} is out of range" in capsys.readouterr().err
    assert parser.parse_args(["verify", "g.json", "--seed", str(2**63 - 1)]).seed == 2**63 - 1
