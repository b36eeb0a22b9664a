"""`--html` (issue 13 item 5): one self-contained page per run, checked in headless Chromium
(Debian's chromium, installed here when missing): it loads without console errors, the faulty
node is drawn with the error class and its path to the loss highlighted, hovering shows op,
shape, fingerprint status and local error, and a screenshot is written. Both layouts: Graphviz
`dot` (installed when missing) and dagre embedded in the page. Hostile names stay text."""
from __future__ import annotations

import json

import forked_cli
import pytest
from browser import chromium, ensure_apt, open_page
from gradcheck_client import Tracer
from gradcheck_core.graphio import load_graph, save_graph
from gradcheck_core.outputs.html_report import RunItem, build_html
from gradcheck_core.outputs.mermaid import neighbourhood_mermaid
from grpc_helpers import ROOT, _env

FAULTS = ROOT / "examples" / "graphs" / "faults"
HOSTILE = 'x</script><img src=x onerror="window.__pwned=1">\x1b[31m\u202e"'


@pytest.fixture(scope="module")
def browser():
    path, why = chromium()
    if path is None:
        pytest.skip(why)
    return path


def _run(module: str, *args):
    """The command in a fork of this process (tests/forked_cli.py: its main, environment, pipes, exit status)."""
    return forked_cli.run(module, *args, env=_env(None), cwd=ROOT, timeout=180)


def _hover(page, selector: str) -> str:
    page.evaluate(f"document.querySelector({json.dumps(selector)}).dispatchEvent("
                  "new MouseEvent('mouseenter', {clientX: 10, clientY: 10}))")
    return page.evaluate("document.getElementById('gradcheck-tip').hidden ? '' : "
                         "document.getElementById('gradcheck-tip').innerText")


def _load(browser, html_file, tmp_path, shot: str):
    page = open_page(browser, html_file.as_uri())
    try:
        assert page.evaluate("document.body.getAttribute('data-ready')") == "1"
        png = page.screenshot(tmp_path / shot)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        return page
    except BaseException:
        page.close()
        raise


def test_service_html_draws_the_faulty_node_with_dot(browser, tmp_path):
    if ensure_apt("dot", "graphviz") is None:
        pytest.skip("Graphviz could not be installed here (the dagre test covers the page)")
    out = tmp_path / "report.html"
    r = _run("gradcheck_svc.cli", "verify", FAULTS / "cached_activations.json", "--fault", "t:overwrite:999",
             "--html", out)
    assert r.returncode == 1, r.stderr
    page = _load(browser, out, tmp_path, "service.png")
    try:
        assert page.evaluate("document.getElementById('graph-0').getAttribute('data-drawn')") == "dot"
        faulty = page.evaluate("[...document.querySelectorAll('g.node.faulty')].map(g => "
                               "[g.getAttribute('class'), g.querySelector('text.name').textContent])")
        assert len(faulty) == 1
        classes, name = faulty[0]
        assert name == "sq" and {"error", "faulty", "on-path"} <= set(classes.split())
        path = page.evaluate("[...document.querySelectorAll('g.node.on-path')].map(g => "
                             "g.querySelector('text.name').textContent)")
        assert path[0] == "sq" and path[-1] == "L" or set(path) >= {"sq", "L"}
        assert page.evaluate("document.querySelectorAll('path.edge.on-path').length") == len(path) - 1
        tip = _hover(page, "g.node.faulty")
        assert "op: square" in tip and "shape: [" in tip
        assert "fingerprint: CHANGED between forward and backward (cache_corruption)" in tip
        assert "local error: engine 999" in tip
        assert "fingerprint: no change detected" in _hover(page, "g.node.ok")
        # heatmaps, findings, the memory timeline
        assert page.evaluate("document.querySelectorAll('svg.heatmap').length") == 2
        assert "cache_corruption" in page.evaluate("document.querySelector('table.findings').innerText")
        assert page.evaluate("document.querySelectorAll('svg.timeline polyline').length") >= 2
        assert page.errors == []
    finally:
        page.close()


