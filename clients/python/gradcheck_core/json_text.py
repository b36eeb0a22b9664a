"""JSON text for people and for scripts at once: indented objects, every list of plain values on one line.

json.dumps(indent=...) runs Python's own encoder, element by element: a chain_256 report's 300,000
listed values took 2.8 s to print, against 0.1 s for the data itself. Here the lists of plain values
(numbers, strings, null, booleans: gradients, references, shapes) are set aside, the rest is indented
as before, and each list is written into its place on one line -- which reads better than one line
per number.

The text is written by orjson: even the C json encoder spends ~0.2 s in float.__repr__ on those
300,000 values, orjson ~0.02 s. In one call where it can (_fragments): each list's one-line text goes into
the indented text as an orjson.Fragment; else (a NaN outside a list, non-ASCII text, a huge integer) each
list is a placeholder in json.dumps' indented text, and its line is put in its place.
A number's text may differ from repr's (1e-7 for 1e-07, 1e16 for 1e16) but parses to the same double, which is the contract. Where orjson would not say what json.dumps says, that piece is written by
json.dumps instead: a non-finite float (orjson writes null; json writes NaN or, with
allow_nan=False, refuses: the report spells them "NaN"/"Infinity" itself, verify/jsonnum.py),
non-ASCII text (json escapes it: the output stays ASCII), an integer beyond 64 bits."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import orjson

_PLAIN = frozenset((int, float, str, bool, type(None)))  # exact types: a subclass is looked into
# leaves with nothing to check (a None is counted; a float is lifted: a NaN or Inf, which orjson writes as null,
# leaves the text to json)
_QUIET = frozenset((int, str, bool))
_OPT = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj, indent: int | None = 2, allow_nan: bool = True) -> str:
    """json.dumps(obj, indent=indent, allow_nan=allow_nan)'s data, with each list of plain values on one line."""
    if indent is None:  # NumPy values as their tolist() / item(), as the indented text writes them
        return json.dumps(obj, allow_nan=allow_nan, default=_listable)
    if indent == 2:
        text = _fragments(obj, allow_nan)
        if text is not None:
            return text
    # json.dumps writes the objects: each list is a placeholder string in its place, then its line
    # no string in obj can be mistaken for a placeholder (secrets.token_hex's bytes, without hmac's imports)
    token = os.urandom(8).hex()
    lists: list = []  # (a list of plain values or a 1-D array, the set of its values' types)

    def put(values, types):
        lists.append((values, types))
        return f"{token}{len(lists) - 1}"

    skeleton, nulls, _ = _skeleton(obj, put)
    text = (_orjson(skeleton, nulls, orjson.OPT_INDENT_2) if indent == 2 else None) \
        or json.dumps(skeleton, indent=indent, allow_nan=allow_nan)
    pieces = _one_lines(lists, allow_nan)
    parts = text.split(f'"{token}')  # each part after the first begins with its placeholder's 'N"'
    out = [parts[0]]
    for part in parts[1:]:
        i, rest = part.split('"', 1)
        out += (pieces[int(i)], rest)
    return "".join(out)


def _fragments(obj, allow_nan: bool) -> str | None:
    """The indented text written by orjson in one call, each list of plain values in it as an orjson.Fragment
    of its one-line text (_one_line: json's text where orjson's would not say the same); None where orjson's
    text of the objects would not be json.dumps' (a NaN or Inf float outside a list, which orjson writes as
    null; text that is not ASCII or holds a DEL, which json escapes; an integer beyond 64 bits; a key that is
    not a string): then dumps places the lines in json's text. A placeholder per list and the text split at
    them cost chain_256's report ~40 ms more; the skeleton's floats are checked as they are lifted, not by
    counting the nulls of the whole text (~5 ms of its 6.7 MB)."""

    def put(values, types):
        if str not in types:  # orjson's text, where it holds only the nulls counted (no string: "n" is null's)
            nones = values.count(None) if type(None) in types else 0
            try:
                line = orjson.dumps(values, option=_OPT)
            except orjson.JSONEncodeError:  # an int beyond 64 bits: json's text
                line = None
            # (no None: no "n" at all, found by memchr, where counting them read every byte)
            if line is not None and (line.count(b"n") == nones if nones else b"n" not in line):
                return orjson.Fragment(line.replace(b",", b", "))
        return orjson.Fragment(_one_line(values, types, allow_nan))  # json's text (and its error)

    skeleton, _, finite = _skeleton(obj, put)
    if not finite:
        return None
    try:
        # (keys other than strings refused: orjson's text of a float key is not json's; they take the long way)
        text = orjson.dumps(skeleton, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_INDENT_2)
    except orjson.JSONEncodeError:
        return None
    return _ascii(text)


