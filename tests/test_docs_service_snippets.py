"""docs/service.md's Python snippets run as written (issue 27 item 4): in one session, as a reader pastes them,
against a real server (its address in place of localhost:50051), from a folder holding the repository's
examples/. The ONNX snippet reads the reader's own model (cnn.onnx) and is left out by that name."""
from __future__ import annotations

import re

import pytest

from grpc_helpers import ROOT, module_server

DOC = ROOT / "docs" / "service.md"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def test_service_md_python_snippets_run(server, tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)
    runnable = [b for b in blocks if "cnn.onnx" not in b]
    assert len(runnable) == len(blocks) - 1 >= 5
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    session: dict = {}
    for block in runnable:
        exec(compile(block.replace("localhost:50051", server.target), str(DOC), "exec"), session)
    assert session["report"].verdict == "pass"  # the last snippet's (layer norm through the server)
    assert (tmp_path / "layer.json").is_file()  # save_graph wrote the traced graph
    out = capsys.readouterr().out
    assert "seed pass" in out and "mlp pass" in out  # verify_many's lines


def test_readme_quick_start_verify_lines_exit_as_their_comments_say(server):
    import shlex
    import subprocess
    import sys

    from grpc_helpers import _env

    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("# gradcheck\n\n```\nmake run ")  # the developer commands stay first
    block = re.search(r"^## Quick start\n\n```\n(.*?)^```$", readme, flags=re.S | re.M).group(1)
    lines = [ln for ln in block.splitlines() if ln.startswith("gradcheck verify ")]
    assert len(lines) == 2
    for line in lines:
        command, comment = line.split("#", 1)
        want = int(re.search(r"exit (\d)", comment).group(1))
        args = shlex.split(command.replace("localhost:50051", server.target))[1:]
        r = subprocess.run([sys.executable, "-m", "gradcheck_client.cli", *args], capture_output=True, text=True,
                           env=_env(), cwd=ROOT, timeout=120)
        assert r.returncode == want, (line, r.stdout, r.stderr)
