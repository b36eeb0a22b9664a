"""Graph.notes: what the converter that made a graph wants the report to say (the ONNX importer's
"not checked under their PyTorch names ..." for parameters an exporter folded away) reaches the
report's warnings, in every format; notes are request strings, bounded in count and length."""
from __future__ import annotations

import json

import pytest

from gradcheck_svc.errors import LimitError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.graph.validate import MAX_NOTE_LENGTH, MAX_NOTES
from gradcheck_svc.verify import VerifyOptions, verify


def _graph(notes):
    b = GraphBuilder("noted")
    x = b.input("x", [0.5, -1.0], requires_grad=True)
    b.output(b.node("sum", b.node("tanh", x, name="t"), name="L"))
    msg = b.build()
    msg.notes.extend(notes)
    return msg


def test_notes_are_report_warnings():
    note = "not checked: 1 torch parameter(s) the model does not hold, pos.weight: folded"
    report = verify(load_graph(_graph([note])), VerifyOptions())
    assert report.verdict == "pass" and note in report.warnings
    assert note in json.loads(json.dumps(report.to_dict()))["warnings"]
    assert note in report.to_text()


@pytest.mark.parametrize(("notes", "field"), [(["x" * (MAX_NOTE_LENGTH + 1)], "notes[0]"),
                                              (["n"] * (MAX_NOTES + 1), "notes")])
def test_notes_are_bounded(notes, field):
    with pytest.raises(LimitError) as err:
        load_graph(_graph(notes))
    assert err.value.field == field and "\n" not in str(err.value)
