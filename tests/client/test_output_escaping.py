"""Every output format escapes for its own syntax (issue 21 item 5): a corpus of hostile names (a graph
author's node names, graph names and file names) goes through the CI command's Markdown summary (and
$GITHUB_STEP_SUMMARY), its Mermaid diagrams, HTML page, JUnit XML and terminal text, the SVG plot and
batch-merge's summary.md. Each is read the way its consumer reads it — the Markdown rendered by GitHub's
own cmark-gfm, the HTML and XML parsed — and nothing active or misleading may survive (no link, image,
tag, comment, autolink, emphasis, raw bidi or control character), while each name stays recognisable."""
from __future__ import annotations

import contextlib
import io
import json
import re
import xml.etree.ElementTree as ET
from html import unescape as html_unescape
from pathlib import Path

import pytest

from grpc_helpers import EXAMPLES
from hostile_outputs import CORPUS, Tags, assert_inert_markdown, gfm, recognisable

from gradcheck_client.cli import Progress
from gradcheck_client.cli import main as ci_main
from gradcheck_core.outputs.markdown import code
from gradcheck_core.outputs.mermaid import label
from gradcheck_core.outputs.text import clip
from gradcheck_svc.cli import main as svc_main
from gradcheck_svc.verify.plot import Series, svg


def _graph(name: str) -> dict:
    """examples' log_zero with the corpus name as its faulty node (log of zero), its parameter and its name."""
    g = json.loads((EXAMPLES / "faults" / "log_zero.json").read_text())
    g["name"] = name
    g["inputs"][0]["name"] = "p" + name
    g["nodes"][0] |= {"name": name, "inputs": ["p" + name]}
    g["nodes"][1]["inputs"][0] = name
    return g


def _file_name(i: int, key: str, name: str) -> str:
    return f"{i:02d}-{key}-" + re.sub(r"[/\x00]", "_", name)[:40] + ".json"


def write_corpus(d: Path, keys=tuple(CORPUS)) -> dict[str, Path]:
    d.mkdir(parents=True)
    paths = {}
    for i, key in enumerate(keys):
        paths[key] = d / _file_name(i, key, CORPUS[key])
        paths[key].write_text(json.dumps(_graph(CORPUS[key])))
    return paths


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    """The CI command in-process over the corpus, with every output asked for."""
    tmp = tmp_path_factory.mktemp("hostile")
    write_corpus(tmp / "graphs")
    out = {k: tmp / f for k, f in (("md", "summary.md"), ("step", "step.md"), ("junit", "junit.xml"),
                                    ("html", "page.html"))}
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        mp.setenv("GITHUB_STEP_SUMMARY", str(out["step"]))
        code_ = ci_main(["verify", str(tmp / "graphs"), "--summary-md", str(out["md"]), "--junit", str(out["junit"]),
                         "--html", str(out["html"])])
    assert code_ == 1, stderr.getvalue()  # every graph fails (log of zero), none is refused
    return out, stdout.getvalue(), stderr.getvalue()


def test_markdown_summary_renders_nothing_active(ci_run):
    out, _, _ = ci_run
    md = out["md"].read_text()
    assert out["step"].read_text() == md  # the step summary is the same document
    page = assert_inert_markdown(md, CORPUS.values())
    assert page.tags.count("tr") == len(CORPUS) + 1  # one row per graph: no name split or merged a row
    assert page.tags.count("h4") == len(CORPUS)  # each failing graph's diagram under its own heading
    assert f"{len(CORPUS)} fail" in md


def test_mermaid_diagrams_hold_only_generated_ids_and_coded_labels(ci_run):
    out, _, _ = ci_run
    md = out["md"].read_text()
    blocks = re.findall(r"^```mermaid\n(.*?)^```$", md, flags=re.S | re.M)
    assert len(blocks) == len(CORPUS)
    # (a failing parameter's node may stand, indented, in the "failing parameters" box; an injected
    # fault's source carries a third, coded, label line)
    node = re.compile(r' {2,4}(m\d+)\["([A-Za-z0-9 _.#;]*)<br/>([A-Za-z0-9 _.#;]*)(<br/>[A-Za-z0-9 _.#;]*)?"\]')
    edge = re.compile(r'  m\d+ (-->|==>|-\. "fault" \.->) m\d+|    m\d+|  subgraph failing\["failing parameters"\]|  end')
    style = re.compile(r"  (classDef (error|path|fault|param) [a-z0-9:#,-]+|class m\d+(,m\d+)* (error|path|fault|param))")
    labels = set()
    for block in blocks:
        lines = block.splitlines()
        assert lines[0] == "flowchart TD"
        for line in lines[1:]:
            m = node.fullmatch(line)
            assert m or edge.fullmatch(line) or style.fullmatch(line), line
            if m:
                labels.add(re.sub(r"#(\d+);", lambda e: chr(int(e.group(1))), m.group(2)))
    for name in CORPUS.values():  # the faulty node's label is the name, as every other output shows it
        assert clip(name, 60) in labels, name


