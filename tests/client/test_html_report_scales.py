"""The HTML page scales and leads with what failed (issue 27 item 1): an index with failures first,
passing graphs collapsed, heatmaps of the worst parameters only and in blocks past a cell budget, the
injected fault and the engine-vs-reference value at the worst element, rounded numbers; and a long
chain's drawing scrolled so that its faulty node is in its box (headless Chromium, dagre layout)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from browser import chromium, open_page
from gradcheck_client import Tracer
from gradcheck_core.graphio import load_graph, save_graph
from gradcheck_core.outputs.html_report import (HEATMAP_MAX_CELLS, HEATMAP_MAX_PARAMETERS, PARAMETER_ROWS, RunItem,
                                                  build_html)
from grpc_helpers import EXAMPLES

from gradcheck_svc.cli import main

SEED = EXAMPLES / "seed.json"


def _report(capsys, *args) -> dict:
    main(["verify", *map(str, args), "--json", "--symbolic", "off"])
    return json.loads(capsys.readouterr().out)


def _wide(path):
    """A graph with many parameters (W and PARAMETER_ROWS + 1 biases), W of 48 x 48 elements (more than the
    heatmap's cell budget)."""
    t = Tracer("wide")
    rng = np.random.default_rng(0)
    x = t.input("x", rng.standard_normal((2, 48)))
    h = t.apply("tanh", x @ t.param("W", 0.2 * rng.standard_normal((48, 48))), name="h")
    for i in range(PARAMETER_ROWS + 1):
        h = h + t.param(f"b{i}", 0.1 * rng.standard_normal(48))
    save_graph(t.graph((h * h).sum()), path)
    return path


def test_the_page_leads_with_failures_and_stays_small(tmp_path, capsys):
    wide = _wide(tmp_path / "wide.json")
    items = [RunItem(str(SEED), load_graph(SEED), _report(capsys, SEED)),
             RunItem(str(wide), load_graph(wide), _report(capsys, wide, "--fault", "h:scale:1.5")),
             RunItem("broken.json", error="not a valid gradcheck.v1.Graph"),
             RunItem("seed-fault", load_graph(SEED), _report(capsys, SEED, "--fault", "z:overwrite:999"))]
    page = build_html(items, layout="dagre")
    index, body = page.split("</nav>", 1)
    # the index: every graph, failures first, each a jump link to its section
    linked = re.findall(r"<a href='#item-(\d+)'>", index)
    assert [int(k) for k in linked] == [1, 2, 3, 0]
    assert "4 graphs: 2 fail, 1 invalid, 1 pass" in index
    sections = re.findall(r"<details id='item-(\d+)' class='item'( open)?>", body)
    assert sections == [("1", " open"), ("2", " open"), ("3", " open"), ("0", "")]  # passing: collapsed
    # the wide graph: the worst parameters' heatmaps only, each within the cell budget, and a note
    wide_section = body.split("<details id='item-1'", 1)[1].split("<details id='item-2'", 1)[0]
    heatmaps = re.findall(r"<svg class='heatmap'.*?</svg>", wide_section)
    # element heatmaps only where element values exist: the rows the joint screen cleared are one line of
    # directional agreement instead (issue 44: an element against a directional value drew them red)
    rows = items[1].report["parameters"]
    elementwise = [p for p in rows if p["fd_checked_by"] != "joint"]
    assert len(heatmaps) == min(HEATMAP_MAX_PARAMETERS, len(elementwise)) >= 1
    assert all(m.count("<rect") <= HEATMAP_MAX_CELLS for m in heatmaps)
    left = len(elementwise) - HEATMAP_MAX_PARAMETERS
    assert (f"{left} more parameters' heatmaps left out" in wide_section) == (left > 0)
    joint = len(rows) - len(elementwise)
    assert (f"{joint} parameters checked jointly" in wide_section) == (joint > 1)
    # the parameter table: the failing W first, the rows past PARAMETER_ROWS collapsed
    table = wide_section.split("class='parameters'", 1)[1]
    assert re.findall(r"<tr><td class='mono'>([^<]+)</td>", table)[0] == "W"
    assert "<details class='more'><summary>2 more parameters</summary>" in table
    assert "3×3 elements per cell" in wide_section  # W: the 1000 values the report lists, 21 x 48, in blocks
    # the fault and the worst element, as the text report says them; rounded numbers
    fault_section = body.split("<details id='item-3'", 1)[1].split("<details id='item-0'", 1)[0]
    assert "fault <span class='mono'>z:overwrite:999</span> (6 → 999), read in the backward of: " in fault_section
    assert "engine 999 vs reference 6 at []" in fault_section
    params = fault_section.split("class='parameters'", 1)[1].split("</table>", 1)[0]
    assert not re.search(r"\d\.\d{6,}", params), params  # no 1.1000622635037871e-10
    assert "finite differences" in params and "finite_differences" not in params


@pytest.fixture(scope="module")
def browser():
    path, why = chromium()
    if path is None:
        pytest.skip(why)
    return path


def test_a_long_chain_shows_its_faulty_node_in_the_box(browser, tmp_path, capsys):
    t = Tracer("chain")
    rng = np.random.default_rng(1)
    h = t.input("x", rng.standard_normal((2, 3)))
    for i in range(48):  # each layer's parameter enters from the side: dagre spreads them wide
        h = t.apply("tanh", h @ t.param(f"W{i}", 0.5 * rng.standard_normal((3, 3))), name=f"h{i}")
    f = tmp_path / "chain.json"
    save_graph(t.graph((h * h).sum()), f)
    report = _report(capsys, f, "--fault", "h40:scale:3", "--fd", "projection")
    assert report["verdict"] == "fail"
    out = tmp_path / "chain.html"
    out.write_text(build_html([RunItem(str(f), load_graph(f), report)], layout="dagre"))
    page = open_page(browser, out.as_uri())
    try:
        assert page.evaluate("document.body.getAttribute('data-ready')") == "1" and page.errors == []
        inside = page.evaluate(
            "(() => { const host = document.querySelector('.graph-host').getBoundingClientRect();"
            " const node = document.querySelector('g.node.faulty').getBoundingClientRect();"
            " return [node.left >= host.left, node.right <= host.right, node.top >= host.top,"
            " node.bottom <= host.bottom, document.querySelector('.graph-host').scrollWidth > host.width]; })()")
        assert inside == [True, True, True, True, True], inside  # wider than its box, yet the fault in view
    finally:
        page.close()
