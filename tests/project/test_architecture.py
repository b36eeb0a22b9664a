"""The layers (ARCHITECTURE.md), read from the source: gradcheck_core is below both gradcheck_svc and
gradcheck_client; the service imports nothing from the client; the client reaches the service only inside
the functions of its in-process entry points, never at module level; and the service's subpackages and
top-level modules form no cycle (verify -> batch -> request -> verify was one; batch <-> server another).

Every import statement counts, at module level or inside a function, `import a.b` and `from a import b`
alike; a name under a TYPE_CHECKING guard counts too (a cycle for the type checker is still a cycle)."""
from __future__ import annotations

from import_graph import cycle as _cycle, imports as _imports, modules as _modules


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


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_cycle_between_the_services_subpackages():
    graph = _service_graph()
    assert {"verify", "engine"} <= graph["request"] | graph["verify"]  # the graph is really read
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)
