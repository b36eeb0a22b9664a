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


# the values that belong to the element a worst_index names
AT_WORST = ("engine_at_worst", "reference_at_worst", "symbolic_at_worst", "fd_at_worst", "fd_error_at_worst")


def _close(a, b) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def _worst_element_moved(a: dict, b: dict, where: str, shape) -> bool:
    """Two elements whose errors are equal within rounding may trade places as "the worst" on another CPU
    or BLAS (seen on an AMD EPYC: cnn's conv.weight, errors of 1-2 float32 ulps). The contract there is the
    worst error, not which element has it: accept a moved index when the worst errors agree and our
    report is consistent with itself at its own index (its values there are the error it reports, and its
    reference there is the golden reference's value at that element)."""
    if "worst_index" not in a or a["worst_index"] == b["worst_index"]:
        return False
    assert len(a["worst_index"]) == len(b["worst_index"]), f"{where}.worst_index: rank {a['worst_index']}"
    assert _close(a["max_abs_error"], b["max_abs_error"]), \
        f"{where}.worst_index: {a['worst_index']} vs {b['worst_index']} with max_abs_error " \
        f"{a['max_abs_error']!r} vs {b['max_abs_error']!r}"
    pair = [a[k] for k in AT_WORST if k in a][:2]
    assert _close(abs(pair[0] - pair[1]), a["max_abs_error"]), f"{where}: values at {a['worst_index']}: {pair}"
    truth = b.get("reference", b.get("gradient"))
    if isinstance(truth, list):
        dims = shape if shape and len(shape) == len(a["worst_index"]) else [len(truth)]
        flat = sum(i * math.prod(dims[d + 1:]) for d, i in enumerate(a["worst_index"]))
        assert _close(pair[1], truth[flat]), f"{where}: reference at {a['worst_index']}: {pair[1]} vs {truth[flat]}"
    return True


def _same(a, b, where="report", shape=None) -> None:
    assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, f"{where}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        shape = a.get("shape", shape)  # a parameter's shape, for the element its nested dicts name
        moved = _worst_element_moved(a, b, where, shape)
        for k in a:
            if not (moved and k in ("worst_index", *AT_WORST)):
                _same(a[k], b[k], f"{where}.{k}", shape)
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]", shape)
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


def _row(index, engine, ref, err):
    return {"shape": [2, 2], "reference": [0.5, 0.25, 0.125, 1.0], "max_abs_error": err, "worst_index": index,
            "engine_at_worst": engine, "reference_at_worst": ref}


def test_a_worst_element_may_move_only_between_errors_equal_within_rounding():
    golden = _row([0, 1], 0.25 + 3e-8, 0.25, 3e-8)
    _same(_row([1, 0], 0.125 + 3e-8, 0.125, 3e-8), golden)  # the other element, the same error: accepted
    with pytest.raises(AssertionError, match="max_abs_error"):
        _same(_row([1, 0], 0.125 + 5e-6, 0.125, 5e-6), golden)  # a larger error elsewhere: a changed report
    with pytest.raises(AssertionError, match="values at"):
        _same(_row([1, 0], 0.5, 0.125, 3e-8), golden)  # its values at that element are not the error it reports
    with pytest.raises(AssertionError, match="reference at"):
        _same(_row([1, 0], 0.75 + 3e-8, 0.75, 3e-8), golden)  # not the golden reference's element
