"""No import cycles in the server or client packages: every import statement (at module level or inside a
function) between their modules, read from the source, forms no cycle. A submodule importing its own package
is no edge: Python imports the package first anyway."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [(ROOT, "gradcheck_svc"), (ROOT / "clients" / "python", "gradcheck_client")]


def _modules() -> dict[str, Path]:
    out = {}
    for root, pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            if "vendor" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, known) -> set[str]:
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            if n.level:
                parts = base.split(".")
                mod = ".".join(parts[:len(parts) - (n.level - 1)] + ([n.module] if n.module else []))
            targets = [mod] + [f"{mod}.{a.name}" for a in n.names]
        elif isinstance(n, ast.Import):
            targets = [a.name for a in n.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name and not name.startswith(t + ".")}
    return out


def _cycle(graph) -> list | None:
    """One cycle of the import graph (iterative depth-first search), or None."""
    state = {}
    for start in graph:
        if start in state:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        state[start], path = 1, [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_no_import_cycles():
    known = _modules()
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    assert graph["gradcheck_client.tracer"] >= {"gradcheck_client.indexing"}  # the graph is really read
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
