"""The server's Report proto is built field by field from the JSON report (no JSON-mapping
parse): it must be exactly the message json_format.ParseDict makes of the same report,
NaN/Inf spellings, maps of messages and unset optionals included."""
import functools
import json

import pytest
from google.protobuf import json_format

from gradcheck.v1 import service_pb2
from gradcheck_svc.engine import parse_fault
from gradcheck_svc.graph import load_graph
from gradcheck_svc.report_proto import report_to_proto
from gradcheck_svc.verify import VerifyOptions, verify

from conftest import EXAMPLES

CASES = [("seed.json", ()), ("seed.json", ("z:overwrite:nan",)), ("mlp_cross_entropy.json", ()),
         ("softmax_logsumexp.json", ()), ("swish_custom_wrong.json", ()), ("broadcasting.json", ())]


@functools.cache
def _verified(name: str, faults: tuple):
    """Each case verified once for the module's comparisons (nothing here changes a report)."""
    return verify(load_graph(EXAMPLES / name), VerifyOptions(faults=tuple(parse_fault(f) for f in faults)))


@pytest.mark.parametrize("name, faults", CASES, ids=[f"{n}-{len(f)}" for n, f in CASES])
def test_report_proto_equals_the_json_mapping_of_the_report(name, faults):
    report = _verified(name, faults)
    expected = json_format.ParseDict(report.to_dict(), service_pb2.Report(), ignore_unknown_fields=True)
    expected.text = report.to_text()
    got = report_to_proto(report)
    assert got == expected
    assert got.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


@pytest.mark.parametrize("name, faults", CASES, ids=[f"{n}-{len(f)}" for n, f in CASES])
def test_client_dict_of_the_proto_is_json_formats_word_for_word(name, faults):
    """message_to_dict sets the repeated doubles aside for speed: the dict (its keys' order too, and
    NaN/Infinity spelt as strings) must be exactly json_format.MessageToDict's."""
    from gradcheck_core.report import message_to_dict

    report = _verified(name, faults)
    msg = report_to_proto(report)
    row = msg.parameters[0]
    row.gradient.extend([float("nan"), float("inf"), -0.0])
    row.reference.extend([float("-inf"), 1e-300])
    kept = msg.SerializeToString(deterministic=True)
    expected = json_format.MessageToDict(msg, preserving_proto_field_name=True, unquote_int64_if_possible=True,
                                         always_print_fields_with_no_presence=True)
    got = message_to_dict(msg)
    assert json.dumps(got) == json.dumps(expected)  # NaN != NaN: compare the texts, key order included
    assert got["parameters"][0]["gradient"][-3:] == ["NaN", "Infinity", -0.0]
    assert msg.SerializeToString(deterministic=True) == kept  # the caller's message is left as it was