def test_ci_html_with_dagre_layout_many_graphs_and_no_console_errors(browser, tmp_path):
    d = tmp_path / "graphs"
    d.mkdir()
    for name in ("log_zero.json", "float32_cancellation.json"):
        (d / name).write_bytes((FAULTS / name).read_bytes())
    (d / "broken.json").write_text('{"nodes": 7}')
    items = []
    for f in sorted(d.iterdir()):
        if f.name == "broken.json":
            items.append(RunItem(str(f), None, None, "not a valid gradcheck.v1.Graph"))
            continue
        out = _run("gradcheck_client.cli", "verify", f, "--json")
        items.append(RunItem(str(f), load_graph(f), json.loads(out.stdout)[0]["report"]))
    page_file = tmp_path / "dagre.html"
    page_file.write_text(build_html(items, layout="dagre"))
    page = _load(browser, page_file, tmp_path, "dagre.png")
    try:
        assert page.evaluate("[...document.querySelectorAll('.graph-host')].map(h => h.getAttribute('data-drawn'))") \
            == ["dagre", "dagre"]
        assert page.evaluate("document.querySelectorAll('g.node.error.faulty').length") == 1  # log_zero's logp
        assert page.evaluate("document.querySelector('g.node.faulty text.name').textContent") == "logp"
        assert "local error: engine" in _hover(page, "g.node.faulty")
        assert "not a valid gradcheck.v1.Graph" in page.evaluate("document.body.innerText")
        assert page.errors == []
    finally:
        page.close()


def test_ci_command_writes_the_html_page(browser, tmp_path):
    out = tmp_path / "ci.html"
    r = _run("gradcheck_client.cli", "verify", FAULTS / "log_zero.json", ROOT / "examples" / "graphs" / "seed.json",
             "--html", out)
    assert r.returncode == 1, r.stderr
    page = _load(browser, out, tmp_path, "ci.png")
    try:
        assert page.evaluate("document.querySelectorAll('svg.graph').length") == 2
        assert page.evaluate("document.querySelectorAll('g.node.faulty').length") == 1
        # --html asks the verifier for the memory timeline: one line per run, both graphs
        assert page.evaluate("[...document.querySelectorAll('svg.timeline')].map(s => "
                             "s.querySelectorAll('polyline').length)") == [3, 3]
        assert page.errors == []
    finally:
        page.close()


def _hostile_graph():
    t = Tracer(HOSTILE)
    w = t.param("w" + HOSTILE, [0.5, 0.0, 2.0])
    loss = (t.apply("log", w, name="log" + HOSTILE) * 2.0).sum()
    return t.graph(loss)


def test_hostile_names_stay_text_in_the_page(browser, tmp_path):
    f = tmp_path / "hostile.json"
    save_graph(_hostile_graph(), f)
    out = tmp_path / "hostile.html"
    r = _run("gradcheck_client.cli", "verify", f, "--html", out)
    assert r.returncode == 1, r.stderr
    text = out.read_text()
    assert "<img" not in text and "\x1b" not in text and "\u202e" not in text
    page = _load(browser, out, tmp_path, "hostile.png")
    try:
        assert page.evaluate("window.__pwned === undefined")
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        names = page.evaluate("[...document.querySelectorAll('g.node text.name')].map(t => t.textContent)")
        assert any(n.startswith('logx</script><img src=x onerror="window.__pwned=1">\\x1b') for n in names), names
        assert page.evaluate("document.querySelector('g.node.faulty text.name').textContent").startswith("logx<")
        assert page.errors == []
    finally:
        page.close()


def test_mermaid_neighbourhood_in_the_summary_is_escaped():
    from gradcheck_svc.graph import validate
    from gradcheck_svc.verify import verify

    graph = _hostile_graph()
    report = verify(validate(graph)).to_dict()
    diagram = neighbourhood_mermaid(graph, report)
    assert diagram.startswith("```mermaid\nflowchart TD") and diagram.endswith("```")
    import re

    labels = re.findall(r'^  m\d+\["(.*)"\]$', diagram, flags=re.M)
    assert len(labels) == 4  # w (what log reads), log (faulty), mul (its reader), sum (the loss)
    for label in labels:  # nothing but letters, digits, space, _ . and entity codes
        assert re.fullmatch(r"[A-Za-z0-9 _.#;]*", label.replace("<br/>", "")), label
    faulty = next(line.split("[")[0].strip() for line in diagram.splitlines() if "logx#60;#47;script#62;" in line
                  and "<br/>log" in line)
    assert f"class {faulty} error" in diagram
    assert diagram.count("```") == 2  # a name cannot close the fence
    ok = verify(validate(load_graph(ROOT / "examples" / "graphs" / "seed.json"))).to_dict()
    assert neighbourhood_mermaid(load_graph(ROOT / "examples" / "graphs" / "seed.json"), ok) is None
