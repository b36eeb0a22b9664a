"""NaN/Inf in an input's data: refused by default naming the input (the corpus checks that), and with
allow_nonfinite a `nonfinite` finding that names the input as the origin -- the only finding, no NumPy
warning on stderr -- from the CLI and over gRPC alike."""
from __future__ import annotations

import json

import pytest

import forked_cli
from bad_inputs import seed
from gradcheck_client import Client
from grpc_helpers import _env, module_server


def _nan_graph(tmp_path):
    g = seed()
    g["inputs"][1]["value"]["data"] = ["NaN"]
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(g))
    return path


def _only_finding_names_x(findings):
    assert [(f["node"], f["cause"]) for f in findings] == [("z", "nonfinite")]
    assert "non-finite graph input 'x'" in findings[0]["detail"]


def test_cli(tmp_path):
    path = _nan_graph(tmp_path)
    # the command in a fork of this process (tests/forked_cli.py: its main, environment, pipes, exit status, and
    # Python's default warning filters, so a RuntimeWarning would show on stderr as in a fresh process)
    done = forked_cli.run("gradcheck_svc.cli", "verify", path, "--allow-nonfinite", "--format", "json", env=_env(),
                          timeout=120)
    assert done.returncode == 1 and done.stderr == ""  # no RuntimeWarning
    _only_finding_names_x(json.loads(done.stdout)["findings"])
    refused = forked_cli.run("gradcheck_svc.cli", "verify", path, env=_env(), timeout=120)
    assert refused.returncode == 2 and refused.stderr.startswith("gradcheck-svc: error: input 'x': data holds 1 NaN")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def test_grpc(server, tmp_path):
    with Client(server.target, timeout=60, retries=0) as c:
        report = c.verify(str(_nan_graph(tmp_path)), allow_nonfinite=True)
    assert report.verdict == "fail"
    _only_finding_names_x(report.data["findings"])
    assert "RuntimeWarning" not in server.log_path.read_text()
