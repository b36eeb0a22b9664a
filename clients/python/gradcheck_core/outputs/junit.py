"""JUnit XML: <testsuites> around one <testsuite>, one <testcase> per graph with its time in seconds
and its file; the report once, in the <failure> of a failing graph or the <system-out> of a passing one.

Written by ElementTree (which escapes markup); every string goes through `xml.chars` first.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from .xml import MAX_TEXT, chars


def _properties(case: ET.Element, o) -> None:
    """The verdict, its subject and each finding (its cause, node and line) as the test case's properties."""
    props = ET.SubElement(case, "properties")

    def prop(name, value):
        ET.SubElement(props, "property", name=name, value=chars(value))
    prop("verdict", o.report.verdict)
    # what the verdict is on: "engine", or "claimed" (gradients other code computed, sent with the graph)
    prop("subject", o.report.data.get("subject") or "engine")
    for f in o.report.findings:
        prop("cause", f.cause)
        prop("node", f.node)
        prop("finding", f"{f.severity}: {f}")


def junit_xml(outcomes: list, reports: bool = True) -> str:
    """`reports`: each case's properties and report text (False: the verdicts alone, guard.py's fallback)."""
    failures, errors = sum(o.status == "fail" for o in outcomes), sum(o.report is None for o in outcomes)
    total = f"{sum(o.seconds for o in outcomes):.6f}"
    counts = {"tests": str(len(outcomes)), "failures": str(failures), "errors": str(errors), "time": total}
    root = ET.Element("testsuites", name="gradcheck", **counts)
    suite = ET.SubElement(root, "testsuite", name="gradcheck", **counts)
    for o in outcomes:
        # file: the graph's path, which GitHub's and GitLab's reporters link to (no line: a graph file's
        # nodes are not located by line)
        case = ET.SubElement(suite, "testcase", classname="gradcheck", name=chars(o.path), file=chars(o.path),
                             time=f"{o.seconds:.6f}")
        if o.report is None:
            error = chars(o.error, 2000)
            ET.SubElement(case, "error", message=error, type="invalid" if o.invalid else "transport").text = error
            continue
        if not reports:
            if not o.report.passed:
                ET.SubElement(case, "failure", message=chars(o.report.verdict, 80), type="gradient_mismatch")
            continue
        _properties(case, o)
        report = chars(str(o.report), MAX_TEXT, multiline=True)
        # the report once: a failure's body, else the passing case's output (GitLab shows both,
        # so a failing report in <system-out> too would be read twice)
        if not o.report.passed:
            ET.SubElement(case, "failure", message=chars(o.report.summary(), 2000),
                          type="gradient_mismatch").text = report
        else:
            ET.SubElement(case, "system-out").text = report
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
