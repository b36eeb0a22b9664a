"""bench/gpu_check.sh's first step: are the distributions and imports the run needs here, at
versions the project accepts? One line per distribution (version, and where it was loaded from:
the bundle's target folder or the machine), then exit 0; or one line naming everything missing
or out of range, on stderr, and exit 2 -- within seconds, before any test or benchmark starts.

The bounds are pyproject.toml's (the service's dependencies; `cupy` from the gpu extra, `pytest`
from the test extra); torch is the machine's own build (any version: it is the reference).

    PYTHONPATH=.:clients/python python bench/gpu_env.py
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# imported by the run (tests, benchmark, the server's modules the tests load): a missing one is named here,
# not discovered as a collection error halfway through the GPU's minutes
IMPORTS = ("numpy", "sympy", "mpmath", "google.protobuf", "gradcheck.v1.graph_pb2", "gradcheck.v1.service_pb2_grpc",
           "grpc", "grpc_health.v1.health", "grpc_reflection.v1alpha.reflection", "grpc_status.rpc_status",
           "google.rpc.error_details_pb2", "prometheus_client", "pytest", "torch", "cupy",
           "cupyx.scipy.special",  # backend.erf and scatter_add on the GPU import cupyx lazily
           "gradcheck_svc.server.servicer", "gradcheck_svc.verify")


def requirements() -> dict[str, str]:
    """distribution name -> version specifier, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [d for d in project["dependencies"] if not d.startswith("gradcheck-client")]
    wanted += [d for d in project["optional-dependencies"]["test"] if re.match(r"pytest\b", d)]
    wanted += [re.sub(r"^cupy-cuda\d+x", "cupy", d) for d in project["optional-dependencies"]["gpu"]]
    wanted.append("torch")
    out = {}
    for d in wanted:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", d).groups()
        out[name] = spec.split(";")[0].strip()
    return out


def _version_tuple(v: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", v.split("+")[0])[:3])


def satisfies(version: str, spec: str) -> bool:
    """The >=, <, == bounds of a specifier (all this project's pyproject uses)."""
    for op, bound in re.findall(r"(>=|<=|==|<|>)\s*([0-9][0-9.]*)", spec):
        have, want = _version_tuple(version), _version_tuple(bound)
        n = len(want) if op == "==" else max(len(have), len(want))
        have, want = (have + (0,) * n)[:n], (want + (0,) * n)[:n]
        if not {">=": have >= want, "<=": have <= want, "==": have == want, "<": have < want,
                ">": have > want}[op]:
            return False
    return True


def installed(name: str) -> str | None:
    if name == "cupy":  # whichever CUDA build: cupy-cuda13x on the GPU machine
        names = [d.metadata["Name"] for d in md.distributions()
                 if re.match(r"cupy(-cuda\d+x)?$", d.metadata["Name"] or "")]
        name = names[0] if names else name
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def main() -> int:
    problems = []
    for name, spec in requirements().items():
        version = installed(name)
        if version is None:
            problems.append(f"{name} missing (needs {spec or 'any version'})")
        elif not satisfies(version, spec):
            problems.append(f"{name} {version} (needs {spec})")
        else:
            print(f"  {name:24s} {version:12s} {spec}")
    for module in IMPORTS:
        try:
            m = importlib.import_module(module)
            where = Path(getattr(m, "__file__", "") or "").parent  # the bundle's folder or the machine's
            print(f"  import {module:40s} {where}")
        except Exception as exc:  # ImportError, a protobuf runtime/gencode mismatch (VersionError)...
            problems.append(f"import {module}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if problems:
        print("gpu_check: this environment cannot run the check: " + "; ".join(problems), file=sys.stderr)
        return 2
    print("gpu_env: every distribution and import the run needs is here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
