"""Names with control characters, markup and great length are valid graph names: every output that
echoes them (text report, JUnit XML, Markdown, SVG plot) stays one line per line and well-formed."""
from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from bad_inputs import seed
from grpc_helpers import _env, module_server
import forked_cli

HOSTILE = "loss\n\x1b[31mTraceback (most recent call last):\x00<b>&amp;</b>\u2028" + "é" * 100


def _graph(tmp_path):
    g = seed()
    g["name"] = HOSTILE[:200]
    g["nodes"][2]["name"] = HOSTILE[:200]
    g["output"] = HOSTILE[:200]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(g))
    return path


def test_text_report_and_svg(tmp_path):
    path, plot = _graph(tmp_path), tmp_path / "mem.svg"
    # forked (tests/forked_cli.py): the same main, argv, environment and pipes as `python -m`, without its start-up
    done = forked_cli.run("gradcheck_svc.cli", "verify", path, "--fault", "z:scale", "--memory-plot", plot,
                          env=_env(), timeout=120)
    assert done.returncode == 1, done.stderr
    assert all(line.isprintable() for line in done.stdout.splitlines())
    assert not any(line.startswith("Traceback") for line in done.stdout.splitlines())
    assert "\\x1b[31mTraceback" in done.stdout  # shown, escaped, inside its line
    root = ET.parse(plot).getroot()  # well-formed
    assert root.tag.endswith("svg") and "\\n" in "".join(root.itertext())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def test_junit_and_markdown_through_the_ci_command(server, tmp_path):
    path = _graph(tmp_path)
    bad = tmp_path / "bad\x01name.json"
    bad.write_text('{"nodes": [{"name": "x\\u0007", "op": "nope"}]}')
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    done = subprocess.run([sys.executable, "-c", "import sys; from gradcheck_client.cli import main; "
                           "sys.exit(main())", "verify", str(path), str(bad), "--server", server.target,
                           "--fault", "z:scale", "--junit", str(junit), "--summary-md", str(md)],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 2, done.stderr  # the invalid graph outranks the mismatch
    suite = ET.parse(junit).getroot()  # well-formed despite \x00, \x01, \x07 in names and reports
    assert suite.get("tests") == "2" and suite.get("failures") == "1" and suite.get("errors") == "1"
    assert all(line.count("|") >= 3 for line in md.read_text().splitlines() if line.startswith("| `"))
