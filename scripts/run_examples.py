"""`make run`: verify every bundled example graph and print its report.

Examples outside examples/graphs/faults/ must pass. The bug zoo under
faults/ is driven by faults/manifest.json: each case (a graph, options such
as --fault, and the expected verdict, node and cause -- or the expected
error) must come out as expected. Exits non-zero if any does not.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from gradcheck_svc.engine import parse_fault
from gradcheck_svc.errors import GradcheckError
from gradcheck_svc.graph import load_graph
from gradcheck_svc.ops import get_op
from gradcheck_svc.verify import VerifyOptions, verify

ROOT = Path(__file__).resolve().parent.parent / "examples" / "graphs"
FAULTS = ROOT / "faults"


def zoo_options(options: dict) -> VerifyOptions:
    o = dict(options)
    o["faults"] = tuple(parse_fault(f) for f in o.get("faults", ()))
    return VerifyOptions(**o)


def cli_flags(options: dict) -> str:
    """The zoo options as the `gradcheck-svc verify` flags that reproduce the case."""
    parts = []
    for key, value in options.items():
        if key == "faults":
            parts += [f"--fault {f}" for f in value]
        elif key == "localize":
            parts += [] if value else ["--no-localize"]
        elif value is True:
            parts.append("--" + key.replace("_", "-"))
        else:
            parts.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


def run_case(case: dict) -> tuple[bool, str]:
    """(as expected, text) for one bug-zoo case."""
    expect = case["expect"]
    try:
        report = verify(load_graph(FAULTS / case["graph"]), zoo_options(case.get("options", {})))
    except GradcheckError as exc:
        return "error" in expect and exc.message.startswith(expect["error"]), f"error: {exc.message}"
    if "error" in expect:
        return False, report.to_text()
    hit = any(f.node == expect["node"] and f.cause == expect["cause"] and f.severity == expect["severity"]
              for f in report.findings)
    return hit and report.verdict == expect["verdict"], report.to_text()


def main() -> int:
    unexpected = 0
    for path in sorted(ROOT.rglob("*.json")):
        if FAULTS in path.parents:
            continue
        report = verify(load_graph(path))
        print(f"== {path.relative_to(ROOT.parent.parent)} (expected pass)")
        print(report.to_text())
        print()
        unexpected += report.verdict != "pass"
    for case in json.loads((FAULTS / "manifest.json").read_text())["cases"]:
        flags = cli_flags(case.get("options", {}))
        print(f"== gradcheck-svc verify examples/graphs/faults/{case['graph']} {flags} (expected {case['expect']})")
        if case.get("requires_op") and get_op(case["requires_op"]) is None:
            print(f"skipped: op '{case['requires_op']}' is not registered in this build\n")
            continue
        ok, text = run_case(case)
        print(text)
        print()
        unexpected += not ok
    print(f"{unexpected} example(s) with an unexpected outcome")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
