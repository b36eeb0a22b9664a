"""No import cycles in the server or client packages: every import statement (at module level or inside a
function) between their modules, read from the source, forms no cycle. A submodule importing its own package
is no edge: Python imports the package first anyway."""
from __future__ import annotations

import ast
from pathlib import Path

from import_graph import cycle as _cycle, imports as _imports, modules as _modules

ROOT = Path(__file__).resolve().parents[2]


def _edges(name: str, path: Path, known) -> set[str]:
    """The modules of ours that `name` imports; a submodule importing its own package is no edge."""
    return {t for t, _ in _imports(name, path) if t in known and t != name and not name.startswith(t + ".")}


def test_no_import_cycles():
    known = _modules()
    graph = {name: _edges(name, path, known) for name, path in known.items()}
    assert graph["gradcheck_core.tracer"] >= {"gradcheck_core.indexing"}  # the graph is really read
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


# --- one request pipeline (issue 37 item 1): gradcheck_svc/request.py is below every front end ---------------
# The entry point assembles the processes (a CLI that can start a server; the token file and the limits both
# CLIs read are gradcheck_svc/config.py's, outside the server package); every other module, the front ends
# and the batch command included, reaches the pipeline without the server package.
ENTRY_POINTS = {"gradcheck_svc.cli"}


def test_no_module_outside_the_server_imports_it_but_the_entry_points():
    known = _modules()
    offenders = {name: sorted(t for t in _edges(name, path, known) if t.startswith("gradcheck_svc.server"))
                 for name, path in known.items()
                 if name.startswith("gradcheck_svc") and not name.startswith("gradcheck_svc.server")
                 and name not in ENTRY_POINTS}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders
    assert "gradcheck_svc.server.main" in _edges("gradcheck_svc.cli", known["gradcheck_svc.cli"],
                                                   known)  # the check reads real imports


def test_no_client_module_imports_the_server():
    """The client's in-process modes (gradcheck verify without --server, check(), the torch front end) reach
    the pipeline (gradcheck_svc/request.py) through the shell around it (gradcheck_svc/shell.py), never the
    server package: there is no request module there."""
    known = _modules()
    offenders = {name: sorted(t for t in _edges(name, path, known) if t.startswith("gradcheck_svc.server"))
                 for name, path in known.items() if name.startswith("gradcheck_client")}
    assert not {k: v for k, v in offenders.items() if v}
    assert "gradcheck_svc.shell" in _edges("gradcheck_client.checking", known["gradcheck_client.checking"],
                                             known)  # the check reads real imports
    assert "gradcheck_svc.server.execute" not in known  # the shim is gone: server/worker.py answers the message


def _calls(path: Path) -> set[str]:
    """The functions a module calls or hands on to be called (f(...), x.f(...), bounded_call(f, ...))."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Call):
            for f in (n.func, *n.args):
                out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


# each front end, and the pipeline function it calls (a finite-difference shard prepares the request
# through the pipeline, then differences its share: verify/fd_shards.run_shard), and the module it reaches
# it in: the pipeline itself, or the one shell around it (shell.py: in process, under a time limit)
SHELL, PIPELINE = "gradcheck_svc.shell", "gradcheck_svc.request"
FRONT_ENDS = {
    SHELL: ({"run_request"}, PIPELINE),  # the shell: every in-process front end below goes through it
    "gradcheck_svc.server.worker": ({"run_request"}, PIPELINE),  # the server's (verify_request: the response)
    "gradcheck_svc.batch.verifiers": ({"run_bounded", "verify_request"}, SHELL),  # batch and screen
    "gradcheck_svc.check_call": ({"verifier"}, SHELL),  # check()
    "gradcheck_client.checking": ({"check_with"}, SHELL),  # gradcheck_client.check (in process: shell.in_process)
    "gradcheck_client.cli": ({"run_bounded", "verify_request"}, SHELL),  # gradcheck verify without --server
    "gradcheck_client.torch.check": ({"verifier"}, "gradcheck_client.checking"),  # the torch front end
    # gradcheck-svc verify, its fd shards and their merge
    "gradcheck_svc.cli": ({"run_bounded", "verify_request", "prepare"}, SHELL),
}


def test_every_front_end_reaches_the_one_pipeline_and_only_it_calls_verify():
    known = _modules()
    for name, (wanted, reached) in FRONT_ENDS.items():
        assert wanted <= _calls(known[name]), f"{name} does not call {sorted(wanted - _calls(known[name]))}"
        assert reached in _edges(name, known[name], known), name
    # the verification itself (verify/run.py's verify) is called from the pipeline and nowhere else outside verify/
    callers = sorted(name for name, path in known.items()
                     if not name.startswith("gradcheck_svc.verify") and name != "gradcheck_svc.request"
                     and "gradcheck_svc.verify" in _edges(name, path, known) and "verify" in _calls(path)
                     and _imports_verify_function(path))
    assert callers == [], callers


def _imports_verify_function(path: Path) -> bool:
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("verify") and \
                any(a.name == "verify" for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("verify.run") and \
                any(a.name == "verify" for a in n.names):
            return True
    return False


def test_the_in_process_commands_import_no_grpc(tmp_path):
    """gradcheck-svc verify, and gradcheck verify without a server, verify a graph (and write its JUnit) without
    loading grpc: the request is built by gradcheck_core/request_message.py (protobuf only). Read from
    -X importtime, which the forked child (bounded.py) writes to the same stderr."""
    import os
    import subprocess
    import sys

    seed = str(ROOT / "examples" / "graphs" / "seed.json")
    env = {k: v for k, v in os.environ.items() if k not in ("GRADCHECK_SERVER", "GITHUB_STEP_SUMMARY")}
    for module in ("gradcheck_svc.cli", "gradcheck_client.cli"):
        junit = tmp_path / f"{module}.xml"
        run = subprocess.run([sys.executable, "-X", "importtime", "-m", module, "verify", seed,
                              "--junit", str(junit)], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "<testcase" in junit.read_text()
        imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
        assert "gradcheck_svc.request" in imported  # the pipeline ran, and importtime saw it
        assert not {m for m in imported if m == "grpc" or m.startswith("grpc.")}, module


# test modules share helpers through conftest.py and helper modules, never through each other; the one exception
# reads which ops the torch tests check there (their tables), to check that together they cover the registry
TEST_IMPORTS_OK = {"test_torch_reference": {"test_cnn_ops_torch", "test_onnx_ops_torch"}}


def test_no_test_module_imports_another():
    found = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            names = [n.module or ""] if isinstance(n, ast.ImportFrom) else \
                [a.name for a in n.names] if isinstance(n, ast.Import) else []
            for m in names:
                if m.startswith("test_") and m not in TEST_IMPORTS_OK.get(path.stem, ()):
                    found.setdefault(path.stem, []).append(m)
    assert not found, found
