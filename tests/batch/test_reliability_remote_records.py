"""Records keyed by what computed them (issue 35 item 3): a batch run against a server keys its records on
the server's source digest (GetServerInfo.code_version, the code version an in-process run records), so
re-running the same run ID against a server whose engine changed under the same release number
re-verifies -- and fails -- instead of skipping every graph and merging PASS.

The changed server is a real `gradcheck-svc serve` started from a copy of the package with one derivative
edited (mul's second gradient doubled), its __version__ untouched.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gradcheck_client import Client, save_graph
from gradcheck_core.tracer import Tracer
from gradcheck_svc import __version__
from gradcheck_svc.store.records import code_version
from gradcheck_svc.cli import main
from grpc_helpers import ROOT, ServerProcess

RIGHT_MUL = "lambda xp, g, s: (g * s[1], g * s[0])"
WRONG_MUL = "lambda xp, g, s: (g * s[1], 2.0 * g * s[0])"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "graphs"
    root.mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        t = Tracer(f"mul_{k}")
        w, v = t.param("w", rng.standard_normal(4)), t.param("v", rng.standard_normal(4))
        save_graph(t.graph((w * v).sum()), root / f"mul_{k}.json")
    return root


@pytest.fixture
def wrong_mul_package(tmp_path):
    """A copy of gradcheck_svc whose mul rule is wrong; the same release number."""
    copy = tmp_path / "changed"
    shutil.copytree(ROOT / "gradcheck_svc", copy / "gradcheck_svc", ignore=shutil.ignore_patterns("__pycache__"))
    ops = copy / "gradcheck_svc" / "ops" / "elementwise.py"
    text = ops.read_text()
    assert text.count(RIGHT_MUL) == 1
    ops.write_text(text.replace(RIGHT_MUL, WRONG_MUL))
    return copy


def _server_info(server) -> dict:
    with Client(server.target, timeout=60) as c:
        return c.server_info()


def test_server_info_reports_the_source_digest(tmp_path):
    with ServerProcess("--workers", "1", log_path=tmp_path / "server.log") as server:
        info = _server_info(server)
    assert info["code_version"] == code_version() and info["code_version"].startswith(__version__ + "+src.")


def test_a_changed_server_re_verifies_the_same_run(capsys, tmp_path, corpus, wrong_mul_package):
    out = tmp_path / "out"
    common = ("batch", "--manifest", corpus, "--shard-index", 0, "--out", out, "--run-id", "r1")
    with ServerProcess("--workers", "1", log_path=tmp_path / "right.log") as right:
        code, _, err = run(capsys, *common, "--server", right.target)
    assert code == 0 and "3 graphs, 0 already done, 3 to verify" in err and "finished: 3 pass" in err, err

    env = {"PYTHONPATH": f"{wrong_mul_package}:{ROOT / 'clients' / 'python'}"}
    with ServerProcess("--workers", "1", env=env, cwd=wrong_mul_package, log_path=tmp_path / "wrong.log") as wrong:
        info = _server_info(wrong)
        assert info["version"] == __version__ and info["code_version"] != code_version()
        code, _, err = run(capsys, *common, "--server", wrong.target)
    assert code == 0 and "3 graphs, 0 already done, 3 to verify" in err and "finished: 3 fail" in err, err

    code, _, err = run(capsys, "batch-merge", out, "--run-id", "r1", "--json", tmp_path / "merged.json")
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert code == 1, err
    assert {r["graph"]: r["status"] for r in merged["records"]} == {f"mul_{k}.json": "fail" for k in range(3)}
    assert {r["gradcheck_version"] for r in merged["records"]} == {"server " + info["code_version"]}
    for r in merged["records"]:  # the doubled gradient is v's (mul's second input), w's is right
        failed = {p["name"] for p in r["report"]["parameters"] if not p["passed"]}
        assert failed == {"v"}

    # the same server again: now its records are found and reused
    with ServerProcess("--workers", "1", env=env, cwd=wrong_mul_package, log_path=tmp_path / "again.log") as wrong:
        code, _, err = run(capsys, *common, "--server", wrong.target)
    assert code == 0 and "3 already done, 0 to verify" in err, err
