"""Every string that came from a request is hostile: cut it and escape it before echoing it.

Node and graph names, fields and formulas reach error messages, log lines, gRPC
trailers, text reports, JUnit XML and SVG. `clip` bounds each echoed string and
escapes what is not printable or prints as nothing (controls, bidi overrides,
zero-width characters), so a message stays one line (a name holding a newline
cannot fake a "Traceback" line), XML/SVG stay well-formed once XML-escaped, and
gRPC's error trailers stay far below its metadata limit whatever the input
(`cut_bytes` bounds a whole message in UTF-8 bytes, which is what the trailers
pay for). The escaping itself is the client's terminal-text function
(gradcheck_core/outputs/text.py): one escape for text, on both sides of the wire.
"""
from __future__ import annotations

from gradcheck_core.outputs.text import MAX_ECHO, clip, escape_controls, graph_label, lines

__all__ = ["MAX_ECHO", "MAX_MESSAGE_BYTES", "clip", "cut_bytes", "escape_controls", "graph_label", "lines"]

MAX_MESSAGE_BYTES = 400  # a whole one-line error message, UTF-8


def cut_bytes(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text` escaped and cut to at most `limit` UTF-8 bytes, on a character boundary, marked with '…'."""
    text = escape_controls(text)
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit - 3].decode(errors="ignore") + "…"
