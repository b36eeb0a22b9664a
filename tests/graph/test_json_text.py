"""json_text writes through orjson: the text may spell a number differently from float.__repr__ (1e-7 for
1e-07), never another value. Checked against the standard library's json.dumps (the previous writer's
encoder): the same Python object back, every float bit for bit, keys in the same order -- for every golden
report, chain_256's real report, and reports holding NaN and infinities."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from gradcheck_core.graphio import load_graph
from gradcheck_core.json_text import dumps
from gradcheck_svc.graph import validate
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.jsonnum import json_float

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "tests" / "golden").glob("*.json"))


def _identical(a, b, where="$"):
    """a and b the same object: same types, dict keys in the same order, floats equal bit for bit."""
    assert type(a) is type(b), f"{where}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            _identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            _identical(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a.hex() == b.hex() or math.isnan(a) and math.isnan(b), f"{where}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def _same_as_json_dumps(doc, **kw):
    _identical(json.loads(dumps(doc, **kw)), json.loads(json.dumps(doc, indent=2, **kw)))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_every_golden_report_reads_back_as_json_dumps_wrote_it(path):
    _same_as_json_dumps(json.loads(path.read_text()))


def test_chain_256_report_reads_back_as_json_dumps_wrote_it():
    report = verify(validate(load_graph(ROOT / "examples" / "graphs" / "chain_256.json")), VerifyOptions())
    d = report.to_dict()
    assert sum(len(p["gradient"]) + len(p["reference"]) for p in d["parameters"]) > 200_000  # the bulk
    _identical(json.loads(report.to_json()), json.loads(json.dumps(d, indent=2, allow_nan=False)))


def test_numbers_keep_their_value_with_any_spelling():
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(5_000) * 10.0 ** rng.integers(-320, 308, 5_000)).tolist()
    values += [0.0, -0.0, 5e-324, 1.7976931348623157e308, 1e-7, 1e16, 2.0 ** 53 + 2, 0.1]
    doc = {"gradient": values, "shape": [3, -1, 2 ** 62], "loss": 1e-7, "flags": [True, False, None]}
    _same_as_json_dumps(doc)
    text = dumps(doc)
    assert '"shape": [3, -1, 4611686018427387904]' in text and '"flags": [true, false, null]' in text
    assert '"gradient": [' in text and text.count("\n") == 5  # objects indented, each list on one line


def test_nan_and_infinity_keep_the_report_spelling_and_json_dumps_refusal():
    """The report spells non-finite values as strings (jsonnum.json_float, parameter_result._listed): they
    and the lists around them come back exactly. A raw NaN is what json.dumps makes of it: refused with
    allow_nan=False (the report's own setting), else written NaN -- never orjson's null."""
    raw = [1.5, float("nan"), float("inf"), -float("inf"), 1e-07, None]
    doc = {"loss": json_float(float("nan")), "max_abs_error": json_float(float("inf")),
           "gradient": [json_float(x) for x in raw], "reference": [0.25, -0.0]}
    text = dumps(doc, allow_nan=False)
    _identical(json.loads(text), doc)
    assert '"gradient": [1.5, "NaN", "Infinity", "-Infinity", 1e-07, null]' in text  # as before, byte for byte
    assert '"loss": "NaN"' in text and '"max_abs_error": "Infinity"' in text
    for bad in ({"x": float("nan")}, {"x": [1.0, float("inf")]}, {"x": np.array([1.0, np.nan])},
                {"x": [[1.0, -float("inf")]]}):
        with pytest.raises(ValueError):
            dumps(bad, allow_nan=False)
        written = dumps(bad)
        assert "null" not in written  # NaN or Infinity, which json.loads reads back
        _identical(json.loads(written), json.loads(json.dumps(bad, default=np.ndarray.tolist)))
    assert dumps({"x": [None, 1.0, float("nan")]}) == '{\n  "x": [null, 1.0, NaN]\n}'


def test_what_orjson_would_write_otherwise_is_written_as_json_does():
    """Non-ASCII text escaped (the output stays ASCII), integers beyond 64 bits, strings holding "null"
    beside None, NumPy arrays as their tolist() (a float32's value, not its shortest float32 text)."""
    doc = {"name": "caf\u00e9 null", "null": [None, "null"], "big": [2 ** 70, -(2 ** 64)], "n": None,
           "grad": np.array([0.1, 1e-7]), "f32": np.array([0.1], dtype=np.float32), "i": np.arange(3),
           "grid": np.eye(2), "scalar": np.float64(0.5)}
    text = dumps(doc)
    assert text.isascii() and "\\u00e9" in text
    plain = {k: v.tolist() if isinstance(v, (np.ndarray, np.generic)) else v for k, v in doc.items()}
    _identical(json.loads(text), json.loads(json.dumps(plain)))
    assert json.loads(text)["f32"] == [float(np.float32(0.1))]
    # ASCII text otherwise: a DEL escaped as json escapes it (orjson writes it as it is), keys that are not
    # strings spelt as json spells them (orjson writes a NaN key as "null")
    for other in ({"name": "a\x7fb", "x": [0.5], "y": 0.25}, {float("nan"): 1.0, "x": [0.5]}, {2: [0.5], "y": None}):
        assert dumps(other) == json.dumps(other, indent=2).replace("[\n    0.5\n  ]", "[0.5]")


def test_lists_written_together_keep_their_own_spelling():
    """The lists without strings are written by one orjson call and split again: a list beside one with a
    NaN, a None, an int beyond 64 bits or an empty list still reads back as json.dumps wrote it."""
    docs = [{"a": [1.0, 2.0], "b": [None, 0.5], "c": [], "d": np.array([0.25, 1e-7]), "e": [3, 4]},
            {"a": [1.0, 2.0], "b": [float("nan"), 0.5], "c": [None]},
            {"a": [0.1], "b": [2 ** 70], "c": [[]], "d": {"e": [True, None, -0.0]}}]
    for doc in docs:
        text = dumps(doc)
        _identical(json.loads(text), json.loads(json.dumps(doc, indent=2, default=np.ndarray.tolist)))
    assert '"b": [null, 0.5],\n  "c": [],\n  "d": [0.25, 1e-7],\n  "e": [3, 4]\n}' in dumps(docs[0])
    assert '"b": [NaN, 0.5],\n  "c": [null]\n}' in dumps(docs[1])
    assert '"b": [1180591620717411303424],' in dumps(docs[2]) and '"e": [true, null, -0.0]' in dumps(docs[2])
