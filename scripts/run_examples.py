"""`make run`: start a real server on a free loopback port, verify every bundled
example through the client over gRPC, print the reports, stop the server.

Examples under examples/graphs/faults/ or named *_wrong.json carry planted
bugs and are expected to fail; everything else is expected to pass. Exits
non-zero if any example's verdict is not the expected one.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]  # run from a checkout without installing

from gradcheck_client import Client, VerifyError, load_graph  # noqa: E402
from gradcheck_svc.server.launcher import LocalServer  # noqa: E402

EXAMPLES = ROOT / "examples" / "graphs"


def expected(path: Path) -> str:
    return "fail" if "faults" in path.parts or path.stem.endswith("_wrong") else "pass"


def main() -> int:
    paths = sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".json", ".pb"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:2] + [os.environ.get("PYTHONPATH", "")]))
    with LocalServer("--workers", str(min(4, os.cpu_count() or 1)), env=env) as server:
        print(f"gradcheck-svc listening on {server.target} (pid {server.pid})\n")
        unexpected = 0
        with Client(server.target, timeout=300) as client:
            for path in paths:
                name = path.relative_to(ROOT)
                try:
                    report = client.verify(load_graph(path), id=str(name))
                except VerifyError as exc:
                    print(f"== {name} (expected {expected(path)})\n{exc.code.name}: {exc.message}\n")
                    unexpected += 1
                    continue
                print(f"== {name} (expected {expected(path)})")
                print(report)
                print()
                unexpected += report.verdict != expected(path)
    print(f"{len(paths)} example(s) verified over gRPC; {unexpected} with an unexpected verdict")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
