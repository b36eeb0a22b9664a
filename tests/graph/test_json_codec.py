"""The JSON graph decoder and the report's JSON text: the speed paths give what the plain ones give.

graphio's decoder hands Tensor data lists to protobuf's C extend instead of json_format's
per-element Python; json_text indents everything but lists of plain values. Both are checked here
against the slow reference (protobuf's own json_format.Parse, the standard library's json.dumps):
same message bytes or the same error, same data."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format

from gradcheck.v1 import graph_pb2
from gradcheck_core.graphio import GraphFileError, _direct, _fast_loads, _loaded, decode_graph
from gradcheck_core.json_text import dumps

ROOT = Path(__file__).resolve().parents[2]
GRAPH = '{"inputs":[{"name":"x","value":%s,"requiresGrad":true}],"nodes":[],"output":"x"}'
TENSORS = [
    '{"data":[1,2,3.5]}', '{"dtype":"float32","shape":[2],"data":[1.5,-2]}', '{"data":[]}',
    '{"data":[1,2,"x"]}', '{"data":[1,true]}', '{"data":["NaN",1,"-Infinity"]}', '{"data":[NaN,1]}',
    '{"data":[1e400]}', '{"data":[-Infinity]}', '{"data":[12345678901234567890123]}', '{"data":[9007199254740993]}',
    '{"data":[0.5,9007199254740992,-9007199254740992,3]}', '{"data":[0.5,1e400]}',
    '{"data":5}', '{"data":[[1]]}', '{"data":[1],"raw":"AAAAAAAA8D8="}', '{"data":null}', '[1]', '"x"',
    # what orjson (the fast reader) would read otherwise than json: integers beyond 64 bits, a duplicate key
    '{"data":[-9223372036854775809]}', '{"data":[18446744073709551616, 1.5]}', '{"data":[1e19, -1e300]}',
    '{"shape":[1],"shape":[1],"data":[1]}', '{"shape":[-18446744073709551617],"data":[1]}', '{"data":[1],"dtype":"float64","dtype":"float32"}',
]
DOCUMENTS = ['{', '{"inputs": 5}', '{"inputs":[5]}', '{"inputs":[null]}',
             '{"opsetVersion":1,"opset_version":2}', '{"nodes":[{"name":"a","attrs":{"data":[1,2]}}]}',
             '{"inputs":[{"name":"x","value":{"data":[1]},"requiresGrad":true,"extra":1}]}',
             # a duplicate key whose dropped value holds ':' (the fast reader counts them), escapes, big ints
             '{"nodes":[{"name":"a","op":"b:c","name":"d"}]}', '{"nodes":[{"name":"a","attrs":{"k":{"x":":","x":2}}}]}',
             '{"nodes":[{"name":"a:b","attrs":{"k":[1,{"x":1}],"k":1}}]}', '{"nodes":[{"name":"a\\u003ab"}]}',
             '{"nodes":[{"name":"a","attrs":{"k":123456789012345678901234,"j":-9223372036854775809}}]}',
             '{"nodes":[{"name":"\\"","op":"x","op":"y"}]}',
             # what the constructor path (graphio._direct) builds or leaves to json_format: maps, empty messages
             # and Structs, ':' in keys and lists, both spellings, an int32 out of range, an enum-free int as float
             '{"claimed":{"gradients":{"W:1":{"shape":[1],"data":[2]}},"adjoints":{}},"inputs":[{"value":{}}]}',
             '{"nodes":[{"name":"a","attrs":{},"inplace":false}],"notes":["a:b",""]}',
             '{"inputs":[{"name":"x","sourceNames":[{"name":"n","readBy":["a:b","c"]}],"source_names":[]}]}',
             '{"opsetVersion":2147483648}', '{"opsetVersion":1.0}', '{"inputs":[{"value":{"shape":[1.0]}}]}',
             '{"claimed":{"gradients":{"W":{"data":[1],"data":[2]}}}}',
             '{"nodes":[{"attrs":{"k":[null,true,"s:",1.5]}}]}',
             # nested deeper than the fast reader's own walk goes (json's reading decides)
             '{"nodes":[{"name":"a","attrs":{"k":' + '[' * 600 + ']' * 600 + '}}]}']


def _reference(text: str):
    msg = graph_pb2.Graph()
    try:
        json_format.Parse(text, msg)
    except json_format.ParseError as exc:
        return "error", str(exc).splitlines()[0]
    return "ok", msg.SerializeToString(deterministic=True)  # a map's (a Struct's) order is not the message


def _ours(text: str):
    try:
        msg = decode_graph(text.encode(), "json")
    except GraphFileError as exc:
        return "error", exc.reason
    return "ok", msg.SerializeToString(deterministic=True)  # a map's (a Struct's) order is not the message


CASES = ([p.read_text() for p in sorted((ROOT / "examples" / "graphs").glob("*.json"))]
         + [GRAPH % t for t in TENSORS] + DOCUMENTS)


@pytest.mark.parametrize("text", CASES, ids=range(len(CASES)))
def test_decoder_equals_json_format(text):
    kind, ours = _ours(text)
    ref_kind, ref = _reference(text)
    assert kind == ref_kind, (ours, ref)
    if kind == "ok":
        assert ours == ref
    else:  # graphio keeps the first line, and names an unknown field its own way
        assert ours.split(" at ")[0] in ref or "unknown field" in ours, (ours, ref)


@pytest.mark.parametrize("text, kind", [("null", "null"), ("[]", "a list"), ('"x"', "a string"), ("5", "a number")])
def test_a_document_that_is_not_an_object_is_refused(text, kind):
    """Stricter than json_format, which reads "[]" as an empty graph and a string's letters as field names
    ("unknown field 'x'"): the one line says what the document is."""
    assert _ours(text) == ("error", f"the document is {kind}, not an object {{...}} holding the graph's fields")


def test_decoder_reads_a_large_tensor_exactly():
    values = np.random.default_rng(0).standard_normal(50_000) * 10.0 ** np.random.default_rng(1).integers(-300, 300, 50_000)
    text = GRAPH % json.dumps({"shape": [50_000], "data": values.tolist()})
    msg = decode_graph(text.encode(), "json")
    np.testing.assert_array_equal(np.asarray(msg.inputs[0].value.data), values)  # bit for bit
    assert _ours(text) == _reference(text)


def test_the_fast_reader_reads_a_graph_exactly():
    """Below 2**63 in magnitude and without escapes, a graph is read by orjson (graphio._fast_loads): every
    value bit for bit as json and json_format read it."""
    rng = np.random.default_rng(2)
    values = rng.standard_normal(20_000) * 10.0 ** rng.integers(-320, 18, 20_000)
    text = GRAPH % json.dumps({"shape": [20_000], "data": values.tolist()})
    lifted = []
    assert _fast_loads(text, graph_pb2.Graph.DESCRIPTOR, lifted) is not None and len(lifted) == 1
    msg = decode_graph(text.encode(), "json")
    np.testing.assert_array_equal(np.asarray(msg.inputs[0].value.data), values)
    assert _ours(text) == _reference(text)
    chain = (ROOT / "examples" / "graphs" / "chain_256.json").read_text()
    assert _fast_loads(chain, graph_pb2.Graph.DESCRIPTOR, []) is not None
    # and built by the message's constructor (graphio._direct), json_format's walk skipped
    assert _direct(chain, _loaded(chain), graph_pb2.Graph) == decode_graph(chain.encode(), "json")


def test_duplicate_keys_are_refused():
    with pytest.raises(GraphFileError, match="duplicate key data"):
        decode_graph((GRAPH % '{"data":[1],"data":[2]}').encode(), "json")


def test_json_text_is_the_same_data_with_lists_on_one_line():
    hostile = "\u0000" + "0" * 16 + "0"  # a string shaped like a placeholder stays a string
    doc = {"name": hostile, "shape": [2, 3], "values": [0.1, -2.5e-300, 1e16, None, "NaN", True],
           "nested": [{"a": [1, 2]}, [3, [4]]], "empty": [], "text": ["a", "b\n"]}
    text = dumps(doc)
    assert json.loads(text) == doc
    assert '"values": [0.1, -2.5e-300, 1e+16, null, "NaN", true]' in text
    assert '"shape": [2, 3]' in text and '\n  "nested": [\n' in text  # objects stay indented
    with pytest.raises(ValueError):
        dumps({"x": [float("nan")]}, allow_nan=False)
    assert dumps(doc, indent=None) == json.dumps(doc)
