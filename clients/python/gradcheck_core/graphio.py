"""Graph files: load and save gradcheck.v1.Graph as .json (protobuf JSON) or .pb (binary).

The server decodes graphs with this module too (gradcheck_svc/graph/decode.py maps
GraphFileError to its GraphError), so both sides read a file the same way."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gradcheck.v1 import graph_pb2

from .errors import InvalidInput
from .hints import hint

SUFFIXES = (".json", ".pb")


class GraphFileError(InvalidInput, ValueError):
    """A graph file that cannot be read or decoded (one line, naming the file).

    path: the file (None for bytes); fmt: the encoding tried ("json" or "pb"), None when the
    file could not be read; reason: the cause in a few words."""

    def __init__(self, reason: str, *, path=None, fmt: str | None = None):
        self.reason, self.path, self.fmt = reason, path, fmt
        what = "cannot read" if fmt is None else f"not a valid gradcheck.v1.Graph ({fmt})"
        super().__init__(f"{path}: {what}: {reason}" if path is not None else f"{what}: {reason}")


def sniff_format(data: bytes, path=None) -> str:
    """"json" or "pb": the file's extension when it is one of SUFFIXES, else JSON if it starts with '{'."""
    if path is not None and Path(path).suffix in SUFFIXES:
        return Path(path).suffix[1:]
    return "json" if bytes(data[:4096]).lstrip()[:1] == b"{" else "pb"


def decode_graph(data: bytes, fmt: str, path=None) -> graph_pb2.Graph:
    """Bytes in the protobuf JSON mapping (fmt "json") or binary protobuf ("pb") -> Graph."""
    msg = graph_pb2.Graph()
    try:
        if fmt == "json":
            msg = _parse_json(bytes(data).decode("utf-8"), msg)
        else:
            msg.ParseFromString(bytes(data))
    except UnicodeDecodeError:
        raise GraphFileError("not valid UTF-8", path=path, fmt=fmt) from None
    except RecursionError:
        raise GraphFileError("nested too deeply", path=path, fmt=fmt) from None
    except (json_format.ParseError, DecodeError) as exc:
        raise GraphFileError(_parse_reason(str(exc)), path=path, fmt=fmt) from None
    return msg


# --- JSON at the speed of the bytes ------------------------------------------------------------
# json_format converts every element of a Tensor's `data` in Python (~10 us each: 2.7 s of a 2 MB
# graph's 3 s). Here orjson (or json.loads, where orjson's reading could differ: _fast_loads) reads
# the text, every `data` list of plain numbers is set aside and handed to the repeated field's C extend
# after json_format has parsed the rest, so a graph decodes to the same message with the same errors:
# a list holding anything but ints and floats stays for json_format, and its message.

_DATA = graph_pb2.Tensor.DESCRIPTOR.fields_by_name["data"]
_EXACT = 2 ** 53  # beyond it an int is not one double; json_format decides what to say
_FAST_BOUND = 2.0 ** 63  # orjson reads an integer beyond 64 bits as a float: from there on json reads the text


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise json_format.ParseError(f"duplicate key {k}")
        out[k] = v
    return out


def _parse_json(text: str, msg):
    """json_format.Parse(text, msg), its errors included, with the data lists set by C: the message (msg, or
    one its constructor built, where json_format would build the same)."""
    lifted = []
    obj = _loaded(text)
    built = _direct(text, obj, type(msg)) if obj is not None else None
    if built is not None:
        return built
    obj = _fast_loads(text, msg.DESCRIPTOR, lifted, obj)
    if obj is None:  # json's own reading, duplicate keys refused as json_format refuses them
        try:
            obj = json.loads(text, object_pairs_hook=_no_duplicates)
        except Exception as exc:  # as json_format.Parse words it
            raise json_format.ParseError(f"Failed to load JSON: {exc}.") from exc
        lifted = []
        _lift_data(obj, msg.DESCRIPTOR, (), lifted)
    if not isinstance(obj, dict):  # json_format would read a string's letters as field names
        raise json_format.ParseError(f"the document is {_JSON_KIND.get(type(obj), type(obj).__name__)}, "
                                     f"not an object {{...}} holding the graph's fields")
    try:
        json_format.ParseDict(obj, msg)
    except json_format.ParseError:
        raise
    except Exception as exc:  # e.g. a document that is not an object
        raise json_format.ParseError(f"Failed to parse JSON: {type(exc).__name__}: {exc}.") from exc
    for where, values in lifted:
        _resolve(msg, where).data.extend(values)
    return msg


_JSON_KIND = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false",
              type(None): "null"}


