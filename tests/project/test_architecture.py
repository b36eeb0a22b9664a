"""The layers (ARCHITECTURE.md), read from the source: gradcheck_core is below both gradcheck_svc and
gradcheck_client; the service imports nothing from the client; the client reaches the service only inside
the functions of its in-process entry points, never at module level; and the service's subpackages and
top-level modules form no cycle (verify -> batch -> request -> verify was one; batch <-> server another).

Every import statement counts, at module level or inside a function, `import a.b` and `from a import b`
alike; a name under a TYPE_CHECKING guard counts too (a cycle for the type checker is still a cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "clients" / "python"
PACKAGES = {"gradcheck_svc": ROOT / "gradcheck_svc", "gradcheck_client": CLIENTS / "gradcheck_client",
            "gradcheck_core": CLIENTS / "gradcheck_core"}


def _modules(package: str) -> dict[str, Path]:
    root = PACKAGES[package]
    out = {}
    for path in root.rglob("*.py"):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported dotted name, at module level?) for every import statement of the module; relative imports
    resolved against the module's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f) if n is not f}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            targets = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            if n.level:
                parts = base.split(".")
                mod = ".".join(parts[:len(parts) - (n.level - 1)] + ([n.module] if n.module else []))
            targets = [mod] + [f"{mod}.{a.name}" for a in n.names]
        else:
            continue
        out += [(t, id(n) not in nested) for t in targets]
    return out


def _in(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def _offenders(importer: str, imported: str, module_level_only: bool = False) -> list[str]:
    return sorted({f"{name} imports {t}" for name, path in _modules(importer).items()
                   for t, top in _imports(name, path) if _in(t, imported) and (top or not module_level_only)})


def test_the_service_imports_nothing_from_the_client():
    assert _offenders("gradcheck_svc", "gradcheck_client") == []
    assert _offenders("gradcheck_svc", "gradcheck_core")  # the check reads real imports: the service uses the core


def test_the_core_imports_neither_the_service_nor_the_client():
    assert _offenders("gradcheck_core", "gradcheck_svc") == []
    assert _offenders("gradcheck_core", "gradcheck_client") == []


def test_the_client_reaches_the_service_only_inside_functions():
    assert _offenders("gradcheck_client", "gradcheck_svc", module_level_only=True) == []
    assert _offenders("gradcheck_client", "gradcheck_svc")  # its in-process entry points do, inside functions


def _layer(name: str) -> str:
    """gradcheck_svc.verify.run -> verify; gradcheck_svc.cli -> cli; gradcheck_svc -> '' (the package itself)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _service_graph() -> dict[str, set[str]]:
    """The service's subpackages and top-level modules, an edge for each import between two of them."""
    known = _modules("gradcheck_svc")
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        src = _layer(name)
        graph.setdefault(src, set())
        for t, _ in _imports(name, path):
            if t in known and _layer(t) not in ("", src):
                graph[src].add(_layer(t))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (iterative depth-first search), or None."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if start in state:
            continue
        state[start], path, stack = 1, [start], [iter(sorted(graph[start]))]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph.get(child, ()))))
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_cycle_between_the_services_subpackages():
    graph = _service_graph()
    assert {"verify", "engine"} <= graph["request"] | graph["verify"]  # the graph is really read
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)
