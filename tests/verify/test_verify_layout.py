"""verify/ is a one-way pipeline: no module imports one that imports it back, no import is
deferred into a function body to dodge a cycle, and only finite_diff.py takes differences."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "gradcheck_svc"
VERIFY = ROOT / "verify"
# imports a function may defer because they are heavy or optional, never to dodge a cycle
# heavy libraries, imported where used (ARCHITECTURE: pay only for what is asked); mp_eval is
# SymPy and mpmath behind a thin evaluator, needed only by graphs with an expr node
DEFERRED_OK = {"matplotlib", "matplotlib.pyplot", "sympy", "pickle", "resource", "sys",
               "subprocess",  # custom_ops' SymPy simplify child only: ~3 ms of every command otherwise
               "gradcheck_svc.oracles.mp_eval",
               "gradcheck_svc.verify.plot"}  # the SVG writer, for --memory-plot only (~10 ms of every command)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(module imported, inside a function?) for each import in the file, resolved to module names."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, id(node) in in_function
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            base = f"{base}.{node.module}" if node.level and node.module else (base if node.level else node.module)
            for a in node.names:
                candidate = f"{base}.{a.name}"
                exists = (ROOT.parent / (candidate.replace(".", "/") + ".py")).exists() or \
                    (ROOT.parent / candidate.replace(".", "/") / "__init__.py").exists()
                yield (candidate if exists else base), id(node) in in_function


def _graph() -> dict[str, set[str]]:
    files = sorted(VERIFY.rglob("*.py"))
    names = {_module(f) for f in files}
    return {_module(f): {m for m, _ in _imports(f) if m in names} for f in files}


def test_verify_has_no_import_cycle():
    graph = _graph()
    assert "gradcheck_svc.verify.engine_run" in graph and "gradcheck_svc.verify.diagnosis.context" in graph
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, f"import cycle: {' -> '.join(path + [m, n])}"
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_the_diagnosis_sits_below_run_and_above_engine_run():
    graph = _graph()
    run, engine_run = "gradcheck_svc.verify.run", "gradcheck_svc.verify.engine_run"
    assert engine_run in graph[run] and "gradcheck_svc.verify.diagnosis.diagnose" in graph[run]
    assert engine_run in graph["gradcheck_svc.verify.diagnosis.context"]
    assert not any(m.startswith("gradcheck_svc.verify.diagnosis") or m == run for m in graph[engine_run])


def test_no_import_is_deferred_into_a_function_within_verify():
    for f in sorted(VERIFY.rglob("*.py")):
        deferred = [m for m, inside in _imports(f) if inside and m not in DEFERRED_OK]
        assert not deferred, f"{f.relative_to(ROOT)} imports {deferred} inside a function"


def test_only_the_oracle_takes_finite_differences():
    """Central differences divide a difference of losses by 2h; one-sided ones use the 3/4/1
    stencil. Neither appears in verify/: localization and classification call finite_diff."""
    stencil = re.compile(r"/\s*\(2 \*|\b2 \* h\b|-3 \* .*4 \*")
    for f in sorted(VERIFY.rglob("*.py")):
        src = f.read_text()
        assert not stencil.search(src), f"{f.relative_to(ROOT)} takes its own finite differences"
        assert "._losses(" not in src and "standard_normal" not in src, f.relative_to(ROOT)


def test_fd_modes_are_one_list_and_no_result_parses_a_mode_string():
    """The FD modes are data (oracles/fd_modes.FDMode, the oracle's own list) and so is how a row was checked
    (parameter_result: FDMode and Screen): the report's code never compares a mode with a string literal
    nor parses "joint, then X" back (issue 37 item 3)."""
    from gradcheck_svc.oracles.fd_modes import FDMode
    from gradcheck_svc.oracles.finite_diff import MODES

    assert tuple(m.value for m in FDMode) == MODES
    pattern = re.compile(r"""(\.mode|mode_for\([^)]*\)|checked_by)\s*[!=]=\s*["']|startswith\(["']joint""")
    for path in [*VERIFY.rglob("*.py"), ROOT / "request.py"]:
        offending = [line.strip() for line in path.read_text().splitlines() if pattern.search(line)]
        assert not offending, (path.name, offending)


def _calls_and_imports(path: Path) -> tuple[set, set, set]:
    """(functions defined, (module, name) imported, names called) in one file."""
    tree = ast.parse(path.read_text())
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    imported = {(n.module or "", a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    called |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}  # passed on, e.g. to bounded_call
    return defined, imported, called


def test_both_verify_commands_share_the_in_process_setup_and_the_pipeline():
    """`gradcheck-svc verify` and `gradcheck verify` (in process) check their flags with one function
    (in_process.verify_setup), parse with one parser class (options.CommandParser), find their graph files
    with one (scan.graph_paths), read --claimed with one (claims.claimed_flag) and run each request through
    the one shell (shell.run_bounded: the pipeline, request.run_request, in a child under the time limit, a
    limit's flag named by in_process.hinted); neither defines its own copy, and the CI command does not reach
    into the service's CLI (issue 37 item 1, issue 48 item 2)."""
    svc = ROOT / "cli.py"
    client = ROOT.parent / "clients" / "python" / "gradcheck_client" / "cli.py"
    shared = {("in_process", "verify_setup"), ("shell", "run_bounded"), ("options", "CommandParser"),
              ("scan", "graph_paths"), ("claims", "claimed_flag")}
    for path in (svc, client):
        defined, imported, called = _calls_and_imports(path)
        reached = {(m.rsplit(".", 1)[-1], name) for m, name in imported if name in called}
        assert shared <= reached, (path.name, shared - reached)
        assert not defined & {name for _, name in shared}, path.name
        assert not any(isinstance(n, ast.ClassDef) and any(getattr(b, "attr", "") == "ArgumentParser"
                                                            for b in n.bases)
                       for n in ast.walk(ast.parse(path.read_text()))), f"{path.name} defines its own parser"
    assert not {m for m, _ in _calls_and_imports(client)[1] if m == "gradcheck_svc.cli"}
