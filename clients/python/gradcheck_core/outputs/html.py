"""HTML (the `--html` page, and the SVG drawn inline in it, which HTML parses as its own).

`h`: text and attribute values: `text.clip` (one line, controls, bidi overrides and invisible
characters escaped), then &, <, >, " and ' as character references. `script_json`: data for a
non-executable <script type="application/json"> element: JSON with <, > and & as \\u escapes, so
no string can end the element or open a comment; the page's script sets what it reads as
textContent only.
"""
from __future__ import annotations

import html
import json

from .text import clip


def h(value, limit: int = 500) -> str:
    """A user string as HTML text or a quoted attribute value."""
    return html.escape(clip(value, limit), quote=True)


def script_json(data) -> str:
    """JSON that cannot end its <script> element or open a comment, whatever the strings hold."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
