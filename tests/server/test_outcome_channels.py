"""Outcomes as data (gradcheck_svc/outcome.py): request.run_request returns what a request came to, and one
table (outcome.CHANNELS) maps it to each channel's answer. One test per channel: the same request, given to
every front end of that channel, gets the answer the table gives for the outcome run_request returns here in
process -- the exit code of both verify commands, the gRPC status of Verify and VerifyStream, the record
status of a batch verified in process and through a server. The requests: a passing graph, the same graph
with a planted fault (a wrong gradient), an unknown op (invalid input) and an option over its limit."""
from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from gradcheck_core.graphio import load_graph
from gradcheck_core.request_message import make_request
from gradcheck_svc.outcome import CHANNELS, Internal, OverLimit, Refused, batch_status, exit_code, grpc_status, \
    outcome_of, report_of, row
from gradcheck_svc.request import run_request
import forked_cli
from grpc_helpers import _env, module_server

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "graphs" / "seed.json"

# case -> (the graph's change, the options by name, the row run_request's outcome must be in)
CASES = {
    "passed": (None, {}, "passed"),
    "failed": (None, {"faults": ["a:scale:2"]}, "failed"),
    "invalid": ("nosuchop", {}, "invalid"),
    "limit": (None, {"directions": 5000}, "limit"),  # over max_directions (4096), on every front end
}


def _graph(tmp_path: Path, case: str) -> Path:
    op, _, _ = CASES[case]
    data = json.loads(SEED.read_text())
    if op is not None:
        data["nodes"][1]["op"] = op
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(data))
    return path


def _outcome(tmp_path: Path, case: str):
    """run_request's outcome here, in process: what every front end must answer the same way."""
    _, options, wanted = CASES[case]
    outcome = run_request(make_request(str(_graph(tmp_path, case)), "", **options))
    assert row(outcome) == wanted, (case, outcome)
    return outcome


def test_outcome_of_classifies_each_error_once():
    from gradcheck_svc.errors import BackendUnavailable, GraphError, LimitError, TimeLimitError

    assert row(outcome_of(GraphError("bad", node="n"))) == "invalid"
    assert outcome_of(GraphError("bad", node="n")).field == "node 'n'"
    assert row(outcome_of(BackendUnavailable("no GPU", field="device"))) == "unavailable"
    assert outcome_of(LimitError("over", field="x", limit="max_elements")).which == "max_elements"
    assert row(outcome_of(TimeLimitError("slow"))) == "time"
    assert row(outcome_of(MemoryError())) == "memory"
    internal = outcome_of(ZeroDivisionError("x"))
    assert isinstance(internal, Internal) and internal.type_name == "ZeroDivisionError"
    with pytest.raises(ZeroDivisionError):  # report_of raises the very error again
        report_of(internal)
    assert set(CHANNELS) == {"passed", "failed", "invalid", "unavailable", "limit", "memory", "time", "internal"}


def test_run_request_returns_the_outcome_instead_of_raising(tmp_path):
    invalid = _outcome(tmp_path, "invalid")
    assert isinstance(invalid, Refused) and "nosuchop" in invalid.message
    limit = _outcome(tmp_path, "limit")
    assert isinstance(limit, OverLimit) and limit.field == "options.directions" and "4096" in limit.message


def test_a_request_part_that_would_be_ignored_is_refused():
    """A graph beside an ONNX model, or import options for a graph: refused naming the field (the server
    verified one and silently dropped the other), before any model is parsed."""
    from gradcheck.v1 import service_pb2

    graph = make_request(SEED).graph
    for request, field in ((service_pb2.VerifyRequest(graph=graph, onnx_model=b"model"), "graph"),
                           (service_pb2.VerifyRequest(graph=graph, onnx=service_pb2.OnnxImport(params="all")), "onnx")):
        outcome = run_request(request)
        assert isinstance(outcome, Refused) and outcome.field == field, outcome
    empty = service_pb2.VerifyRequest(graph=graph, onnx=service_pb2.OnnxImport(),  # set, but nothing in it
                                      options=service_pb2.VerifyOptions(symbolic=False))
    assert row(run_request(empty)) == "passed"


