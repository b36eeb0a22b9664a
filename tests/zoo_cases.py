"""The bug zoo's cases (examples/graphs/faults/manifest.json) and the check `make run` applies to each,
shared by test_bug_zoo and test_strict_backend."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import EXAMPLES, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from run_examples import run_case  # noqa: E402  (the same check `make run` applies)

CASES = json.loads((EXAMPLES / "faults" / "manifest.json").read_text())["cases"]


def case_param(case):
    opts = ",".join(f"{k}={v}" for k, v in case.get("options", {}).items())
    return pytest.param(case, id=f"{case['graph']}[{opts}]")
