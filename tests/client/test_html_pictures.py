"""The HTML page's pictures match the verdict (issue 44), on the 769-node chain_256 example, passing and with
a fault: a heatmap only where element values exist (the parameters the joint screen cleared are shown by the
directional agreement that cleared them, green when they pass -- never an element against a directional
value), "the worst" among the affected parameters, the drawing's note counts what is drawn, and the index
lists the failing parameters. Reports from the real client CLI (--json), pages from build_html."""
from __future__ import annotations

import json
import re

import pytest

from gradcheck_core.graphio import load_graph
from gradcheck_core.outputs.html_report import HEATMAP_MAX_PARAMETERS, RunItem, build_html
import forked_cli
from grpc_helpers import EXAMPLES, ROOT, _env

CHAIN = EXAMPLES / "chain_256.json"


def _report(*args) -> dict:
    out = forked_cli.run("gradcheck_client.cli", "verify", CHAIN, "--json", *args, env=_env(), cwd=ROOT, timeout=900)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)[0]["report"]


@pytest.fixture(scope="module")
def pages():
    graph = load_graph(CHAIN)
    passing, faulty = _report(), _report("--fault", "h2:scale:1.01")
    assert passing["verdict"] == "pass" and faulty["verdict"] == "fail"
    return {name: (r, build_html([RunItem(str(CHAIN), graph, r)], layout="dagre"))
            for name, r in (("passing", passing), ("faulty", faulty))}


def _captions(page: str) -> list[str]:
    return re.findall(r"<figcaption class='mono'>([^:<]+):", page)


def test_a_passing_page_draws_no_red_and_shows_joint_rows_by_their_agreement(pages):
    report, page = pages["passing"]
    joint = [p["name"] for p in report["parameters"] if p["fd_checked_by"] == "joint"]
    assert joint, "chain_256 is screened jointly by default"
    assert not set(_captions(page)) & set(joint)  # no element heatmap for a directional check
    assert "fill='#b00020'" not in page and "fill='#5b2a86'" not in page  # no red or purple cell on a pass
    (line,) = re.findall(r"<p class='(\w+) joint'>([^<]*)</p>", page)
    assert line[0] == "ok" and f"{len(joint)} parameters checked jointly" in line[1] and "agree" in line[1]


def test_a_faulty_page_shows_the_affected_first_names_them_in_the_index_and_counts_what_it_draws(pages):
    report, page = pages["faulty"]
    failing = [p["name"] for p in report["parameters"] if p["status"].startswith("FAIL")]
    assert failing
    captions = _captions(page)
    # the affected first: W0-W3 and b0-b2 fill the HEATMAP_MAX_PARAMETERS heatmaps, the worst of them
    k = min(len(failing), HEATMAP_MAX_PARAMETERS)
    assert len(captions) >= k and set(captions[:k]) <= set(failing), (captions, failing)
    if len(failing) > HEATMAP_MAX_PARAMETERS:
        assert "worst of the affected are shown" in page
    index = re.search(r"<nav class='index'>.*?</nav>", page, re.S).group(0)
    assert all(name in index for name in failing)
    data = json.loads(re.search(r"<script type='application/json' id='gradcheck-data'>(.*?)</script>", page,
                                re.S).group(1))
    (view,) = [g["view"] for g in data["graphs"]]
    drawn = re.search(r": (\d+) drawn,", page)
    assert drawn is not None and int(drawn.group(1)) == len(view["nodes"])
