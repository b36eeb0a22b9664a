"""Nothing checked is not a pass: a graph without a parameter is invalid input in every entry point --
gradcheck-svc verify (exit 2, test_graph_validation.py), the server (INVALID_ARGUMENT), the CI command
(exit 2) and a batch shard (an "invalid" record)."""
from __future__ import annotations

import json

import grpc
import pytest

import forked_cli
from gradcheck_client import Client, VerifyError, save_graph
from gradcheck_svc.cli import main
from gradcheck_svc.graph.build import GraphBuilder
from grpc_helpers import ROOT, _env, module_server

NEEDLE = "no parameters: nothing to check"


def _no_params_graph():
    b = GraphBuilder("constant_only")
    b.output(b.node("sum", b.node("exp", b.input("x", [0.5, 1.0]), name="e"), name="L"))
    return b.build()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def test_server_refuses_invalid_argument(server):
    with Client(server.target) as c, pytest.raises(VerifyError) as err:
        c.verify(_no_params_graph(), timeout=60)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and NEEDLE in err.value.message
    assert err.value.field == "inputs"


@pytest.mark.parametrize("through_server", [False, True])
def test_ci_command_exits_2(server, tmp_path, through_server):
    path = save_graph(_no_params_graph(), tmp_path / "g.json")
    junit = tmp_path / "junit.xml"
    args = ["verify", str(path), "--junit", str(junit)] + (["--server", server.target] if through_server else [])
    # a real process through the server (gRPC), a fork of this one in-process (tests/forked_cli.py)
    r = forked_cli.run("gradcheck_client.cli", *args, env=_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert NEEDLE in r.stdout + r.stderr
    assert "PASS" not in r.stdout


def test_batch_records_it_invalid(capsys, tmp_path):
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    save_graph(_no_params_graph(), graphs / "g.json")
    out = tmp_path / "out"
    main(["batch", "--manifest", str(graphs), "--shard-index", "0", "--out", str(out)])
    capsys.readouterr()
    [record] = [json.loads(p.read_text()) for p in (out / "runs" / "default" / "shard-0000" / "results").glob("*.json")]
    assert record["status"] == "invalid" and NEEDLE in record["error"]
