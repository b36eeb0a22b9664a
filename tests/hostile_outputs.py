"""A hostile-names corpus and the readers of each output format, shared by the output tests: Markdown
rendered as GitHub renders it (cmark-gfm), HTML parsed into tags, attributes, comments and text."""
from __future__ import annotations

from html.parser import HTMLParser

import pytest

from gradcheck_core.outputs.text import escape_controls

cmarkgfm = pytest.importorskip("cmarkgfm", reason="the test extra's cmarkgfm (GitHub's Markdown renderer)")
from cmarkgfm.cmark import Options  # noqa: E402

CORPUS = {
    "link": "[✅ all gradients verified](https://evil.example/ok)",
    "image": "![ok](https://evil.example/pixel.png)",
    "comment": "<!-- everything after this is hidden",
    "html": "<img src=x onerror=alert(1)><b>bold</b><a href='https://evil.example'>x</a>",
    "script": "</script><script>alert(1)</script><style>*{display:none}</style>",
    "backticks": "``` `x` ``",
    "emphasis": "**PASS** _ok_ ~~fail~~",
    "autolink": "www.evil.example https://evil.example mail@evil.example",
    "table": "a | b || c\\|d",
    "entity": "&lt;b&gt; &#x3C;!-- &amp;",
    "bidi": "loss\u202e\u2066deifirev\u2069\u202c\u200f",
    "invisible": "a\u200bb\u3164c\ufeffd\u00ad",
    "terminal": "\x1b[2J\x1b[31mTraceback (most recent call last):\r\x00\x07\x9b",
    "lines": "x\ny\u2028z\u2029w\r\n",
    "mermaid": 'a"] --> m9["x<br/>%%{init: {}}%% click m0 "https://evil.example" end #quot;',
    "xml": "]]></system-out><x y='1'>&\ufffe\uffff",  # (a lone surrogate cannot be in a protobuf string)
    "heading": "# Heading\n> quote\n- item\n1. one",
    "mention": "@octocat :white_check_mark: #123",
    "long": "é" * 250,  # names are at most 256 characters
}
# words from the corpus that must never appear outside a code span / element text of our own
MARKERS = ("evil", "verified", "alert", "Traceback", "bold", "hidden", "Heading", "PASS", "octocat")
ALLOWED_MD_TAGS = {"h2", "h3", "h4", "p", "table", "thead", "tbody", "tr", "th", "td", "code", "pre", "ul", "li",
                   "strong"}


def recognisable(name: str, width: int = 24) -> str:
    """What a reader must still find of `name`: the start of its escaped form."""
    return escape_controls(name)[:width]


class Tags(HTMLParser):
    """Every tag, attribute and comment of an HTML document, its text by element, and what lies outside code."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.comments, self.text, self.outside_code = [], [], [], [], []
        self._open: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]
        if tag not in ("br", "meta", "link", "img", "input", "hr", "rect", "line", "polyline", "path"):
            self._open.append(tag)

    def handle_endtag(self, tag):
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag):]

    def handle_comment(self, data):
        self.comments.append(data)

    def handle_data(self, data):
        if "script" in self._open or "style" in self._open:
            return
        self.text.append(data)
        if "code" not in self._open and "pre" not in self._open:
            self.outside_code.append(data)


def gfm(markdown: str) -> str:
    """Markdown as GitHub renders it (cmark-gfm with its extensions), raw HTML let through: whatever
    markup the text carried would show in the result."""
    return cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)


def assert_inert_markdown(markdown: str, names) -> Tags:
    page = Tags(gfm(markdown))
    assert set(page.tags) <= ALLOWED_MD_TAGS, set(page.tags) - ALLOWED_MD_TAGS  # no a, img, del, em, b, script...
    assert not page.comments
    assert {(t, k) for t, k, _ in page.attrs} <= {("pre", "lang"), ("th", "align"), ("td", "align")}
    text = "".join(page.text)
    assert all(c.isprintable() or c == "\n" for c in text), [c for c in text if not c.isprintable() and c != "\n"]
    outside = "".join(page.outside_code)
    assert not [m for m in MARKERS if m in outside], outside
    for name in names:
        assert recognisable(name) in text, name
    return page
