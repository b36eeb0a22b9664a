"""The user's dtype (issue 42, item 3): what a check says about a function run in float32 (or float16,
bfloat16) beside its float64 check -- never a silent upcast.

The float64 check verifies the gradient of the function's math on float64 copies of the arguments. A
function run in a narrower dtype computes other values: `sum((x + 1e8) - 1e8)` is 0 in float32 for every
small x, so its float32 values have derivative 0 while its float64 gradient is 1. values_in_dtype runs the
reduced loss both ways at x and at x +- h v (v a seeded direction, h = cbrt(eps_d) max(1, |x|), the same
step both ways, so their difference quotients differ by rounding alone) and measures that rounding:
delta = the largest |L_d - L_64| seen, plus eps_d times the loss's |terms|. Then

- the dtype's difference quotient resolves the derivative when its rounding error delta / h is at most
  RESOLVE (5%) of max(|D_64|, the float64 quotient's scale): "pass", the float32 values follow the float64
  derivative; otherwise "undecided": in that dtype the function's values do not resolve its derivative
  (torch's gradcheck, differencing in that dtype, fails such a function), never "pass".

The result is an entry (verdict, detail) the doors put in report.data["dtypes"] and the report's first
line (with_dtypes); a non-passing entry makes a passing report undecided or keeps it failed.
"""
from __future__ import annotations

import numpy as np

RESOLVE = 0.05
EPS = {"float64": float(np.finfo(np.float64).eps), "float32": float(np.finfo(np.float32).eps),
       "float16": float(np.finfo(np.float16).eps), "bfloat16": 2.0 ** -7}


def values_in_dtype(loss, dtype: str, h: float) -> dict:
    """loss(t, narrow) -> (the reduced loss at x + t v, its sum of |terms|), run in `dtype` (narrow True) or in
    float64: the entry for f's values in that dtype (module docstring)."""
    runs = {t: (loss(t, True), loss(t, False)) for t in (0.0, h, -h)}
    eps = EPS[dtype]
    delta = max(abs(d - w) + eps * max(md, mw) for (d, md), (w, mw) in runs.values())
    narrow = (runs[h][0][0] - runs[-h][0][0]) / (2 * h)
    wide = (runs[h][1][0] - runs[-h][1][0]) / (2 * h)
    scale = abs(wide)  # (a derivative 0 along v cannot be resolved by any rounding: undecided, not pass)
    error = delta / h
    where = (f"in {dtype}, along a seeded direction at step {h:.2g}: the difference quotient {narrow:.6g}, "
             f"float64's {wide:.6g}, {dtype} rounding +- {error:.2g} (the loss {runs[0.0][0][0]:.8g} in {dtype}, "
             f"{runs[0.0][1][0]:.8g} in float64)")
    if error <= RESOLVE * scale and np.isfinite(narrow):
        return {"dtype": dtype, "verdict": "pass", "detail": f"its values follow the float64 derivative {where}"}
    return {"dtype": dtype, "verdict": "undecided",
            "detail": f"its values do not resolve its derivative {where}: the float64 check does not speak for "
                      f"the {dtype} function"}


def with_dtypes(report, entries: list, ran: str) -> None:
    """The dtype entries in the report: data["dtypes"], a first line saying what ran in which dtype, and the
    verdict -- a failing entry fails it, an undecided one leaves a passing report undecided."""
    report.data["dtypes"] = {"ran": ran, "checks": entries}
    lines = [f"dtypes: {ran}"] + [f"  in {e['dtype']}: {e['verdict'].upper()}: {e['detail']}" for e in entries]
    verdicts, before = {e["verdict"] for e in entries}, report.verdict
    if "fail" in verdicts:
        report.verdict = report.data["verdict"] = "fail"
    elif "undecided" in verdicts and report.verdict == "pass":
        report.verdict = report.data["verdict"] = "undecided"
    if report.verdict != before:
        lines[0] += f" -- verdict {report.verdict.upper()} (the float64 check's own below is {before.upper()})"
    report.text = "\n".join(lines) + "\n" + report.text


def numpy_entry(f, args: list, which: list, names: list, cotangent, seed: int) -> dict | None:
    """The NumPy door (check_call.trace_function): when a checked argument is narrower than float64, f run on
    the arguments as given (their dtype) against f on float64 copies, both at the same rounded points; None
    when every checked argument is float64 (nothing narrower is run)."""
    from gradcheck_core import faithful

    narrow = sorted(({str(np.asarray(args[i]).dtype) for i in which} - {"float64"}) & set(EPS))
    if not narrow:
        return None
    rng = np.random.default_rng([seed, 7])
    x = {i: np.asarray(args[i], dtype=np.float64) for i in which}
    v = {i: rng.standard_normal(x[i].shape) for i in which}
    h = float(np.cbrt(EPS[narrow[0]]) * max(1.0, max(float(np.abs(a).max(initial=0)) for a in x.values())))
    state = np.random.get_state()

    def loss(t: float, is_narrow: bool):
        moved = {i: (x[i] + t * v[i]).astype(np.asarray(args[i]).dtype) for i in which}
        run = [(moved[i] if is_narrow else moved[i].astype(np.float64)) if i in which else
               (np.array(a) if isinstance(a, np.ndarray) else a) for i, a in enumerate(args)]
        out = np.asarray(faithful.run_plain(f, run, names, state).output, dtype=np.float64)
        terms = out * (1.0 if cotangent is None else cotangent)
        return float(np.sum(terms)), float(np.sum(np.abs(terms)))
    checked = ", ".join(f"{names[i]} ({np.asarray(args[i]).dtype})" for i in which)
    return {"ran": f"the gradient check below ran in float64 on float64 copies of {checked}; f's own values "
                   f"were run in {', '.join(narrow)} and compared with float64's",
            "checks": [values_in_dtype(loss, narrow[0], h)]}