def test_html_page_carries_names_as_text_only(ci_run):
    out, _, _ = ci_run
    html = out["html"].read_text()
    page = Tags(html)
    assert not page.comments
    own = {("link", "href", "data:,")}  # the page's own attributes that could carry something active
    assert not [a for a in page.attrs if (a[1].startswith("on") or a[1] in ("href", "src", "style")) and a not in own
                and not (a[1] == "style" and re.fullmatch(r"border-color:#[0-9a-f]{6}", a[2]))
                and not (a[:2] == ("a", "href") and re.fullmatch(r"#item-\d+", a[2]))]  # the index's own anchors
    assert set(page.tags) <= {"html", "head", "meta", "link", "title", "style", "body", "h1", "h2", "h3", "h4", "p",
                              "strong", "span", "section", "div", "table", "tr", "th", "td", "figure", "a", "nav", "details", "summary",
                              "figcaption", "svg", "rect", "g", "text", "line", "polyline", "script"}
    assert html.count("<script") == html.count("</script>") == page.tags.count("script")
    assert page.tags.count("script") <= 3  # the data, the page script and (without dot) dagre: none injected
    text = "".join(page.text)
    assert all(c.isprintable() or c in "\n\t" for c in text)
    for name in CORPUS.values():
        assert recognisable(name) in text, name
    data = json.loads(re.search(r"<script type='application/json' id='gradcheck-data'>(.*?)</script>", html,
                                flags=re.S).group(1))
    drawn = {n["name"] for g in data["graphs"] for n in g["view"]["nodes"]}
    assert all(clip(name, 60) in drawn for name in CORPUS.values())


def test_junit_is_well_formed_and_clean(ci_run):
    out, _, _ = ci_run
    root = ET.parse(out["junit"]).getroot()  # well-formed despite NUL, lone surrogates and "]]>" in names
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(CORPUS) and root.get("failures") == str(len(CORPUS))
    values = [v for e in root.iter() for v in e.attrib.values()] + [e.text or "" for e in root.iter()]
    assert all(c.isprintable() or c == "\n" for v in values for c in v)
    nodes = {p.get("value") for p in root.iter("property") if p.get("name") == "node"}
    for name in CORPUS.values():
        assert any(recognisable(name) in v for v in nodes), name
        assert any(recognisable(name) in (c.find("failure").text or "") for c in cases), name


def assert_terminal_text(text: str, names) -> None:
    for line in text.splitlines():
        assert line.isprintable(), repr(line)  # no ESC, CR, bidi override, line separator...
    assert not any(line.startswith("Traceback") for line in text.splitlines())
    for name in names:
        assert recognisable(name, 12) in text, name


def test_terminal_text_is_one_escaped_line_per_line(ci_run):
    _, stdout, stderr = ci_run
    assert_terminal_text(stdout + stderr, CORPUS.values())


def test_progress_on_a_terminal_escapes_paths(tmp_path):
    """The progress line (stderr a terminal) shows each path escaped: a file name cannot clear the screen."""
    paths = [tmp_path / "\x1b[2J.json", tmp_path / "\u202eevil.json", tmp_path / "a\u2028b.json"]
    stream = _Terminal()
    progress = Progress(len(paths), stream=stream)
    for p in paths:
        progress.phase(str(p), "engine")
        progress.step(str(p))
    shown = stream.getvalue()
    assert "\\x1b[2J" in shown and "\\u202e" in shown and "\\u2028" in shown  # shown, as escapes
    assert not set(shown) & {"\x1b", "\u202e", "\u2028", "\n", "\x00"}