def _loaded(text: str):
    """orjson's reading of text, or None where it could differ from json's (a text with an escape: then
    every string reads as it is spelt) or where orjson refuses it (NaN, 1e400, a BOM...: json's reading and
    its words). Whether it is json's reading still depends on the pairs counted (_fast_loads, _direct)."""
    if "\\" in text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _fast_loads(text: str, desc, lifted: list, obj=None):
    """orjson's reading of text (obj: _loaded's, when read already) with its data lists lifted (into
    `lifted`), when it is json.loads' exactly; else None (json reads it: the same document, or the same
    error). orjson keeps a duplicate key's last value where json_format refuses the key, and reads an
    integer beyond 64 bits as a float: so a text with an escape is left to json, and so is one where the
    pairs found do not account for every ':' outside the strings, or holding a float of 2**63 or more."""
    obj = obj if obj is not None else _loaded(text)
    if obj is None:
        return None
    _lift_data(obj, desc, (), lifted, _FAST_BOUND)
    pairs_and_colons = [len(lifted), 0]  # a data list lifted was one pair
    try:
        faithful = _tally(obj, pairs_and_colons) and sum(pairs_and_colons) == text.count(":")
    except RecursionError:  # nested deeper than _tally goes: json's reading says what it says of it
        faithful = False
    if not faithful:
        lifted.clear()
        return None
    return obj


def _tally(obj, counts: list) -> bool:
    """counts += [the pairs of every object in obj, the ':' in its strings and keys]; False at a float of
    2**63 or more (orjson's reading of a large integer, where json keeps the integer)."""
    t = type(obj)
    if t is dict:
        counts[0] += len(obj)
        counts[1] += sum(k.count(":") for k in obj)
        return all(_tally(v, counts) for v in obj.values())
    if t is list:
        return all(_tally(v, counts) for v in obj)
    if t is str:
        counts[1] += obj.count(":")
    return t is not float or abs(obj) < _FAST_BOUND


def _lift_data(obj, desc, where: tuple, lifted: list, bound: float = math.inf) -> None:
    """Take the plain-number `data` lists out of every Tensor in obj (a JSON dict for message desc),
    with the path to each; recurses through message fields, repeated ones and map values. bound: what
    every value of a list taken is below in magnitude."""
    if not isinstance(obj, dict):
        return  # json_format names what is wrong
    if desc is _DATA.containing_type:
        key = _key(obj, _DATA)
        if key is not None and isinstance(obj[key], list) and _plain_numbers(obj[key], bound):
            lifted.append((where, obj.pop(key)))
        return
    for f in desc.fields:
        key = _key(obj, f) if f.message_type is not None else None
        if key is None:
            continue
        value = obj[key]
        if f.message_type.GetOptions().map_entry:
            vdesc = f.message_type.fields_by_name["value"].message_type
            if vdesc is not None and isinstance(value, dict):
                for k, v in value.items():
                    _lift_data(v, vdesc, (*where, (f.name, k)), lifted, bound)
        elif f.is_repeated:
            if isinstance(value, list):
                for i, v in enumerate(value):
                    _lift_data(v, f.message_type, (*where, (f.name, i)), lifted, bound)
        else:
            _lift_data(value, f.message_type, (*where, (f.name, None)), lifted, bound)


def _key(obj: dict, f):
    """The key obj spells field f by (JSON or proto name), or None: absent, or spelt both ways (then
    json_format's error stands)."""
    present = [k for k in dict.fromkeys((f.json_name, f.name)) if k in obj]
    return present[0] if len(present) == 1 else None


