"""Issue 34 item 6: a parameter row has one status, whichever report shows it. For every example graph
(examples/graphs, the bug zoo's cases with their options, and the ONNX CNN whose scaled ReLU output left
two rows "affected"), the text table's status cell, the JSON report's `status` and the HTML page's
status cell are the same word (the text adds the naming finding's cause in parentheses)."""
from __future__ import annotations

import html
import json
import re

import pytest

from gradcheck_core.outputs.html_report import MAX_PARAMETER_ROWS, RunItem, build_html
from gradcheck_svc.engine import parse_fault
from gradcheck_svc.errors import GradcheckError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.verify import VerifyOptions, verify

from conftest import EXAMPLES, ROOT

# (graph, options, the error the bug zoo expects instead of a report, or None)
CASES = [pytest.param(EXAMPLES / p.name, {}, None, id=p.name) for p in sorted(EXAMPLES.glob("*.json"))]
for _c in json.loads((EXAMPLES / "faults" / "manifest.json").read_text())["cases"]:
    _opts = ",".join(f"{k}={v}" for k, v in _c.get("options", {}).items())
    CASES.append(pytest.param(EXAMPLES / "faults" / _c["graph"], _c.get("options", {}), _c["expect"].get("error"),
                              id=f"{_c['graph']}[{_opts}]"))
CASES.append(pytest.param(ROOT / "examples" / "onnx" / "cnn.onnx", {"faults": ["/Relu_output_0:scale:2"]}, None,
                          id="cnn.onnx[scaled relu output]"))


def _graph(path):
    if path.suffix == ".onnx":
        pytest.importorskip("onnx", reason="the optional 'onnx' extra is not installed (pip install '.[onnx]')")
        from gradcheck_svc.onnx_import import import_onnx

        return load_graph(import_onnx(path))
    return load_graph(path)


def _text_cells(text: str) -> dict:
    """parameter -> the status cell of the text table (the column under the header's 'status')."""
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("parameter ") and " status " in ln)
    column = lines[at].index(" status ") + 1
    cells = {}
    for ln in lines[at + 1:]:
        if not ln.startswith("  ") or ln.strip().startswith(("...", "memory", "names in")) or len(ln) <= column:
            break
        m = re.match(r"(?P<cell>.+?)\s+(?:index|direction|joint direction) ", ln[column:])
        cells[ln.split()[0]] = m.group("cell").strip() if m else ln[column:].strip()
    return cells


def _html_cells(page: str) -> dict:
    rows = re.findall(r"<tr><td class='mono'>([^<]*)</td><td>[^<]*</td><td>([^<]*)</td>", page)
    return {html.unescape(name): html.unescape(status) for name, status in rows}


@pytest.mark.parametrize("path, options, error", CASES)
def test_text_json_and_html_give_each_row_the_same_status(path, options, error):
    opts = dict(options)
    opts["faults"] = tuple(parse_fault(f) for f in opts.get("faults", ()))
    if error is not None:  # refused, as the bug zoo expects: no rows to compare
        with pytest.raises(GradcheckError, match=re.escape(error)):
            verify(_graph(path), VerifyOptions(**opts))
        return
    report = verify(_graph(path), VerifyOptions(**opts))
    data = json.loads(report.to_json())
    text = _text_cells(report.to_text())
    page = _html_cells(build_html([RunItem(path.name, None, data)]))
    assert text and page
    # the page lists the first MAX_PARAMETER_ROWS rows (the rest counted), the text the worst TEXT_ROWS
    assert len(page) == min(len(data["parameters"]), MAX_PARAMETER_ROWS)
    for row in data["parameters"]:
        name, status = row["name"], row["status"]
        if name in page:
            assert page[name] == status, (name, page[name], status)
        if name in text:  # long tables show the worst rows only
            cause = f" ({row['failed_by']})" if row["failed_by"] else ""
            assert text[name] == status + cause, (name, text[name], status)
    assert set(text) <= {r["name"] for r in data["parameters"]}


def test_the_scaled_relu_rows_read_affected_everywhere():
    """The issue's case: gradients matched to 1e-7, the rows 'affected' by the corrupted saved output, never
    'FAIL' in the text while JSON and HTML say 'affected'."""
    pytest.importorskip("onnx", reason="the optional 'onnx' extra is not installed (pip install '.[onnx]')")
    from gradcheck_svc.onnx_import import import_onnx

    report = verify(load_graph(import_onnx(ROOT / "examples" / "onnx" / "cnn.onnx")),
                    VerifyOptions(faults=(parse_fault("/Relu_output_0:scale:2"),)))
    assert report.verdict == "fail"
    data = json.loads(report.to_json())
    affected = [r["name"] for r in data["parameters"] if r["status"] == "affected"]
    assert affected == ["conv.weight", "conv.bias"]
    text = _text_cells(report.to_text())
    assert [text[n] for n in affected] == ["affected (cache_corruption)"] * 2
    assert "FAIL" not in "".join(text.values())
