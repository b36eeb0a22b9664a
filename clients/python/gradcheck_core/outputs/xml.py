"""XML: JUnit files and standalone SVG.

`chars`: text that XML 1.0 can hold, for a serializer that escapes markup itself (ElementTree):
`text.clip` (or `text.lines` for a multi-line report, its line breaks kept) writes every
control character, lone surrogate and non-character (which XML forbids, and ElementTree would
write raw into a file that then does not parse) as an escape, and bidi overrides and invisible
characters too. `escape`: the same, then markup escaped, for XML written as strings (SVG).
"""
from __future__ import annotations

import html

from .text import clip, lines

MAX_TEXT = 100_000  # characters of one text block (a report in <system-out>)


def chars(value, limit: int = 1000, *, multiline: bool = False) -> str:
    """A user string as XML character data or an attribute value (markup left to the serializer)."""
    if not multiline:
        return clip(value, limit)
    text = str(value)
    return lines(text if len(text) <= limit else text[:limit] + f"…(+{len(text) - limit} chars)")


def escape(value, limit: int = 200) -> str:
    """A user string as XML text or a quoted attribute value, written by hand (&, <, >, ", ' escaped)."""
    return html.escape(chars(value, limit), quote=True)
