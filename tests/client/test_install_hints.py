"""Install hints point somewhere real: gradcheck-svc is not published on any package index, so a hint
naming `gradcheck-svc[extra]` would fetch whatever someone registered under that name. Every hint is
extras.install_hint's `pip install '.[<extra>]'`, for an extra pyproject.toml declares."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gradcheck_svc.errors import GraphError
from gradcheck_svc.extras import install_hint

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    kinds = (".py", ".md", ".toml", ".yaml", ".yml", ".txt")
    return [ROOT / n for n in names if n.endswith(kinds) or "Dockerfile" in n]


def test_no_file_names_the_unpublished_package_as_something_to_install():
    pattern = re.compile(r"pip install[^\n`]*gradcheck-svc\[|install gradcheck-svc\[")
    offenders = [str(p.relative_to(ROOT)) for p in _tracked_text_files()
                 if p.exists() and pattern.search(p.read_text(errors="replace"))]
    assert offenders == []


def test_every_extra_a_hint_names_is_declared():
    hinted = set()
    for p in _tracked_text_files():
        if p.exists():
            hinted |= set(re.findall(r"install_hint\(['\"](\w+)['\"]\)", p.read_text(errors="replace")))
            hinted |= set(re.findall(r"pip install '\.\[(\w+)\]'", p.read_text(errors="replace")))
    assert hinted and hinted <= set(EXTRAS), sorted(hinted - set(EXTRAS))


def test_missing_onnx_names_the_checkout_install(monkeypatch):
    from gradcheck_svc import onnx_import

    monkeypatch.setitem(sys.modules, "onnx", None)  # as where the extra is not installed
    with pytest.raises(GraphError) as err:
        onnx_import._require_onnx()
    assert str(err.value).count("\n") == 0
    assert install_hint("onnx") in str(err.value) and "pip install '.[onnx]'" in str(err.value)
