"""The reusable CI definitions run as written (issue 27 item 6): the GitHub composite Action
(.github/actions/gradcheck/action.yml) and the GitLab CI template (ci/gitlab/gradcheck.yml).

Each test copies the repository's installable parts into a temporary checkout, parses the YAML, and runs every
shell step (`run:` / `script:`) with bash as the CI runner would, with the runner's variables set: the install
step installs the client (and, in-process, the service) into a fresh virtual environment (offline: its
dependencies are the test environment's), the verify step checks a small graph folder -- one graph that
verifies, one whose custom gradient is wrong -- in-process or against a real server on loopback. The upload
steps (`uses: actions/upload-artifact`) cannot run here: they are skipped by name, and the files they name
are asserted to be the ones the earlier steps wrote."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from grpc_helpers import EXAMPLES, ROOT, module_server

ACTION = ROOT / ".github" / "actions" / "gradcheck" / "action.yml"
GITLAB = ROOT / "ci" / "gitlab" / "gradcheck.yml"
GRAPHS = {"seed.json": "pass", "swish_custom_wrong.json": "fail"}
OFFLINE = "--no-build-isolation --no-index"  # the build backend and dependencies: the test environment's


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def _checkout(tmp_path: Path) -> Path:
    """What a CI job's checkout holds of this repository (the installable parts and the CI files), and graphs/."""
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for part in ["gradcheck_svc", "clients/python", ".github/actions", "ci"]:
        shutil.copytree(ROOT / part, repo / part, ignore=skip)
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(ROOT / name, repo / name)
    (repo / "graphs").mkdir()
    for name in GRAPHS:
        shutil.copy(EXAMPLES / name, repo / "graphs" / name)
    return repo


def _venv(tmp_path: Path) -> Path:
    """A fresh environment that sees this one's packages (offline installs) but not its gradcheck: the
    editable installs' .pth hooks are not run for a path added by a .pth file."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site] = (venv / "lib").glob("python*/site-packages")
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "python"


def _runner_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADCHECK_", "PYTHON", "GITHUB_"))}
    return env | {"HOME": str(tmp_path)} | extra


def _verdicts(server) -> float:
    """Verdicts the server has given: grows by one per graph verified through it."""
    return sum(server.metric("gradcheck_verdicts_total", verdict=v) for v in ("pass", "fail"))


def _bash(script: str, cwd: Path, env: dict, flags: str = "-eo pipefail") -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "--noprofile", "--norc", *flags.split(), "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _assert_outputs(junit: Path, html: Path, summary: Path) -> None:
    cases = {Path(c.get("file")).name: c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == set(GRAPHS)
    assert cases["seed.json"].find("failure") is None and cases["swish_custom_wrong.json"].find("failure") is not None
    assert html.read_text().lstrip().lower().startswith("<!doctype html>")
    text = summary.read_text()
    assert "| Graph | Verdict | Findings |" in text and "❌ fail" in text and "✅ pass" in text


# -- GitHub: the composite Action -------------------------------------------------------------------------------

def _expand(text: str, inputs: dict) -> str:
    """The ${{ }} expressions the Action's steps use: its inputs (and nothing else may appear)."""
    out = re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", lambda m: inputs[m.group(1)], str(text))
    assert "${{" not in out, out
    return out