def _ascii(text: bytes) -> str | None:
    """orjson's text as json.dumps would say it, or None: not ASCII (json escapes it), or a DEL in a string
    (orjson writes it as it is, json as \\u007f). One pass: the decode is the ASCII check."""
    if b"\x7f" in text:
        return None
    try:
        return text.decode("ascii")
    except UnicodeDecodeError:
        return None


def _skeleton(obj, put) -> tuple:
    """(obj with each list of plain values, or 1-D integer or float64 array, replaced by put(values, the set of
    their types), the number of None leaves left in it, whether every float left in it is finite). A float64
    array may hold a NaN or Inf: orjson writes it as null, one more than counted, and that list's text is then
    json's (_one_line)."""
    nulls = 0  # the skeleton's None leaves: orjson's text must hold exactly these (a NaN or Inf is one more)
    finite = True

    def lift(o):
        nonlocal nulls, finite
        t = type(o)
        if t in _PLAIN:  # the leaves first: most calls are one
            if o is None:
                nulls += 1
            elif t is float and not math.isfinite(o):
                finite = False
            return o
        if isinstance(o, dict):  # the quiet leaves kept in place: no call for each
            return {k: v if type(v) in _QUIET else lift(v) for k, v in o.items()}
        if isinstance(o, np.ndarray):  # as its tolist() would be written; the encoder reads the array
            # (a float32's shortest text is not its float64's: such arrays are written as their tolist())
            if (o.dtype.kind in "iu" or o.dtype == np.float64) and o.ndim == 1:
                return put(o, frozenset())
            o = o.tolist()
        if isinstance(o, (list, tuple)):
            types = set(map(type, o))  # C-speed over a gradient's 1,000 values
            if types <= _PLAIN:
                return put(o, types)
            return [lift(v) for v in o]
        if isinstance(o, np.generic):
            return lift(o.item())
        return o

    skeleton = lift(obj)
    return skeleton, nulls, finite


def _listable(o):
    if isinstance(o, (np.ndarray, np.generic)):
        return o.tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _one_lines(lists: list, allow_nan: bool) -> list:
    """Each list of plain values (or finite 1-D NumPy array) on one line, ", " between values as json writes
    them. The lists without strings go to orjson in one call (one call per list cost more than writing its
    numbers): with no string in that text, every comma is a separator and "], [" ends a list."""
    pieces: list = [None] * len(lists)
    numeric = [i for i, (_, types) in enumerate(lists) if str not in types]
    nulls = sum(lists[i][0].count(None) for i in numeric if type(None) in lists[i][1])
    try:  # no string: only a null has an "n" (a NaN or Inf would be one more: then one list at a time)
        text = orjson.dumps([lists[i][0] for i in numeric], option=_OPT) if numeric else None
    except orjson.JSONEncodeError:  # an int beyond 64 bits: json.dumps writes that list
        text = None
    if text is not None and text.count(b"n") == nulls:
        for i, piece in zip(numeric, text.replace(b",", b", ").decode()[2:-2].split("], [")):
            pieces[i] = f"[{piece}]"
    for i, (values, types) in enumerate(lists):
        if pieces[i] is None:  # a string among the values, or a list orjson would not write as json does
            pieces[i] = _one_line(values, types, allow_nan)
    return pieces


def _one_line(values, types, allow_nan: bool) -> str:
    """One list on one line (as _one_lines, alone): orjson's text where it says what json.dumps says."""
    text = None
    if str not in types:
        text = _orjson(values, values.count(None) if type(None) in types else 0, 0)
    if text is not None:
        return text.replace(",", ", ")
    return json.dumps(values.tolist() if isinstance(values, np.ndarray) else values, allow_nan=allow_nan)


def _orjson(o, nulls: int, option: int) -> str | None:
    """orjson's text of o when it holds exactly `nulls` nulls (a NaN or Inf would add one) and is ASCII; else
    None: json.dumps writes it (and raises what json raises)."""
    try:
        text = orjson.dumps(o, option=_OPT | option)
    except orjson.JSONEncodeError:  # an int beyond 64 bits, a lone surrogate: json.dumps knows them
        return None
    # a string holding "null" (in the skeleton) is left to json.dumps too
    return _ascii(text) if text.count(b"null") == nulls else None