def _plain_numbers(values: list, bound: float = math.inf) -> bool:
    """Finite ints and floats only (below `bound` in magnitude). type() is exact: bool (an int subclass)
    and strings ("NaN", "1e3") go to json_format, and so do the NaN literal and an overflow to inf (it
    refuses both, naming the quoted spelling)."""
    types = set(map(type, values))  # C-speed, where a generator over the elements was 1/4 of a decode
    if not types <= {float, int}:
        return False
    if int in types and not all(-_EXACT <= v <= _EXACT for v in values if type(v) is int):
        return False
    return bool((np.abs(np.fromiter(values, np.float64, len(values))) < bound).all())


def _resolve(msg, where: tuple):
    for name, key in where:
        msg = getattr(msg, name)
        if key is not None:
            msg = msg[key]
    return msg


# --- the message built by its constructor ----------------------------------------------------------
# json_format.ParseDict walks every field of every message in Python (~60 ms of chain_256's 1,800 small
# messages beside its data). Where a document holds only what the generated constructor reads as
# json_format does -- known keys (JSON or proto name, one spelling), strings, bools, int32s in range, data
# lists of plain numbers, messages, string-keyed maps of messages, Structs -- the document becomes the
# constructor's arguments in one walk (which also counts the pairs, as _tally does) and C builds the
# message. Anything else (an enum, bytes, a null, an int spelt as a string or a float...) is json_format's,
# with its errors: the same message either way (tests/graph/test_json_codec.py).

class _Slow(Exception):
    """Not for the constructor: json_format reads this document."""


_STRUCT = "google.protobuf.Struct"
_INT32 = (-2 ** 31, 2 ** 31 - 1)
_SPECS: dict = {}  # a message descriptor -> {key as spelt: (field name, kind, the value's descriptor)}


def _direct(text: str, obj, cls):
    """The `cls` message of obj (orjson's reading of text) built by its constructor, or None: json_format's."""
    counts = [0, 0]  # the pairs of every object, the ':' in every key and string
    try:
        kwargs = _arguments(obj, cls.DESCRIPTOR, counts)
        if sum(counts) != text.count(":"):  # a duplicate key orjson dropped: json_format names it
            return None
        return cls(**kwargs)
    except (_Slow, RecursionError):
        return None
    except Exception:  # what the constructor refuses (a value out of range...): json_format says it its way
        return None


def _specs(desc) -> dict:
    specs = _SPECS.get(desc)
    if specs is None:
        specs = {}
        for f in desc.fields:
            for key in dict.fromkeys((f.json_name, f.name)):
                specs[key] = (f.name, _kind(f), f.message_type)
        _SPECS[desc] = specs
    return specs


def _kind(f) -> str:
    t, repeated = f.type, f.is_repeated
    if f.message_type is not None:
        if f.message_type.GetOptions().map_entry:
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            ok = key.type == f.TYPE_STRING and value.message_type is not None and \
                not value.message_type.full_name.startswith("google.protobuf.")
            return "map" if ok else "slow"
        if f.message_type.full_name == _STRUCT:
            return "slow" if repeated else "struct"
        if f.message_type.full_name.startswith("google.protobuf."):
            return "slow"
        return "messages" if repeated else "message"
    if f is _DATA:
        return "data"
    scalar = {f.TYPE_STRING: "str", f.TYPE_BOOL: "bool", f.TYPE_INT32: "int32"}.get(t, "slow")
    return scalar if scalar == "slow" or not repeated else scalar + "s"


def _arguments(obj, desc, counts: list) -> dict:
    """The constructor's keyword arguments for obj as message desc (raises _Slow)."""
    if type(obj) is not dict:
        raise _Slow
    specs = _specs(desc)
    counts[0] += len(obj)
    out = {}
    for key, value in obj.items():
        spec = specs.get(key)
        if spec is None or spec[0] in out:  # unknown, or spelt both ways: json_format's error
            raise _Slow
        name, kind, sub = spec
        counts[1] += key.count(":")
        out[name] = _value(value, kind, sub, counts)
    return out


