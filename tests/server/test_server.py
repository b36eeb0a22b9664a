"""GradCheckService over real gRPC on loopback: one `gradcheck-svc serve` process for the module."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_client import AsyncClient, Client, VerifyError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.verify import verify
from grpc_helpers import example_paths, expected_verdict, module_server, seed_graph, wait_for
from slow_graphs import unfinishable_graph


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # no request time limit here: the round trip of the largest example (chain_256) takes 15 s on a
    # quiet machine and several times that on a loaded one; the limit has its own tests
    # (test_server_limits.py), and no test here may depend on the machine's speed
    yield from module_server(tmp_path_factory, "--workers", "2", "--max-request-seconds", "86400")


@pytest.fixture(scope="module")
def client(server):
    with Client(server.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.target)
    yield service_pb2_grpc.GradCheckServiceStub(channel)
    channel.close()


def _keys(d, prefix=""):
    """Every key path of a JSON report (list items merged); a null value counts as absent,
    as an unset message field in the proto."""
    out = set()
    for k, v in d.items():
        if v is None:
            continue
        out.add(prefix + k)
        items = v if isinstance(v, list) else [v]
        for item in items:
            if isinstance(item, dict):
                out |= _keys(item, prefix + k + ".")
    return out


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_round_trip_of_every_example(client, path):
    report = client.verify(path, timeout=None)  # no deadline: a large example's time is the machine's
    local = verify(load_graph(path)).to_dict()
    assert report.verdict == local["verdict"] == expected_verdict(path)
    assert report.graph == local["graph"]
    # everything the JSON report has comes through the proto Report, with the same values
    missing = _keys(local) - _keys(report.data)
    assert not missing, f"proto Report lacks JSON report keys {sorted(missing)}"
    for mine, theirs in zip(report.parameters, local["parameters"], strict=True):
        assert mine.name == theirs["name"]
        assert mine.data["gradient"] == theirs["gradient"]
        assert mine.data["reference"] == theirs["reference"]
        assert mine.passed == theirs["passed"]
    # (proto3 scalars have no presence: keys the local report omits come back as defaults)
    assert {k: report.memory[k] for k in local["memory"]} == local["memory"]
    assert report.text.startswith(f"graph {local['graph']}: {local['verdict'].upper()}")


def test_seed_gradients_and_options(client):
    report = client.verify(seed_graph(), fd_mode="full", dtype="float32", seed=3)
    assert report.passed and report.dtype == "float32"
    grads = {p.name: p.data["gradient"] for p in report.parameters}
    assert grads == {"w": [6.0], "x": [9.0]}
    broken = client.verify(seed_graph(), faults=["z:overwrite:99"])
    assert broken.verdict == "fail"
    assert broken.data["faults"][0]["read_by"] == ["a"]
    with pytest.raises(AssertionError, match="seed: FAIL"):
        broken.raise_for_mismatch()


def _whole_again(server) -> None:
    """After a cancelled call: nothing in flight, and the killed worker replaced (2 workers), for the next test."""
    wait_for(lambda: server.metric("gradcheck_in_flight") == 0, 120, "the cancelled call to end")
    wait_for(lambda: len(server.worker_pids()) == 2, 120, "two workers again")


def test_stream_reports_in_completion_order_tagged_with_ids(server):
    """The item sent first never finishes by itself (slow_graphs.unfinishable_graph): the four sent after it
    come back while it runs on the other worker, each tagged with its id; then the stream is cancelled."""
    requests = [("slow", unfinishable_graph()), *((f"seed{i}", seed_graph()) for i in range(4))]
    with Client(server.target) as c:
        stream = c.verify_many(requests, fd_mode="full")
        answers = [next(stream) for _ in range(4)]
        stream.close()  # cancels the call: the slow item's worker is killed and replaced
    assert sorted(r.id for r in answers) == [f"seed{i}" for i in range(4)] and all(r.passed for r in answers)
    _whole_again(server)


def test_stream_item_error_does_not_end_stream(client):
    bad = service_pb2.VerifyRequest(graph=seed_graph()).graph
    bad.nodes[0].op = "mull"
    items = list(client.verify_many({"ok": seed_graph(), "bad": bad}, raise_errors=False))
    by_id = {i.id: i for i in items}
    assert by_id["ok"].passed
    err = by_id["bad"]
    assert isinstance(err, VerifyError) and err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.field == "node 'z'" and "did you mean 'mul'" in err.message


def test_invalid_graph_is_invalid_argument_with_bad_request_detail(stub):
    request = service_pb2.VerifyRequest(graph=seed_graph())
    request.graph.nodes[1].inputs[0] = "nope"
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(request, timeout=30)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "node 'a': unknown input 'nope'"
    status = rpc_status.from_call(err)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "node 'a'"
    assert "Traceback" not in err.details()


@pytest.mark.parametrize("options, field", [
    (service_pb2.VerifyOptions(fd_mode="sideways"), "options.fd_mode"),
    (service_pb2.VerifyOptions(faults=["z:melt"]), "fault"),
    (service_pb2.VerifyOptions(dtype="float16"), "options.dtype"),  # every option's value named as the request names it
    (service_pb2.VerifyOptions(atol=-1.0), "options.atol"),
    (service_pb2.VerifyOptions(rtol=float("nan")), "options.rtol"),
    (service_pb2.VerifyOptions(integrity="sometimes"), "options.integrity"),
])
def test_bad_options_are_invalid_argument(stub, options, field):
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(service_pb2.VerifyRequest(graph=seed_graph(), options=options), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field + ":")


def test_checkpoint_option_reaches_the_engine(stub):
    response = stub.Verify(service_pb2.VerifyRequest(graph=seed_graph(), options=service_pb2.VerifyOptions(
        checkpoint="every:1")), timeout=30)
    memory = response.report.memory
    assert response.report.verdict == "pass"
    assert memory.checkpoint == "every:1" and memory.checkpoint_gradients_equal


def test_bad_checkpoint_option_is_invalid_argument(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(service_pb2.VerifyRequest(graph=seed_graph(), options=service_pb2.VerifyOptions(
            checkpoint="every:0")), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "checkpoint" in info.value.details()


def test_cuda_on_a_cpu_machine_is_failed_precondition(stub):
    from gradcheck_svc.backend import cuda_available

    if cuda_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(service_pb2.VerifyRequest(graph=seed_graph(), options=service_pb2.VerifyOptions(device="cuda")))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "device 'cuda' is not available" in info.value.details()


def test_malformed_protobuf_payload(server):
    """Every method: INVALID_ARGUMENT, kind invalid (ListOps and GetServerInfo answered UNKNOWN "Unexpected
    DecodeError" from gRPC's own deserializer)."""
    channel = grpc.insecure_channel(server.target)
    for method, name in (("Verify", "VerifyRequest"), ("ListOps", "ListOpsRequest"),
                         ("GetServerInfo", "GetServerInfoRequest")):
        raw = channel.unary_unary(f"/gradcheck.v1.GradCheckService/{method}")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x12\xff\xff\xff\x0f not a protobuf", timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert f"malformed {name}" in info.value.details()
        assert dict(info.value.trailing_metadata())["gradcheck-error-kind"] == "invalid"
    channel.close()


def test_list_ops_is_the_registry(client):
    ops = client.list_ops()
    assert [o["name"] for o in ops] == sorted(REGISTRY)
    by_name = {o["name"]: o for o in ops}
    assert by_name["matmul"]["arity"] == 2 and not by_name["matmul"]["variadic"]
    assert by_name["concat"]["variadic"]
    assert by_name["tanh"]["formula"] == "tanh(x)"
    assert by_name["sum"]["attributes"]["keepdims"]["default"] is False
    assert by_name["relu"]["kinks"], "relu declares its kink at 0"


def test_server_info(client):
    info = client.server_info()
    assert info["version"] == "0.1.0"
    assert "cpu" in info["devices"] and info["oracles"] == ["finite_diff", "symbolic"]
    assert info["workers"] == 2 and info["auth_required"] is False
    assert info["limits"]["max_nodes"] == 100_000


def test_health_and_reflection(server):
    channel = grpc.insecure_channel(server.target)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "gradcheck.v1.GradCheckService"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(refl.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="gradcheck.v1.GradCheckService"),
    ]), timeout=10))
    channel.close()
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"gradcheck.v1.GradCheckService", "grpc.health.v1.Health"} <= names
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto.FromString(answers[1].file_descriptor_response.file_descriptor_proto[0])
    assert [m.name for m in fd.service[0].method] == ["Verify", "VerifyStream", "ListOps", "GetServerInfo"]


