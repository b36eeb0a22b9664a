"""Terminal text: the base escaping of every output format.

`clip` makes any user string safe to echo on one line of a terminal or log: cut to `limit`
characters (the cut says how much was left out), then every character that is not printable,
or prints as nothing, written as a Python escape (`\\x1b`, `\\u202e`, `\\n`). That covers
terminal control sequences (ESC, C1 controls), bidirectional overrides and isolates (a name
that reads backwards, "Trojan Source"), zero-width and format characters, line and paragraph
separators (a name that fakes a second line) and blank letters that show as empty space.
"""
from __future__ import annotations

import re

MAX_ECHO = 80  # characters of one user string inside a message
_CLIPPED = re.compile(r"…\(\+\d+ chars\)")
# printable by Unicode's categories, yet drawn as empty space: a name made of them looks blank
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _visible(c: str) -> bool:
    return c.isprintable() and c not in _BLANK_LETTERS


def escape_controls(text: str) -> str:
    """Non-printable and invisible characters as escapes; everything else as it is."""
    if text.isprintable() and _BLANK_LETTERS.isdisjoint(text):
        return text
    return "".join(c if _visible(c) else c.encode("unicode_escape").decode("ascii") for c in text)


def clip(value, limit: int = MAX_ECHO) -> str:
    """A user string cut to `limit` characters (the cut says how much was left out), one line, escaped."""
    text = str(value)
    if len(text) > limit and not _CLIPPED.fullmatch(text[limit:]):  # idempotent: clip(clip(x)) == clip(x)
        text = f"{text[:limit]}…(+{len(text) - limit} chars)"
    return escape_controls(text)


# what a CI runner reads as a command in a step's output: GitHub's `::name ...::` at a line's start (after
# blanks) and its legacy `##[name]` anywhere in a line
_COMMAND_START = re.compile(r"^(\s*):(?=:)")
_LEGACY_COMMAND = "##["


def no_command(line: str) -> str:
    """A line of ours that a graph author's text cannot turn into a CI workflow command: a leading `::`
    written `:\\:`, and `##[` written `#\\#[` (what they are is still plain to read)."""
    return _COMMAND_START.sub(r"\1:\\", line).replace(_LEGACY_COMMAND, "#\\#[")


def lines(text) -> str:
    """A multi-line text (a report) for the terminal, or a CI log: its line breaks kept, each line escaped,
    none of them a CI workflow command."""
    return "\n".join(no_command(escape_controls(line)) for line in str(text).split("\n"))


def graph_label(name) -> str:
    """How a report's first line names its graph: `graph NAME` (`graph` for an unnamed one), so that the
    line begins with our word, not the graph author's."""
    return f"graph {name}" if name else "graph"