def _value(value, kind: str, sub, counts: list):
    t = type(value)
    if kind == "str" and t is str:
        counts[1] += value.count(":")
        return value
    if kind == "bool" and t is bool or kind == "int32" and t is int and _INT32[0] <= value <= _INT32[1]:
        return value
    if t is list and kind in ("strs", "int32s", "data"):
        types = set(map(type, value))
        if kind == "strs" and types <= {str}:
            counts[1] += "".join(value).count(":")
            return value
        if kind == "int32s" and types <= {int} and (not value or _INT32[0] <= min(value) and max(value) <= _INT32[1]):
            return value
        if kind == "data" and _plain_numbers(value, _FAST_BOUND):
            return value
    if kind == "message":
        return _arguments(value, sub, counts)
    if kind == "messages" and t is list:
        return [_arguments(v, sub, counts) for v in value]
    if kind == "map" and t is dict:
        counts[0] += len(value)
        counts[1] += "".join(value).count(":")
        return {k: _arguments(v, sub.fields_by_name["value"].message_type, counts) for k, v in value.items()}
    if kind == "struct" and t is dict:
        _struct_value(value, counts)
        return value
    raise _Slow


def _struct_value(value, counts: list) -> None:
    """Raises _Slow unless value is what json_format and the constructor both read into a Struct's Value
    alike (objects, lists, strings, bools, null, numbers below 2**63); counts its pairs and ':'."""
    t = type(value)
    if t is dict:
        counts[0] += len(value)
        counts[1] += "".join(value).count(":")
        for v in value.values():
            _struct_value(v, counts)
    elif t is list:
        for v in value:
            _struct_value(v, counts)
    elif t is str:
        counts[1] += value.count(":")
    elif not (t is bool or t is int or value is None or t is float and abs(value) < _FAST_BOUND):
        raise _Slow


# protobuf's json_format: 'Message type "gradcheck.v1.Input" has no field named "requireGrad" at
# "Graph.inputs[0]".\n Available Fields...' (prefixed by "Failed to parse X field: " per level)
_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "([^"]*)" at "([^"]*)"')


def _parse_reason(text: str) -> str:
    """The parser's message in one line; an unknown field named with its place and the nearest
    valid field (JSON name, as the file spells them) instead of protobuf's field dump."""
    m = _UNKNOWN_FIELD.search(text)
    if m:
        type_name, field, where = m.groups()
        field = field[:60].encode("unicode_escape").decode("ascii")  # one line, whatever the key holds
        try:
            desc = graph_pb2.DESCRIPTOR.pool.FindMessageTypeByName(type_name)
            valid = [f.json_name for f in desc.fields]
        except KeyError:
            valid = []
        return f"unknown field '{field}' at {where}{hint(field, valid, n=1, what='valid fields')}"
    return text.strip().splitlines()[0] if text.strip() else "malformed"


def load_graph(path, fmt: str | None = None) -> graph_pb2.Graph:
    """Read a graph file; fmt ("json" or "pb") by default from the extension, else sniffed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GraphFileError(exc.strerror or str(exc), path=path) from None
    return decode_graph(data, fmt or sniff_format(data, path), path)


def save_graph(graph: graph_pb2.Graph, path) -> Path:
    path = Path(path)
    if path.suffix == ".pb":
        path.write_bytes(graph.SerializeToString())
    else:
        path.write_text(json_format.MessageToJson(graph, indent=2) + "\n")
    return path


def to_graph(graph) -> graph_pb2.Graph:
    """Accept a Graph message, a path, a JSON dict or JSON text."""
    if isinstance(graph, graph_pb2.Graph):
        return graph
    # a dict or JSON text is decoded as a file is, so a misspelt field reads the same (GraphFileError)
    if isinstance(graph, dict):
        return decode_graph(json.dumps(graph).encode(), "json")
    if isinstance(graph, str) and graph.lstrip().startswith("{"):
        return decode_graph(graph.encode(), "json")
    if isinstance(graph, (str, Path)):
        return load_graph(graph)
    raise TypeError(f"expected a gradcheck.v1.Graph, a path or a JSON dict, got {type(graph).__name__}")


def set_attrs(node: graph_pb2.Node, attrs: dict) -> None:
    """Fill a node's attrs Struct from Python values (NumPy scalars and arrays included)."""
    if attrs:
        json_format.ParseDict(_jsonable(attrs), node.attrs)


def _jsonable(v):
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, np.generic):
        return v.item()
    return v
