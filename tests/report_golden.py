"""Golden JSON reports: every bundled example (and each bug-zoo case) verified by `gradcheck-svc verify
--format json`, its run-dependent values (timings, the symbolic oracle's seconds) masked, so that a
refactoring of how results are held can be checked to leave the JSON report -- a contract -- unchanged.

    python tests/report_golden.py OUTDIR [NAME ...]   writes OUTDIR/NAME.json for each case (all by default)

tests/verify/test_report_golden.py compares a handful of cheap cases with the files kept in tests/golden/.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MASK = "<masked>"


def cases() -> dict:
    """name -> the `gradcheck-svc verify` arguments of each case: every example under each FD mode, in
    float32 as well, and every bug-zoo case with its options."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from run_examples import cli_flags

    out = {}
    clean = sorted(p for p in (EXAMPLES / "graphs").glob("*.json")) + sorted((EXAMPLES / "onnx").glob("*.onnx"))
    for path in clean:
        for extra in ((), ("--fd", "full"), ("--fd", "projection"), ("--fd", "joint"), ("--dtype", "float32")):
            if path.stem == "chain_256" and extra == ("--fd", "full"):
                continue  # 512 tensors in full: over the per-request time limit
            out["-".join((path.stem, *extra[1:]))] = [str(path), *extra]
    for stem, fd in (("swish_custom_wrong", "joint"), ("swish_custom_wrong", "projection"), ("seed", "joint")):
        out[f"{stem}-{fd}-nosym"] = [str(EXAMPLES / "graphs" / f"{stem}.json"), "--fd", fd, "--symbolic", "off"]
    zoo = json.loads((EXAMPLES / "graphs" / "faults" / "manifest.json").read_text())["cases"]
    for i, case in enumerate(zoo):
        out[f"zoo{i:02d}-{Path(case['graph']).stem}"] = [str(EXAMPLES / "graphs" / "faults" / case["graph"]),
                                                         *cli_flags(case.get("options", {})).split()]
    return out


def masked(d):
    """The report with what differs from run to run replaced by MASK."""
    if isinstance(d, dict):
        d = dict(d)
        if "timings" in d:
            d["timings"] = {k: MASK for k in d["timings"]}
        if isinstance(d.get("symbolic"), dict) and "seconds" in d["symbolic"]:
            d["symbolic"] = {**d["symbolic"], "seconds": MASK}
        return {k: masked(v) for k, v in d.items()}
    if isinstance(d, list):
        return [masked(v) for v in d]
    return d


def report(args: list[str]) -> dict:
    """The masked JSON report (or the error) `gradcheck-svc verify ARGS --format json` prints, in process."""
    from gradcheck_svc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["verify", *args, "--format", "json"])
    text = out.getvalue()
    return {"exit": code, "report": masked(json.loads(text)) if text.strip() else None,
            "stderr": err.getvalue() if not text.strip() else ""}


if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    all_cases = cases()
    for name in sys.argv[2:] or all_cases:
        (outdir / f"{name}.json").write_text(json.dumps(report(all_cases[name]), indent=1) + "\n")
        print(name, flush=True)
