"""Careless readers and misbehaving servers: `gradcheck verify G G G | head` (a reader gone before the first
line) ends quietly with the verdict's exit code, its report files still written; the client given a unary
`error` outcome raises the server's message instead of reading an empty report; the torch front end given
a report whose loss is NaN refuses in one line. The misbehaving remote is a small servicer of the real
generated service on loopback, answering with our real pipeline's report and then bending it."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent import futures

import grpc
import pytest

from conftest import EXAMPLES
from gradcheck.v1 import service_pb2, service_pb2_grpc
from grpc_helpers import ROOT, _env

GOOD, WRONG = str(EXAMPLES / "seed.json"), str(EXAMPLES / "swish_custom_wrong.json")


def _verify_into_closed_pipe(module: str, *args: str) -> subprocess.CompletedProcess:
    """`gradcheck verify ARGS | head` at its worst: stdout a pipe whose reader is gone before the command
    starts, so its very first write meets the closed pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.Popen([sys.executable, "-m", module, "verify", *args], stdout=write,
                             stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    finally:
        os.close(write)
    _, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, "", err)


@pytest.mark.parametrize("module", ["gradcheck_client.cli", "gradcheck_svc.cli"])
@pytest.mark.parametrize("graphs, code", [((GOOD, GOOD, GOOD), 0), ((GOOD, WRONG, GOOD), 1)])
def test_a_closed_stdout_ends_quietly_with_the_verdicts_exit_code(module, graphs, code, tmp_path):
    junit = tmp_path / "junit.xml"
    copies = []
    for i, g in enumerate(graphs):  # three files (the same graph three times would be one path)
        copies.append(tmp_path / f"g{i}_{os.path.basename(g)}")
        copies[-1].write_bytes(open(g, "rb").read())
    r = _verify_into_closed_pipe(module, *map(str, copies), "--junit", str(junit))
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "Exception ignored" not in r.stderr
    assert sum(1 for _ in ET.parse(junit).iter("testcase")) == 3  # the command went on past the closed pipe


# ---- a misbehaving server ----------------------------------------------------------------------------------

class Misbehaving(service_pb2_grpc.GradCheckServiceServicer):
    """Answers Verify with the real pipeline's report and a NaN loss, or with an `error` outcome."""

    mode = "nan"

    def Verify(self, request, context):
        if self.mode == "error":
            return service_pb2.VerifyResponse(id=request.id, error=service_pb2.VerifyError(
                code=grpc.StatusCode.INTERNAL.value[0], message="worker 4711 ran out of disk", kind="internal"))
        from gradcheck_svc.report_proto import report_to_proto
        from gradcheck_svc.outcome import report_of
        from gradcheck_svc.request import run_request

        report = report_to_proto(report_of(run_request(request)))
        report.loss = math.nan
        return service_pb2.VerifyResponse(id=request.id, report=report)


@pytest.fixture(scope="module")
def remote():
    servicer = Misbehaving()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service_pb2_grpc.add_GradCheckServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_the_torch_front_end_refuses_a_nan_loss_in_one_line(remote):
    import torch

    from gradcheck_client.torch import check
    from gradcheck_core.trace_errors import TracerError

    servicer, target = remote
    servicer.mode = "nan"
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    with pytest.raises(TracerError) as info:
        check(lambda t: (t * t).sum(), x, server=target)
    message = str(info.value)
    assert message.startswith("check refused: the engine's loss is nan, <lambda>'s own is ") and "\n" not in message
    assert "not deterministic" not in message


def test_an_error_outcome_surfaces_the_servers_message(remote):
    import torch

    from gradcheck_client import Client
    from gradcheck_core.client import VerifyError
    from gradcheck_client.torch import check

    servicer, target = remote
    servicer.mode = "error"
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    with pytest.raises(VerifyError) as info:
        check(lambda t: (t * t).sum(), x, server=target)
    assert (info.value.code, info.value.message, info.value.kind) == \
        (grpc.StatusCode.INTERNAL, "worker 4711 ran out of disk", "internal")
    with Client(target, retries=0) as client:  # the plain client alike
        with pytest.raises(VerifyError, match="^INTERNAL: worker 4711 ran out of disk$"):
            client.verify(GOOD)