def test_code_span_round_trips_every_name():
    """What GitHub shows inside the code span is exactly the clipped name, in a table cell and outside one."""
    extras = ["", " ", "  x  ", "`", "``", "a`", "`a", " `a` ", "|", "\\", "\\|", "a\\", "*a*", "<b>"]
    for name in [*CORPUS.values(), *extras]:
        for doc in (f"| h |\n|---|\n| {code(name, 300)} |\n", f"x {code(name, 300, table=False)} y\n"):
            rendered = gfm(doc)
            spans = re.findall(r"<code>(.*?)</code>", rendered, flags=re.S)
            assert len(spans) == 1 and "<" not in spans[0], (name, rendered)
            assert html_unescape(spans[0]) == (clip(name, 300) or " "), (name, rendered)


def test_mermaid_label_is_alphanumerics_and_entity_codes_only():
    for name in CORPUS.values():
        assert re.fullmatch(r"[A-Za-z0-9 _.#;]*", label(name))
        assert re.sub(r"#(\d+);", lambda e: chr(int(e.group(1))), label(name)) == clip(name, 60)


def test_svg_plot_escapes_titles_and_labels():
    names = list(CORPUS.values())
    names[5] += "\ud800"  # a lone surrogate: XML cannot hold it
    doc = svg([Series(label=n, x=[1.0, 2.0], y=[1.0, 4.0]) for n in names[:6]], title=names[6], xlabel=names[7],
              ylabel=names[8])
    root = ET.fromstring(doc)  # well-formed
    assert {e.tag.rsplit("}", 1)[-1] for e in root.iter()} <= {"svg", "rect", "text", "line", "polyline", "g",
                                                                 "path", "circle", "title"}
    assert not [k for e in root.iter() for k in e.attrib if k.startswith("on") or "href" in k]
    text = "".join(root.itertext())
    assert all(c.isprintable() or c == "\n" for c in text)
    for n in names[:9]:
        assert recognisable(n, 16) in text, n


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_svc(*argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code_ = svc_main([str(a) for a in argv])
    return code_, err.getvalue()


def test_batch_merge_summary_is_inert(tmp_path):
    keys = ("link", "comment", "html", "backticks", "autolink", "bidi", "table", "terminal")
    paths = write_corpus(tmp_path / "graphs", keys)
    out = tmp_path / "out"
    code_, err = _run_svc("batch", "--manifest", tmp_path / "graphs", "--shard-index", 0, "--out", out)
    assert code_ == 0, err
    assert_terminal_text(err, [paths[k].name for k in keys])  # the per-graph progress lines
    records = list((out / "runs" / "default" / "shard-0000" / "results").glob("*.json"))
    lost = next(r for r in records if json.loads(r.read_text())["graph"] == paths["comment"].name)
    lost.unlink()  # a missing graph: its name goes into the "Incomplete" line too
    code_, err = _run_svc("batch-merge", out)
    assert code_ == 4, err
    assert_terminal_text(err, [paths["comment"].name])  # "1 graph result(s) missing: <name> (shard 0)"
    md = (out / "runs" / "default" / "summary.md").read_text()
    assert "**Incomplete:**" in md
    names = [paths[k].name for k in keys]
    page = assert_inert_markdown(md, names)
    assert page.tags.count("tr") == len(keys) + 1


def test_screen_merge_names_hostile_nodes_inertly(tmp_path):
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "seed.json").write_text((EXAMPLES / "seed.json").read_text())
    out = tmp_path / "out"
    nodes = ("[✅ healthy](https://evil.example)", "<!-- hidden node")
    for node, fault in zip(nodes, ([], ["--fault", "a:bitflip"])):
        code_, err = _run_svc("screen", "--out", out, "--examples", examples, "--generated", 0, "--node-name",
                              node, *fault)
        assert code_ == 0, err
    code_, err = _run_svc("batch-merge", out, "--allow-mixed")  # the fault is an option of its own
    assert code_ == 1, err
    assert_terminal_text(err, nodes[1:])  # "nodes that disagree: <node>"
    md = (out / "runs" / "default" / "summary.md").read_text()
    page = assert_inert_markdown(md, nodes)
    assert "Disagreeing nodes" in "".join(page.text)


def test_a_verdict_this_client_does_not_know_is_shown_inert():
    """A newer server's or a damaged record's verdict is a string like any other: shown in code, no crash."""
    from gradcheck_core.outputs.markdown import summary_markdown
    from gradcheck_core.outputs.outcome import Outcome
    from gradcheck_core.report import Report

    verdict = CORPUS["link"]
    md = summary_markdown([Outcome("g.json", report=Report({"verdict": verdict}))])
    page = assert_inert_markdown(md, [verdict])
    assert page.tags.count("code") == 2  # the path and the verdict
