"""Complex-step differences against real central ones on planted bugs (issue 43): a tanh MLP whose loss is
scaled and offset so that |L| runs from ~1e-3 to ~1e6 while its gradients stay small (1e-6 .. 1), with one
element of a parameter, or a pair of neighbouring elements in opposite directions (a swap, an off-by-one),
wrong by 10x that element's tolerance (compare.py's model: what a per-element check holds it to). Each is
verified at default options but the symbolic oracle's (off), complex steps on (the default) and off (real
central differences), float64 and float32 engines. Found and localized: verdict FAIL and the one error
finding a rule_error at the planted node.
Prints one line per configuration and a summary per method; exit 1 if complex steps miss any.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_complex_plants.py [--width N]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import load, machine, match_threads  # noqa: E402
from plants import element_bug, mlp, unregister  # noqa: E402

from gradcheck_svc.oracles.finite_diff import FDOptions  # noqa: E402
from gradcheck_svc.oracles.symbolic import SymbolicOptions  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.compare import Tolerance, magnitude  # noqa: E402

LOSSES = [(1e-3, 0.0), (1e-3, 1e4), (1e-6, 1e6), (1.0, 1e6)]  # (scale, offset): |L| ~1e-3 .. 1e6
TARGETS = ["W0", "b1"]


def _tolerance(g, dtype):
    tol = Tolerance.for_dtype(dtype)
    g = np.asarray(g, dtype=np.float64).reshape(-1)
    return tol.absolute(magnitude(g)) + tol.rtol * np.abs(g)


def _found(report, target) -> bool:
    errors = [(f.node, f.cause) for f in report.findings if f.severity == "error"]
    return report.verdict == "fail" and errors == [(f"{target}_bug", "rule_error")]


def one(width, dtype, scale, offset, target, pair, complex_step) -> tuple[bool, float, float]:
    """(found and localized, |L|, seconds) for one plant."""
    graph = {"width": width, "depth": 2, "scale": scale, "offset": offset, "dtype": dtype}
    # the symbolic oracle off: finite differences are the subject (and the only reference at scale)
    options = VerifyOptions(dtype=dtype, fd=FDOptions(method="complex" if complex_step else "central"),
                            symbolic=SymbolicOptions(enabled=False))
    clean = verify(mlp(**graph), options)
    g = next(p for p in clean.parameters if p.name == target).gradient
    i = g.size // 3
    delta = np.zeros(g.shape)
    e = 10 * _tolerance(g, dtype)
    delta.reshape(-1)[i] = e[i] if not pair else max(e[i], e[i + 1])
    if pair:
        delta.reshape(-1)[i + 1] = -delta.reshape(-1)[i]
    op = element_bug(delta)
    try:
        t0 = time.perf_counter()
        report = verify(mlp(bugs={target: op}, **graph), options)
        seconds = time.perf_counter() - t0
    finally:
        unregister(op)
    return _found(report, target), abs(clean.loss), seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run (width 8): bench/run_all.py --quick")
    args = ap.parse_args()
    if args.quick:
        args.width = 8
    match_threads(1)
    print(machine())
    totals = {True: [0, 0], False: [0, 0]}
    for complex_step in (True, False):
        for dtype in ("float64", "float32"):
            for scale, offset in LOSSES:
                for pair in (False, True):
                    for target in TARGETS:
                        ok, loss, s = one(args.width, dtype, scale, offset, target, pair, complex_step)
                        totals[complex_step][0] += 1
                        totals[complex_step][1] += ok
                        print(f"{'complex' if complex_step else 'central'} {dtype} |L| {loss:.2g} scale {scale:g} "
                              f"{'pair' if pair else 'element'} {target}: {'found' if ok else 'MISSED'} ({s:.2f} s)",
                              flush=True)
    for method, (n, found) in totals.items():
        print(f"{'complex step' if method else 'central differences'}: planted {n}, found and localized {found}")
    print(load())
    return 0 if totals[True][0] == totals[True][1] else 1


if __name__ == "__main__":
    sys.exit(main())
