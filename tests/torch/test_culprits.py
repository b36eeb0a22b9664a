"""gradcheck_client.torch: which report lines name a culprit is decided once (culprits.py), from the report's data:
the GradcheckError's first line and the place of the values screen's line agree, and a user's text that reads
like a culprit's line (a surrogate's reason holding ": FAIL: ") is not taken for one. In process: a report as
the torch check leaves it, text written out here by hand."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gradcheck_client.torch import values  # noqa: E402
from gradcheck_client.torch.drop_in import GradcheckError, _verdict  # noqa: E402
from gradcheck_core.report import Report  # noqa: E402

SURROGATE = ("opaque function Ste (m.py:3): SURROGATE: declared surrogate (ste: FAIL: on purpose), not checked "
             "against the derivative; not checked itself, its outputs ste_out checked as parameters")
SOURCE = "node 'mul_1' was made at m.py:12"
HEADER = "graph f: FAIL  (loss 1, float64, cpu)"
FINDING = "  node 'mul_1' (mul): wrong_vjp — its backward is off [local]"
WRONG = "custom autograd.Function Sq (m.py:20): its backward disagrees with the derivative of its forward: x"


def _report(text: str, **data) -> Report:
    findings = [{"node": "mul_1", "op": "mul", "cause": "wrong_vjp", "severity": "error", "detail": "off"}]
    return Report({"verdict": "fail", "findings": findings, "sources": {"mul_1": "m.py:12"}, **data}, text=text)


def test_a_surrogates_reason_that_reads_like_a_failure_is_not_named_first():
    surrogate = {"kind": "function", "op": "Ste", "module": "", "source": "m.py:3", "verdict": "surrogate",
                 "detail": "declared surrogate (ste: FAIL: on purpose), not checked against the derivative",
                 "parameters": ["ste_out"]}
    report = _report("\n".join([SURROGATE, SOURCE, HEADER, FINDING]), opaque=[surrogate])
    with pytest.raises(GradcheckError) as raised:
        _verdict(lambda x: x, report, None)
    assert str(raised.value).splitlines()[:2] == [SOURCE, SURROGATE]


def test_the_values_line_goes_below_the_culprits_the_error_names_first():
    wrong = {"function": "Sq", "module": "", "source": "m.py:20", "verdict": "fail",
             "detail": "its backward disagrees with the derivative of its forward: x"}
    screen = {"verdict": "fail", "detail": "along 1 of 3 directions", "cuts": []}
    report = _report("\n".join([WRONG, SOURCE, HEADER, FINDING]), custom_functions=[wrong],
                     check={"function_values": screen})
    values.judged(report)
    assert report.text.splitlines()[:4] == [
        WRONG, SOURCE, "the function's values: FAIL: torch's gradient disagrees with the derivative of the "
        "function's values, along 1 of 3 directions", HEADER]
    with pytest.raises(GradcheckError) as raised:
        _verdict(lambda x: x, report, None)
    assert str(raised.value).splitlines()[0] == WRONG
