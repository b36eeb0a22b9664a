"""The server's Report proto is built field by field from the JSON report (no JSON-mapping
parse): it must be exactly the message json_format.ParseDict makes of the same report,
NaN/Inf spellings, maps of messages and unset optionals included."""
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


@pytest.mark.parametrize("name, faults", CASES, ids=[f"{n}-{len(f)}" for n, f in CASES])
def test_report_proto_equals_the_json_mapping_of_the_report(name, faults):
    report = verify(load_graph(EXAMPLES / name), VerifyOptions(faults=tuple(parse_fault(f) for f in faults)))
    expected = json_format.ParseDict(report.to_dict(), service_pb2.Report(), ignore_unknown_fields=True)
    expected.text = report.to_text()
    got = report_to_proto(report)
    assert got == expected
    assert got.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
