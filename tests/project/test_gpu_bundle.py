"""The GPU run's bundle (issue 38): bench/gpu_bundle.txt brings every distribution the run needs
that the GPU machine (bench/gpu_machine.txt) lacks, with everything those require on Python 3.12;
bench/gpu_env.py reads pyproject's bounds as pip would. Read from this venv's installed metadata."""
from __future__ import annotations

import importlib.metadata as md
import re
import sys

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_env  # noqa: E402

TARGET = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
          "platform_system": "Linux", "implementation_name": "cpython", "platform_machine": "x86_64"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _listed(path) -> set[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {_norm(Requirement(line).name) for line in lines if line}


def _requires(name: str) -> set[str]:
    """What `name` requires on the GPU machine's Python (no extras), from this venv's metadata."""
    try:
        reqs = md.requires(name) or []
    except md.PackageNotFoundError:
        return set()
    env = {**TARGET, "extra": ""}
    return {_norm(r.name) for r in map(Requirement, reqs) if r.marker is None or r.marker.evaluate(env)}


def _closure(names) -> set[str]:
    seen, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(_requires(n))
    return seen


def test_the_bundle_and_the_machine_hold_everything_the_run_requires():
    machine = _closure(_listed(ROOT / "bench" / "gpu_machine.txt"))  # a machine package's own requirements came with it
    bundle = _listed(ROOT / "bench" / "gpu_bundle.txt")
    needed = _closure({_norm(n) for n in gpu_env.requirements() if n not in ("cupy", "torch")} | bundle)
    assert needed - machine - bundle == set(), "add these to bench/gpu_bundle.txt"
    assert bundle & _listed(ROOT / "bench" / "gpu_machine.txt") <= {"protobuf"}  # protobuf: on purpose, see the file


@pytest.mark.parametrize("version,spec,ok", [
    ("7.36.2", ">=7.35.1,<8", True), ("6.33.0", ">=7.35.1,<8", False), ("8.0", ">=7.35.1,<8", False),
    ("2.5.5", ">=1.26", True), ("1.25.2", ">=1.26", False), ("14.2.0", ">=13", True), ("2.11.0+cu130", "", True),
    ("1.85.1", "==1.85.1", True), ("1.85.3", "==1.85.1", False)])
def test_version_bounds_are_read_as_pip_reads_them(version, spec, ok):
    assert gpu_env.satisfies(version, spec) is ok


def test_the_check_asks_for_the_service_dependencies_with_their_bounds():
    reqs = gpu_env.requirements()
    assert reqs["protobuf"] == ">=7.35.1,<8" and reqs["grpcio-status"] == ">=1.85.1" and reqs["cupy"] == ">=13"
    assert "gradcheck-client" not in reqs  # from the working tree (PYTHONPATH), not a wheel
