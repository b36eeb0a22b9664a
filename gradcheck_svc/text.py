"""Every string that came from a request is hostile: cut it and escape it before echoing it.

Node and graph names, fields and formulas reach error messages, log lines, gRPC
trailers, text reports, JUnit XML and SVG. `clip` bounds each echoed string and
escapes what is not printable, so a message stays one line (a name holding a
newline cannot fake a "Traceback" line), XML/SVG stay well-formed once
XML-escaped, and gRPC's error trailers stay far below its metadata limit
whatever the input (`cut_bytes` bounds a whole message in UTF-8 bytes, which is
what the trailers pay for).
"""
from __future__ import annotations

import re

MAX_ECHO = 80  # characters of one user string inside a message
MAX_MESSAGE_BYTES = 400  # a whole one-line error message, UTF-8
_CLIPPED = re.compile(r"…\(\+\d+ chars\)")


def escape_controls(text: str) -> str:
    """Non-printable characters (controls, line and paragraph separators, format characters) as escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def clip(value, limit: int = MAX_ECHO) -> str:
    """A user string cut to `limit` characters (the cut says how much was left out), escaped."""
    text = str(value)
    if len(text) > limit and not _CLIPPED.fullmatch(text[limit:]):  # idempotent: clip(clip(x)) == clip(x)
        text = f"{text[:limit]}…(+{len(text) - limit} chars)"
    return escape_controls(text)


def cut_bytes(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text` escaped and cut to at most `limit` UTF-8 bytes, on a character boundary, marked with '…'."""
    text = escape_controls(text)
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit - 3].decode(errors="ignore") + "…"
