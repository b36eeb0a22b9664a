"""`make run`: verify every bundled example graph and print its report.

Examples under examples/graphs/faults/ carry planted bugs and are expected to
fail; everything else is expected to pass. Exits non-zero if any example's
verdict is not the expected one.
"""
from __future__ import annotations

import sys
from pathlib import Path

from gradcheck_svc.graph import load_graph
from gradcheck_svc.verify import verify

ROOT = Path(__file__).resolve().parent.parent / "examples" / "graphs"


def main() -> int:
    unexpected = 0
    for path in sorted(ROOT.rglob("*.json")):
        expect = "fail" if "faults" in path.parts or path.stem.endswith("_wrong") else "pass"
        report = verify(load_graph(path))
        print(f"== {path.relative_to(ROOT.parent.parent)} (expected {expect})")
        print(report.to_text())
        print()
        unexpected += report.verdict != expect
    print(f"{unexpected} example(s) with an unexpected verdict")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
