"""`make run`: start a real server on a free loopback port, verify every bundled
example through the client over gRPC, print the reports, stop the server.

Examples outside examples/graphs/faults/ must pass, except those named
*_wrong.json (a planted wrong derivative), which must fail. The bug zoo under faults/
is driven by faults/manifest.json: each case (a graph, options such as
--fault, and the expected verdict, node and cause -- or the expected error)
must come out as expected. Exits non-zero if any example does not.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]  # run from a checkout without installing

from gradcheck_client import Client, VerifyError, load_graph  # noqa: E402
from gradcheck_svc.server.launcher import LocalServer  # noqa: E402

EXAMPLES = ROOT / "examples" / "graphs"
FAULTS = EXAMPLES / "faults"


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


def judge(expect: dict, report=None, error: str | None = None) -> bool:
    """Did a bug-zoo case come out as its manifest entry expects? report: an in-process or a
    client Report (both have .verdict and .findings with .node/.cause/.severity)."""
    if error is not None or "error" in expect:
        return error is not None and "error" in expect and error.startswith(expect["error"])
    hit = any(f.node == expect["node"] and f.cause == expect["cause"] and f.severity == expect["severity"]
              for f in report.findings)
    return hit and report.verdict == expect["verdict"]


def zoo_case(client: Client, case: dict) -> tuple[bool, str]:
    """(as expected, text) for one bug-zoo case, verified over gRPC."""
    try:
        report = client.verify(load_graph(FAULTS / case["graph"]), id=case["graph"], **case.get("options", {}))
    except VerifyError as exc:
        return judge(case["expect"], error=exc.message), f"error: {exc.message}"
    return judge(case["expect"], report), str(report)


def run_case(case: dict) -> tuple[bool, str]:
    """(as expected, text) for one bug-zoo case, verified in-process (the tests use this)."""
    from gradcheck_svc.engine import parse_fault
    from gradcheck_svc.errors import GradcheckError
    from gradcheck_svc.graph import load_graph as load_validated
    from gradcheck_svc.verify import VerifyOptions, verify

    options = dict(case.get("options", {}))
    options["faults"] = tuple(parse_fault(f) for f in options.get("faults", ()))
    try:
        report = verify(load_validated(FAULTS / case["graph"]), VerifyOptions(**options))
    except GradcheckError as exc:
        return judge(case["expect"], error=exc.message), f"error: {exc.message}"
    return judge(case["expect"], report), report.to_text()


def main() -> int:
    paths = sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".json", ".pb") and FAULTS not in p.parents)
    cases = json.loads((FAULTS / "manifest.json").read_text())["cases"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:2] + [os.environ.get("PYTHONPATH", "")]))
    unexpected = 0
    with LocalServer("--workers", str(min(4, os.cpu_count() or 1)), env=env) as server:
        print(f"gradcheck-svc listening on {server.target} (pid {server.pid})\n")
        with Client(server.target, timeout=300) as client:
            for path in paths:
                name = path.relative_to(ROOT)
                expect = "fail" if path.stem.endswith("_wrong") else "pass"
                print(f"== {name} (expected {expect})")
                try:
                    report = client.verify(load_graph(path), id=str(name))
                except VerifyError as exc:
                    print(f"{exc.code.name}: {exc.message}\n")
                    unexpected += 1
                    continue
                print(f"{report}\n")
                unexpected += report.verdict != expect
            for case in cases:
                flags = cli_flags(case.get("options", {}))
                print(f"== examples/graphs/faults/{case['graph']} {flags} (expected {case['expect']})")
                ok, text = zoo_case(client, case)
                print(f"{text}\n")
                unexpected += not ok
    print(f"{len(paths) + len(cases)} example(s) verified over gRPC; {unexpected} with an unexpected outcome")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