@pytest.mark.parametrize("case", sorted(CASES))
def test_exit_codes_from_both_verify_commands(tmp_path, case):
    outcome = _outcome(tmp_path, case)
    _, options, _ = CASES[case]
    flags = [*(f"--fault={f}" for f in options.get("faults", ())),
             *([f"--directions={options['directions']}"] if "directions" in options else [])]
    env = _env()
    env.pop("GRADCHECK_SERVER", None)  # the CI command in process
    for module, command in (("gradcheck_svc.cli", "gradcheck-svc"), ("gradcheck_client.cli", "gradcheck")):
        # forked from this process (tests/forked_cli.py): the command's exit status, without a fresh interpreter
        run = forked_cli.run(module, "verify", _graph(tmp_path, case), *flags, env=env, cwd=ROOT, timeout=600)
        assert run.returncode == exit_code(outcome, command), (module, run.stdout[-1000:], run.stderr[-1000:])
    assert exit_code(outcome) == {"passed": 0, "failed": 1, "invalid": 2, "limit": 2}[case]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_shell_answers_each_outcome_as_run_request_does(tmp_path, case):
    """The one shell every in-process front end runs through (gradcheck_svc/shell.py): run_bounded (both verify
    commands and a batch shard, in a child under the time limit) returns the outcome of run_request's row;
    in_process (gradcheck_client.check, gradcheck_svc.check, the torch front end) returns the report with its
    verdict, or raises the outcome's own error, which outcome_of puts in the same row -- so each channel's
    table (exit code, gRPC status, record status) reads the same row from every front end."""
    from gradcheck_svc.shell import in_process, run_bounded, verify_request

    outcome = _outcome(tmp_path, case)
    _, options, _ = CASES[case]
    path = str(_graph(tmp_path, case))
    bounded = run_bounded(300.0, "timeout", verify_request, make_request(path, "", **options))
    assert row(bounded) == row(outcome), (case, bounded)
    assert type(bounded) is type(outcome)
    if isinstance(outcome, (Refused, OverLimit)):
        assert bounded.message == outcome.message and bounded.field == outcome.field
    try:
        answer = in_process(load_graph(path), options)
    except Exception as exc:  # noqa: BLE001 -- the outcome's own error, classified as the table reads it
        assert row(outcome_of(exc)) == row(outcome) and str(exc) == str(outcome.error), (case, exc)
    else:
        assert row(outcome) in ("passed", "failed") and answer.verdict == outcome.verdict, (case, answer)
    for command in ("gradcheck-svc", "gradcheck"):
        assert exit_code(bounded, command) == exit_code(outcome, command)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory)


@pytest.mark.parametrize("case", sorted(CASES))
def test_grpc_status_from_verify_and_verify_stream(tmp_path, server, case):
    from gradcheck_client import Client, VerifyError

    outcome = _outcome(tmp_path, case)
    code, kind = grpc_status(outcome)
    _, options, _ = CASES[case]
    path = str(_graph(tmp_path, case))
    with Client(server.target, timeout=300) as client:
        answers = []
        try:
            answers.append(client.verify(path, **options))
        except VerifyError as exc:
            answers.append(exc)
        answers += list(client.verify_many([path], raise_errors=False, **options))
    assert len(answers) == 2
    for answer in answers:
        if isinstance(answer, VerifyError):
            assert (answer.code.name, answer.kind) == (code, kind), (case, answer)
        else:
            assert code == grpc.StatusCode.OK.name and answer.verdict == outcome.verdict, (case, answer)


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_record_status_in_process_and_through_a_server(tmp_path, server, case):
    from gradcheck_svc.batch.verifiers import LocalVerifier, RemoteVerifier

    outcome = _outcome(tmp_path, case)
    _, options, _ = CASES[case]
    graph = load_graph(str(_graph(tmp_path, case)))  # as the batch reads it: a Graph message
    local = LocalVerifier(options)
    remote = RemoteVerifier(server.target, options)
    try:
        remote.check()
        for verifier in (local, remote):
            record = verifier.verify(graph, f"{case}.json", options, 300.0)
            assert record["status"] == batch_status(outcome), (case, type(verifier).__name__, record)
    finally:
        remote.close()
    assert batch_status(outcome) == {"passed": "pass", "failed": "fail", "invalid": "invalid", "limit": "invalid"}[case]
