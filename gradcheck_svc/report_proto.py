"""A Report as the gradcheck.v1 Report message: what the server answers, and what the client's Report is
read from (the proto Report mirrors Report.to_dict() field for field, same snake_case names)."""
from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

from gradcheck.v1 import service_pb2

from .verify.report import Report

__all__ = ["client_report", "report_to_proto"]


def report_to_proto(report: Report) -> service_pb2.Report:
    """The JSON report's values, field by field into the proto Report: one builder, so every
    JSON key reaches the proto under its name (tests/server/test_server.py checks it), without
    json_format.ParseDict, whose generic JSON-mapping parser cost more than verifying a small
    graph."""
    msg = service_pb2.Report()
    _fill(msg, _elements_only(report.to_dict()))
    msg.text = report.to_text()
    return msg


def _elements_only(d: dict) -> dict:
    """The proto WorstElement indexes an element (repeated int64); a finding judged along random directions
    (diagnosis.classify: a projection check) has a direction, ["direction", j], for its worst: not an element,
    so the proto leaves its worst_element out (the text still names it) rather than fail to build the answer."""
    findings = d.get("findings") or []
    if not any(f.get("worst_element") and any(isinstance(i, str) for i in f["worst_element"]["index"])
               for f in findings):
        return d
    return {**d, "findings": [{**f, "worst_element": None} if f.get("worst_element") and
                              any(isinstance(i, str) for i in f["worst_element"]["index"]) else f for f in findings]}


_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}  # jsonnum's spellings
_MESSAGE, _FLOATS = FieldDescriptor.TYPE_MESSAGE, (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def _scalar(field, v):
    if field.type in _FLOATS:
        return _SPECIAL[v] if isinstance(v, str) else v
    return v


def _fill(msg, d: dict) -> None:
    """Set msg's fields from a dict shaped as the protobuf JSON mapping of msg (field names as
    keys; None: unset; keys without a field: ignored, as ParseDict(ignore_unknown_fields))."""
    fields = msg.DESCRIPTOR.fields_by_name
    for key, v in d.items():
        field = fields.get(key)
        if field is None or v is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target, value_field = getattr(msg, key), field.message_type.fields_by_name["value"]
            for k, item in v.items():
                if value_field.type == _MESSAGE:
                    _fill(target[k], item)
                else:
                    target[k] = _scalar(value_field, item)
        elif field.is_repeated:
            target = getattr(msg, key)
            if field.type == _MESSAGE:
                for item in v:
                    _fill(target.add(), item)
            elif field.type in _FLOATS and str not in set(map(type, v)):  # C-speed: 1,000 values a gradient
                target.extend(v)
            else:
                target.extend([_scalar(field, item) for item in v])
        elif field.type == _MESSAGE and field.message_type.full_name == "google.protobuf.Struct":
            getattr(msg, key).update(v)
        elif field.type == _MESSAGE:
            _fill(getattr(msg, key), v)
        else:
            setattr(msg, key, _scalar(field, v))


def client_report(report: Report, id: str = ""):
    """The client's Report of a report made here, exactly as a server's answer reads (through the proto
    Report): in process and through a server, one request gives the same Report."""
    from gradcheck_core.report import Report as ClientReport

    return ClientReport.from_proto(report_to_proto(report), id=id)