def test_health_answers_while_workers_are_busy(server, stub):
    """A verification that never finishes by itself (slow_graphs.unfinishable_graph) runs in a worker process:
    the event loop still answers at once. Then the call is cancelled (its worker killed and replaced)."""
    from gradcheck_core.request_message import make_request

    call = stub.Verify.future(make_request(unfinishable_graph(), "slow"), timeout=600)
    try:
        server.wait_in_flight(1)
        channel = grpc.insecure_channel(server.target)
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        channel.close()
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        assert not call.done(), "the slow request should still be running"
    finally:
        call.cancel()
    _whole_again(server)


def test_async_client(server):
    async def go():
        async with AsyncClient(server.target) as c:
            one = await c.verify(seed_graph(), id="a")
            many = [r async for r in c.verify_many([seed_graph(), seed_graph()])]
            ops = await c.list_ops()
            return one, many, ops

    one, many, ops = asyncio.run(go())
    assert one.passed and one.id == "a"
    assert sorted(r.id for r in many) == ["0", "1"] and all(r.passed for r in many)
    assert len(ops) == len(REGISTRY)


def test_metrics_and_one_log_line_per_request(server, client):
    before = server.metric("gradcheck_requests_total", method="Verify", code="OK")
    passes = server.metric("gradcheck_verdicts_total", verdict="pass")
    observed = server.metric("gradcheck_request_duration_seconds_count", method="Verify")
    client.verify(seed_graph(), id="logged-one")
    assert server.metric("gradcheck_requests_total", method="Verify", code="OK") == before + 1
    assert server.metric("gradcheck_verdicts_total", verdict="pass") == passes + 1
    assert server.metric("gradcheck_request_duration_seconds_count", method="Verify") == observed + 1
    assert server.metric("gradcheck_in_flight") == 0
    assert server.samples("gradcheck_worker_restarts_total")  # declared before any restart
    assert server.metric("process_resident_memory_bytes") > 0  # prometheus_client's process metrics
    lines = [rec for rec in server.log_lines() if rec.get("id") == "logged-one"]
    assert len(lines) == 1
    rec = lines[0]
    assert rec["msg"] == "request" and rec["method"] == "Verify" and rec["code"] == "OK"
    assert rec["verdict"] == "pass" and rec["graph"] == "seed" and rec["duration_ms"] > 0


