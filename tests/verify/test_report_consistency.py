"""One verdict, stated once (issue 13): rows, summaries and the verdict never disagree.

Regression tests for the contradictions a new user found: a FAIL row under a PASS verdict
(float32 cancellation), an "ok" row and an agreeing FD-vs-symbolic next to NaN/Inf (log of
zero), milliseconds printed under `_s` keys, and long parameter lists flooding the text.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import EXAMPLES
from gradcheck_core.outputs.markdown import summary_markdown
from gradcheck_core.outputs.outcome import Outcome
from gradcheck_core.report import Report as ClientReport

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.verify import verify
from gradcheck_svc.verify.compare import Tolerance, compare

FAULTS = EXAMPLES / "faults"


def _rows(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith(name + " ")]


def test_float32_cancellation_row_agrees_with_pass_verdict():
    report = verify(load_graph(FAULTS / "float32_cancellation.json"))
    assert report.verdict == "pass"
    (w,) = report.parameters
    assert not w.passed  # the raw comparison fails: float32 rounding ...
    assert w.status == "ok (precision)" and w.explained_by == "precision"  # ... which the verdict tolerates
    text = report.to_text()
    (row,) = _rows(text, "w")
    assert "FAIL" not in row and "ok (precision)" in row
    assert "judged against the symbolic gradient (exact)" in text
    assert "engine vs finite differences" in text  # the header names each column's reference
    d = report.to_dict()["parameters"][0]
    assert d["status"] == "ok (precision)" and d["explained_by"] == "precision"
    # the CI summary says pass and names nothing wrong
    client = ClientReport(report.to_dict())
    assert client.failed_parameters == []
    md = summary_markdown([Outcome("f.json", report=client)])
    assert "✅ pass" in md and "wrong" not in md


def test_log_zero_fails_everywhere():
    report = verify(load_graph(FAULTS / "log_zero.json"))
    assert report.verdict == "fail"
    (p,) = report.parameters
    assert p.status == "FAIL" and p.failed_by == "nonfinite"
    # FD is NaN (the loss is -inf) where the symbolic gradient is 2: they do not agree
    fs = p.symbolic.fd_vs_symbolic
    assert not fs.passed and np.isnan(fs.engine_at_worst) and fs.reference_at_worst == 2.0
    d = report.to_dict()["parameters"][0]
    assert d["fd_vs_symbolic"]["agree"] is False and d["status"] == "FAIL"
    (row,) = _rows(report.to_text(), "p")
    assert "FAIL (nonfinite)" in row and " ok " not in row
    md = summary_markdown([Outcome("l.json", report=ClientReport(report.to_dict()))])
    assert "❌ fail" in md and "`p` wrong (`nonfinite`)" in md


@pytest.mark.parametrize("g, ref", [
    ([np.nan], [1.0]), ([np.inf], [1.0]), ([1.0], [np.nan]), ([-np.inf], [np.inf]),
])
def test_nonfinite_against_anything_else_fails(g, ref):
    assert not compare(np.array(g), np.array(ref), Tolerance.for_dtype("float64")).passed
    # an infinite allowance (an FD noise estimate of an infinite loss) excuses nothing
    assert not compare(np.array(g), np.array(ref), Tolerance.for_dtype("float64"), noise=np.inf).passed


def test_the_same_nonfinite_value_agrees():
    c = compare(np.array([np.inf, np.nan, 1.0]), np.array([np.inf, np.nan, 1.0]), Tolerance.for_dtype("float64"))
    assert c.passed and c.max_abs_error == 0.0


def test_timings_text_is_in_seconds():
    report = verify(load_graph(EXAMPLES / "seed.json"))
    timings = report.to_dict()["timings"]
    (line,) = [x for x in report.to_text().splitlines() if "timings:" in x]
    assert " ms" not in line and line.rstrip().endswith("(seconds)")
    shown = dict(part.split() for part in line.split("timings:")[1].replace("(seconds)", "").split(","))
    assert set(shown) == set(timings) and all(k.endswith("_s") for k in shown)
    for key, seconds in timings.items():  # the JSON's seconds, to 3 significant digits
        assert float(shown[key]) == pytest.approx(seconds, rel=0.01, abs=1e-6)


def test_long_parameter_lists_are_summarized_in_text_not_in_json():
    b = GraphBuilder("many")
    terms = [b.node("square", b.input(f"p{i}", [0.1 * i], requires_grad=True)) for i in range(30)]
    total = terms[0]
    for t in terms[1:]:
        total = b.node("add", total, t)
    b.output(b.node("sum", total))
    report = verify(load_graph(b.build()))
    text = report.to_text()
    shown = [line for line in text.splitlines() if line.strip().startswith("p") and "[1]" in line]
    assert len(shown) == 20
    assert "... 10 more parameters (10 ok)" in text
    assert len(report.to_dict()["parameters"]) == 30


def test_memory_timelines_only_when_asked_and_in_the_json():
    from gradcheck_svc.verify.options import VerifyOptions

    graph = load_graph(EXAMPLES / "seed.json")
    assert verify(graph).to_dict()["memory_timelines"] == []
    timelines = verify(graph, VerifyOptions(memory_timeline=True)).to_dict()["memory_timelines"]
    assert [t["run"] for t in timelines][:2] == ["none", "inference"]
    for t in timelines:
        assert len(t["steps"]) == len(t["live_bytes"]) > 0 and all(b >= 0 for b in t["live_bytes"])
