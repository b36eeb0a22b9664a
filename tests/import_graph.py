"""The packages' import statements read from the source, for the layer and cycle tests (tests/project):
every `import a.b` and `from a import b`, at module level or inside a function, relative ones resolved
against the module's package."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / "clients" / "python"
PACKAGES = {"gradcheck_svc": ROOT / "gradcheck_svc", "gradcheck_client": CLIENTS / "gradcheck_client",
            "gradcheck_core": CLIENTS / "gradcheck_core"}


def modules(*packages: str) -> dict[str, Path]:
    """Dotted module name -> source file, for the given packages (all three by default)."""
    out = {}
    for package in packages or PACKAGES:
        root = PACKAGES[package]
        for path in root.rglob("*.py"):
            parts = (package, *path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


_READ: dict[tuple, tuple] = {}  # (name, path, mtime, size) -> its imports: each file parsed once per process


def imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported dotted name, at module level?) for every import statement of the module `name`; `from a
    import b` gives both `a` and `a.b` (b may be a module). The layer and cycle tests read every module several
    times: a file is parsed again only when it changed."""
    stat = path.stat()
    key = (name, path, stat.st_mtime_ns, stat.st_size)
    if key not in _READ:
        _READ[key] = tuple(_read_imports(name, path))
    return list(_READ[key])


def _read_imports(name: str, path: Path) -> list[tuple[str, bool]]:
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


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
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