def test_error_naming_a_non_ascii_node(client):
    request = service_pb2.VerifyRequest(graph=seed_graph())
    request.graph.nodes[2].name = "Verlust→ü"
    request.graph.output = "Verlust→ü"
    request.graph.nodes[2].op = "divide"
    with pytest.raises(VerifyError) as info:
        client.verify(request.graph)
    assert info.value.field == "node 'Verlust→ü'"
    assert info.value.message == "node 'Verlust→ü': unknown op 'divide' (did you mean 'div'?)"


def test_serve_on_a_port_in_use_is_one_line_exit_2(server):
    import subprocess
    import sys

    from grpc_helpers import ROOT, _env

    r = subprocess.run([sys.executable, "-m", "gradcheck_svc.cli", "serve", "--port", str(server.port)],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert r.stderr == f"gradcheck-svc: error: --port: cannot listen on 127.0.0.1:{server.port} " \
                       "(address in use or not available)\n"


def test_symbolic_options_reach_the_oracle(client):
    off = client.verify(seed_graph(), symbolic=False)
    assert off.data["symbolic"]["status"] == "off"
    small = client.verify(seed_graph(), symbolic_budget=3)
    assert small.data["symbolic"]["status"] == "skipped" and "budget is 3" in small.data["symbolic"]["reason"]
    full = client.verify(seed_graph())
    assert full.data["symbolic"]["status"] == "ok"
    assert {p.name: p.data["symbolic"]["gradient"] for p in full.parameters} == {"w": [6.0], "x": [9.0]}
