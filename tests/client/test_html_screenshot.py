"""The HTML page as a reader sees it (issue 44 item 5): `gradcheck-svc verify --html` on the 769-node chain_256
example, passing and with a fault (`--fault h2:scale:1.01`), loaded in headless Chromium (Debian's chromium,
installed here when missing, as tests/browser.py does) and photographed whole. The picture is read where the
DOM says things are (getBoundingClientRect), never against a golden image, so fonts and CPUs do not matter:
every heatmap cell's centre shows its own fill, the passing page has no red or purple in its heatmaps, the
failing page has red in the heatmaps of its failing parameters and on the faulty node's box; the index lists
the failing parameters of the JSON report and the page's counts match what it draws."""
from __future__ import annotations

import base64
import io
import json
import re

import forked_cli
import numpy as np
import pytest
from browser import chromium, open_page
from PIL import Image

from grpc_helpers import EXAMPLES, ROOT, _env

CHAIN = EXAMPLES / "chain_256.json"
FAULT = "h2:scale:1.01"
RED, PURPLE = (0xB0, 0x00, 0x20), (0x5B, 0x2A, 0x86)  # html_report._color: beyond tolerance, non-finite
NEAR = 24  # per channel: a solid fill rendered, whatever the rasterizer


@pytest.fixture(scope="module")
def browser():
    path, why = chromium()
    if path is None:
        pytest.skip(why)  # only where chromium is missing and apt-get cannot install it
    return path


def _verify(out_dir, name: str, *args) -> tuple[dict, object]:
    """The service CLI's JSON report and its --html page, from one run."""
    html = out_dir / f"{name}.html"
    # no per-request limit: a loaded machine must not turn this run into exit 2 (the page, not the time, is tested);
    # the command runs in a fork of this process (tests/forked_cli.py: its main, environment, pipes, exit status)
    r = forked_cli.run("gradcheck_svc.cli", "verify", CHAIN, "--json", "--html", html, "--max-request-seconds",
                       "3600", *args, env=_env(None), cwd=ROOT, timeout=900)
    assert r.returncode == (1 if args else 0), r.stderr[-3000:]
    return json.loads(r.stdout), html


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("pages")
    return {"passing": _verify(out, "passing"), "failing": _verify(out, "failing", "--fault", FAULT)}


class Shot:
    """A whole-page screenshot (CSS pixels: scale 1) with the page's DOM to locate regions in it."""

    def __init__(self, page, png_path):
        page.evaluate("document.querySelectorAll('details.item').forEach(d => d.open = true)")  # a passing graph's
        w, h = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        data = page.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1})["data"]
        png_path.write_bytes(base64.b64decode(data))
        self.page, self.path = page, png_path
        self.rgb = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")).astype(int)
        assert self.rgb.shape[:2] == (h, w), (self.rgb.shape, w, h)

    def boxes(self, selector: str) -> list[dict]:
        """Each match's box in page pixels, its computed fill and its text."""
        return self.page.evaluate(
            f"[...document.querySelectorAll({json.dumps(selector)})].map(e => {{"
            " const r = e.getBoundingClientRect();"
            " return {x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,"
            " fill: getComputedStyle(e).fill, text: e.textContent}; })")

    def region(self, box: dict) -> np.ndarray:
        y0, x0 = int(np.ceil(box["y"])), int(np.ceil(box["x"]))
        return self.rgb[y0:int(box["y"] + box["h"]), x0:int(box["x"] + box["w"])]

    def pixel(self, box: dict) -> np.ndarray:
        return self.rgb[int(box["y"] + box["h"] / 2), int(box["x"] + box["w"] / 2)]


def _count(pixels: np.ndarray, colour) -> int:
    return int((np.abs(pixels - np.array(colour)).max(axis=-1) <= NEAR).sum())


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", css)[:3])


