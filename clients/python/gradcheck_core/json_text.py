"""JSON text for people and for scripts at once: indented objects, every list of plain values on one line.

json.dumps(indent=...) runs Python's own encoder, element by element: a chain_256 report's 300,000
listed values took 2.8 s to print, against 0.1 s for the data itself. Here the lists of plain values
(numbers, strings, null, booleans: gradients, references, shapes) are set aside, the rest is indented
as before, and each list is written into its place on one line -- which reads better than one line
per number.

The text is written by orjson: even the C json encoder spends ~0.2 s in float.__repr__ on those
300,000 values, orjson ~0.02 s. A number's text may differ from repr's (1e-7 for 1e-07, 1e16 for
1e16) but parses to the same double, which is the contract. Where orjson would not say what json.dumps says, that piece is written by
json.dumps instead: a non-finite float (orjson writes null; json writes NaN or, with
allow_nan=False, refuses: the report spells them "NaN"/"Infinity" itself, verify/jsonnum.py),
non-ASCII text (json escapes it: the output stays ASCII), an integer beyond 64 bits."""
from __future__ import annotations

import json
import math
import re
import secrets

import numpy as np
import orjson

_PLAIN = frozenset((int, float, str, bool, type(None)))  # exact types: a subclass is looked into
_OPT = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj, indent: int | None = 2, allow_nan: bool = True) -> str:
    """json.dumps(obj, indent=indent, allow_nan=allow_nan)'s data, with each list of plain values on one line."""
    if indent is None:
        return json.dumps(obj, allow_nan=allow_nan)
    token = secrets.token_hex(8)  # no string in obj can be mistaken for a placeholder
    lists: list = []
    state = {"nulls": 0, "finite": True}  # the skeleton's None leaves, and whether all its floats are finite

    def lift(o):
        if isinstance(o, dict):
            return {k: lift(v) for k, v in o.items()}
        if isinstance(o, np.ndarray):  # as its tolist() would be written; the encoder reads the array
            # (a float32's shortest text is not its float64's: such arrays are written as their tolist())
            o = o if (o.dtype.kind in "iu" or o.dtype == np.float64) and o.ndim == 1 and np.isfinite(o).all() \
                else o.tolist()
        if isinstance(o, np.ndarray) or isinstance(o, (list, tuple)) and _PLAIN.issuperset(map(type, o)):
            lists.append(o)  # C-speed over a gradient's 1,000 values
            return f"{token}{len(lists) - 1}"
        if isinstance(o, (list, tuple)):
            return [lift(v) for v in o]
        if isinstance(o, np.generic):
            o = o.item()
        state["nulls"] += o is None
        state["finite"] &= not isinstance(o, float) or math.isfinite(o)
        return o

    skeleton = lift(obj)
    nulls = state["nulls"] if state["finite"] else -1
    text = (_orjson(skeleton, nulls, orjson.OPT_INDENT_2) if indent == 2 else None) \
        or json.dumps(skeleton, indent=indent, allow_nan=allow_nan)
    return re.sub(f'"{token}(\\d+)"', lambda m: _one_line(lists[int(m.group(1))], allow_nan), text)


def _one_line(values, allow_nan: bool) -> str:
    """A list of plain values (or a finite 1-D NumPy array) on one line, ", " between values as json writes
    them: without strings, every comma in orjson's text is a separator (lists of names: json.dumps)."""
    if isinstance(values, np.ndarray):  # finite numbers: lift let no other array through
        text = _orjson(values, 0, 0)
        values = values.tolist() if text is None else values
    else:
        text = _orjson(values, values.count(None), 0) if str not in map(type, values) else None
    return text.replace(",", ", ") if text is not None else json.dumps(values, allow_nan=allow_nan)


def _orjson(o, nulls: int, option: int) -> str | None:
    """orjson's text of o when it holds exactly `nulls` nulls (a NaN or Inf would add one; -1: a known
    non-finite float) and is ASCII; else None: json.dumps writes it (and raises what json raises)."""
    if nulls < 0:
        return None
    try:
        text = orjson.dumps(o, option=_OPT | option)
    except orjson.JSONEncodeError:  # an int beyond 64 bits, a lone surrogate: json.dumps knows them
        return None
    # a string holding "null" (in the skeleton) is left to json.dumps too
    return text.decode() if text.isascii() and text.count(b"null") == nulls else None
