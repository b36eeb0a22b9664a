"""The JSON report is a contract: a handful of bundled examples, each under another finite-difference path
(full, projected, screened jointly, a wrong user derivative, a planted fault, float32), give the report kept
in tests/golden/ (written by tests/report_golden.py before results became composed data; run-dependent
values masked). Keys, their order, strings, booleans and integers must match exactly; floats to 1e-6 of
their scale, so that another CPU's or BLAS's last bits never fail it while a value moved to the wrong key
always does."""
import json
import math

import pytest

from conftest import ROOT
from report_golden import cases, report

GOLDEN = ROOT / "tests" / "golden"
NAMES = sorted(p.stem for p in GOLDEN.glob("*.json"))


def _same(a, b, where="report") -> None:
    assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, f"{where}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), f"{where}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def test_the_golden_cases_cover_every_way_finite_differences_check_a_parameter():
    assert len(NAMES) >= 6
    rows = [p for n in NAMES for p in (json.loads((GOLDEN / f"{n}.json").read_text())["report"] or {})
            .get("parameters", [])]
    assert {p["fd_checked_by"] for p in rows} >= {"full", "projection", "joint"}
    assert any(p["symbolic"] is None for p in rows) and any(p["symbolic"] is not None for p in rows)


@pytest.mark.parametrize("name", NAMES)
def test_json_report_is_the_golden_one(name):
    _same(report(cases()[name]), json.loads((GOLDEN / f"{name}.json").read_text()))