@pytest.fixture(scope="module")
def shots(browser, runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("shots")
    opened, shots = [], {}
    try:
        for name, (_, html) in runs.items():
            page = open_page(browser, html.as_uri())
            opened.append(page)
            assert page.evaluate("document.body.getAttribute('data-ready')") == "1" and page.errors == [], \
                page.errors
            shots[name] = Shot(page, out / f"{name}.png")
        yield shots
    finally:
        for page in opened:
            page.close()


@pytest.mark.parametrize("name", ["passing", "failing"])
def test_the_picture_is_a_page_and_every_heatmap_cell_shows_its_fill(shots, name):
    shot = shots[name]
    white = (shot.rgb >= 250).all(axis=-1).mean()
    colours = np.unique(shot.rgb[::3, ::3] @ np.array([1 << 16, 1 << 8, 1]))
    assert 1 - white > 0.05 and len(colours) > 50, (white, len(colours))  # not blank: text, tables, colours
    (title,) = shot.boxes("h1")
    ink = (shot.region(title).max(axis=-1) < 100).sum()  # dark pixels: the title's letters
    assert title["text"] == f"gradcheck: {CHAIN.stem}" and ink > 100, (title, ink)
    cells = shot.boxes("svg.heatmap rect.cell")
    assert cells, "chain_256's fully checked parameters have element heatmaps"
    for cell in cells:
        got = shot.pixel(cell)
        assert np.abs(got - np.array(_rgb(cell["fill"]))).max() <= NEAR, (name, cell, got.tolist())


def test_the_passing_page_shows_no_red_where_its_heatmaps_are(shots, runs):
    report, _ = runs["passing"]
    assert report["verdict"] == "pass"
    shot = shots["passing"]
    maps = shot.boxes("svg.heatmap")
    assert maps
    for m in maps:
        pixels = shot.region(m)
        assert _count(pixels, RED) == 0 and _count(pixels, PURPLE) == 0, m
        green = (pixels[..., 1] > pixels[..., 0] + 20) & (pixels[..., 1] > pixels[..., 2] + 20)
        assert green.mean() > 0.5, m  # the cells within tolerance, drawn green
    (joint,) = shot.page.evaluate("[...document.querySelectorAll('p.joint')].map(p => p.className)")
    assert joint.split() == ["ok", "joint"]  # the jointly checked parameters: their agreement, as passing
    index = shot.page.evaluate("[...document.querySelectorAll('nav.index tr')].slice(1).map(tr => "
                               "[...tr.cells].map(td => td.textContent))")
    assert [row[0] for row in index] == ["PASS"] and index[0][2] == ""  # no failing parameters


def test_the_failing_page_shows_red_on_the_faulty_node_and_its_failing_parameters(shots, runs):
    report, _ = runs["failing"]
    failing = [p["name"] for p in report["parameters"] if p["status"].startswith(("FAIL", "undecided", "affected"))]
    assert report["verdict"] == "fail" and failing
    first_error = next(f["node"] for f in report["findings"] if f["severity"] == "error")
    shot = shots["failing"]
    index = shot.page.evaluate("[...document.querySelectorAll('nav.index tr')].slice(1).map(tr => "
                               "[...tr.cells].map(td => td.textContent))")
    assert [row[0] for row in index] == ["FAIL"] and index[0][2].split(", ") == failing, (index, failing)
    (node,) = shot.boxes("svg.graph g.node.faulty")
    assert shot.page.evaluate("document.querySelector('g.node.faulty text.name').textContent") == first_error
    assert _count(shot.region(node), RED) > 10, node  # its red outline, in the picture
    figures = shot.page.evaluate(
        "[...document.querySelectorAll('figure')].filter(f => f.querySelector('svg.heatmap')).map(f => {"
        " const r = f.querySelector('svg.heatmap').getBoundingClientRect();"
        " return {name: f.querySelector('figcaption').textContent.split(':')[0], x: r.left + scrollX,"
        " y: r.top + scrollY, w: r.width, h: r.height,"
        " red: f.querySelectorAll(\"rect.cell[fill='#b00020']\").length}; })")
    shown_failing = [f for f in figures if f["name"] in failing]
    assert shown_failing and figures[:len(shown_failing)] == shown_failing  # the failing ones come first
    assert any(f["red"] for f in shown_failing)
    for f in figures:  # red in the picture exactly where the DOM draws red cells, at least a cell's interior each
        red = _count(shot.region(f), RED)
        assert (red >= f["red"] * 8 * 8) and (red > 0) == (f["red"] > 0), f


def test_the_failing_pages_counts_match_what_it_draws(shots, runs):
    report, _ = runs["failing"]
    page = shots["failing"].page
    nodes = page.evaluate("document.querySelectorAll('svg.graph g.node').length")
    note = page.evaluate("[...document.querySelectorAll('p.note')].map(p => p.textContent).join(' | ')")
    drawn = re.search(r": (\d+) drawn,", note)
    assert drawn and int(drawn.group(1)) == nodes > 0, note
    shown = page.evaluate("document.querySelectorAll('svg.heatmap').length")
    left = re.search(r"(\d+) more parameters' heatmaps left out: the (\d+) ", note)
    # the rows with element values: not those judged on the joint screen's directions (cleared, or flagged
    # and judged by the screen alone)
    elementwise = [p for p in report["parameters"] if p.get("fd_checked_by") not in ("joint", "joint, by the screen")]
    if left:
        assert int(left.group(2)) == shown and int(left.group(1)) + shown == len(elementwise), note
    else:
        assert shown == len(elementwise), note