@pytest.mark.parametrize("where", ["in-process", "server"])
def test_github_action_runs_as_written(tmp_path, server, where):
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    repo, python = _checkout(tmp_path), _venv(tmp_path)
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    inputs |= {"python": str(python), "pip-args": OFFLINE, "server": server.target if where == "server" else ""}
    action_path = repo / ".github" / "actions" / "gradcheck"
    github_output, step_summary = tmp_path / "github_output", tmp_path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    ran, uploads, before = [], [], _verdicts(server)
    for step in action["runs"]["steps"]:
        if "uses" in step:  # an upload: not runnable here; checked below against what was written
            assert step["uses"].startswith("actions/upload-artifact@") and step.get("if") == "always()"
            uploads.append(repo / _expand(step["with"]["path"], inputs))
            continue
        assert step["shell"] == "bash" and "${{" not in step["run"]  # inputs reach scripts as env only
        env = _runner_env(tmp_path, GITHUB_ACTION_PATH=str(action_path), GITHUB_OUTPUT=str(github_output),
                          GITHUB_STEP_SUMMARY=str(step_summary), GITHUB_WORKSPACE=str(repo))
        env |= {k: _expand(v, inputs) for k, v in (step.get("env") or {}).items()}
        r = _bash(step["run"], repo, env)
        ran.append(step["name"])
        if step.get("id") == "verify":
            assert r.returncode == 1, (r.stdout, r.stderr)  # the wrong gradient fails the step
        else:
            assert r.returncode == 0, (step["name"], r.stdout, r.stderr)
    assert ran == ["Install the gradcheck client", "Verify gradients"]
    installed = subprocess.run([str(python), "-c", "import gradcheck_client, importlib.util as u; "
                                "print(gradcheck_client.__file__, u.find_spec('gradcheck_svc') is not None)"],
                               capture_output=True, text=True, env=_runner_env(tmp_path), cwd=tmp_path,
                               timeout=60).stdout.split()
    assert installed[0].startswith(str(tmp_path / "venv"))  # the client the step installed, not this checkout's
    assert installed[1] == str(where == "in-process")  # the service only to verify in-process
    assert github_output.read_text() == "exit-code=1\n"
    assert _verdicts(server) == before + (len(GRAPHS) if where == "server" else 0)
    out = repo / inputs["output-dir"]
    assert uploads == [out / "junit.xml", out / "report.html"]
    _assert_outputs(out / "junit.xml", out / "report.html", out / "summary.md")
    assert step_summary.read_text() == "earlier step\n" + (out / "summary.md").read_text()


# -- GitLab: the CI template -------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["in-process", "server"])
def test_gitlab_template_runs_as_written(tmp_path, server, where):
    job = yaml.safe_load(GITLAB.read_text())[".gradcheck"]
    repo, python = _checkout(tmp_path), _venv(tmp_path)
    variables = {k: str(v) for k, v in job["variables"].items()}
    variables |= {"GRADCHECK_PYTHON": str(python), "GRADCHECK_PIP_ARGS": OFFLINE,
                  "GRADCHECK_SERVER": server.target if where == "server" else ""}
    before = _verdicts(server)
    # GitLab runs the script's lines in one shell, stopping at the first that fails
    r = _bash("\n".join(job["script"]), repo, _runner_env(tmp_path, CI="true", **variables))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "gradcheck: 1 pass, 1 fail" in r.stderr
    assert _verdicts(server) == before + (len(GRAPHS) if where == "server" else 0)
    artifacts = job["artifacts"]
    assert artifacts["when"] == "always"  # kept when the job fails, which is when they are read
    junit = repo / artifacts["reports"]["junit"]
    [folder] = [repo / p for p in artifacts["paths"]]
    _assert_outputs(junit, folder / "report.html", folder / "summary.md")
    assert junit.parent == folder


# -- docs/ci.md: the examples use these files as they are -------------------------------------------------------

def test_docs_examples_match_the_action_and_the_template():
    docs = (ROOT / "docs" / "ci.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"^```yaml\n(.*?)^```$", docs, flags=re.S | re.M)]
    action = yaml.safe_load(ACTION.read_text())
    [workflow] = [b for b in blocks if isinstance(b, dict) and "jobs" in b]
    steps = workflow["jobs"]["gradients"]["steps"]
    [uses] = [s for s in steps if s.get("uses") == "./.github/actions/gradcheck"]
    assert set(uses["with"]) <= set(action["inputs"])
    [reporter] = [s for s in steps if s.get("uses", "").startswith("dorny/test-reporter@")]
    assert reporter["if"] == "always()" and reporter["with"]["reporter"] == "java-junit"
    assert reporter["with"]["path"] == f"{action['inputs']['output-dir']['default']}/junit.xml"
    [included] = [b for b in blocks if isinstance(b, dict) and "include" in b]
    assert included["include"] == [{"local": "ci/gitlab/gradcheck.yml"}]
    assert included["gradcheck"]["extends"] in yaml.safe_load(GITLAB.read_text())
    assert set(included["gradcheck"]["variables"]) <= set(yaml.safe_load(GITLAB.read_text())[".gradcheck"]["variables"])
