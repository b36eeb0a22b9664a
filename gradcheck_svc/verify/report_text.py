"""The text report's parameter table and timings line.

Each error column names the reference it compares against, the status column is the row as
the verdict sees it (verdict.py), and the worst element is shown against the verdict's own
reference, so the table and the verdict line above it never disagree. Long parameter lists
show the worst TEXT_ROWS rows and a count of the rest (the JSON report lists every one).
"""
from __future__ import annotations

import math

import numpy as np
from gradcheck_core.report import row_label

from ..oracles.fd_modes import FDMode
from .parameter_result import Screen

REFERENCE_NAMES = {"symbolic": "the symbolic gradient (exact)", "finite_differences": "finite differences"}


def _badness(p) -> tuple:
    """Sort key, worst first: failing rows, then explained ones, then by error over tolerance."""
    c, tol = p.verdict_comparison, p.tolerance
    scale = tol.atol + tol.rtol * abs(c.reference_at_worst) if math.isfinite(c.reference_at_worst) else 1.0
    ratio = c.max_abs_error / scale if scale > 0 else c.max_abs_error
    rank = 0 if p.status in ("FAIL", "undecided") else 1 if p.status.startswith("ok (") else 2
    return rank, -(ratio if not math.isnan(ratio) else math.inf)


def _worst(p) -> str:
    c, fd = p.verdict_comparison, p.fd
    what = "direction" if fd.mode is FDMode.PROJECTION else "joint direction" if fd.mode is FDMode.JOINT and \
        p.symbolic is None else "index"
    text = f"{what} {list(c.worst_index)}: {c.engine_at_worst:.8g} vs {c.reference_at_worst:.8g}"
    if p.symbolic is None and fd.error.size:
        worst = fd.comparison.worst_index
        flat = np.ravel_multi_index(worst, fd.error.shape) if worst else 0
        text += f" ± {float(fd.error.reshape(-1)[flat]):.2g}"  # the FD reference's own error bound
    if len(fd.unconfirmed):
        text += f"; {len(fd.unconfirmed)} more off on the first pass, not refined (not compared)"
    return text


def _status(p) -> str:
    return row_label(p.status, p.passed, p.failed_by)


def parameter_table(params: list, max_rows: int) -> list[str]:
    reference = params[0].verdict_reference
    subject = "claimed" if params[0].claim else "engine"  # the claimed gradients (verify/claims.py) or the engine's
    lines = [f"parameters, judged against {REFERENCE_NAMES[reference]}; abs/rel err: {subject} vs finite "
             f"differences, vs sym: {subject} vs symbolic, fd vs sym: finite differences vs symbolic"]
    width = max(9, *(len(p.name) for p in params))
    lines.append(f"{'parameter':<{width}}  {'shape':<12} {'fd':<10} {'abs err(fd)':>11} {'rel err(fd)':>11} "
                 f"{'abs err(sym)':>12} {'fd vs sym':>10}  {'status':<16} worst element ({subject} vs "
                 f"{'symbolic' if reference == 'symbolic' else 'FD'})")
    shown = sorted(params, key=_badness)[:max_rows] if len(params) > max_rows else params
    for p in shown:
        sc, fs = (p.symbolic.comparison, p.symbolic.fd_vs_symbolic) if p.symbolic is not None else (None, None)
        c = p.fd.comparison
        vs_sym = f"{sc.max_abs_error:>12.3g}" if sc is not None else f"{'-':>12}"
        fd_sym = (f"{fs.max_abs_error:>10.3g}" if fs.passed else f"{'FAIL ' + format(fs.max_abs_error, '.3g'):>10}") \
            if fs is not None else f"{'-':>10}"
        lines.append(f"{p.name:<{width}}  {list(p.shape)!s:<12} {p.fd.mode.value:<10} {c.max_abs_error:>11.3g} "
                     f"{c.max_rel_error:>11.3g} {vs_sym} {fd_sym}  {_status(p):<16} {_worst(p)}")
    rest = [p for p in params if p not in shown]
    if rest:
        counts = {}
        for p in rest:
            counts[p.status] = counts.get(p.status, 0) + 1
        lines.append(f"... {len(rest)} more parameters ({', '.join(f'{n} {s}' for s, n in counts.items())}); "
                     "the JSON report (--format json) lists every one")
    return lines


def screen_lines(params: list) -> list[str]:
    """What the joint screen did, when it ran: how many it screened and flagged, how the rest were checked."""
    screened = [p for p in params if p.fd.screen is not Screen.NONE]
    if not screened:
        return []
    cleared = next((p for p in screened if p.fd.screen is Screen.CLEARED), None)  # its reference: the k values
    flagged = sum(p.fd.screen in (Screen.FLAGGED, Screen.NARROWED) for p in screened)
    by_screen = sum(p.fd.screen is Screen.BY_SCREEN for p in screened)
    rest: dict = {}
    for p in params:
        if p.fd.screen is Screen.NONE:
            rest[p.fd.mode.value] = rest.get(p.fd.mode.value, 0) + 1
    how = f" ({len(cleared.fd.reference)} directions spanning them all)" if cleared is not None else ""
    rest_text = ", ".join(f"{n} {mode}" for mode, n in rest.items())
    spared = (f", {by_screen} flagged and decided by their own directional values alone (elements not checked "
              "one by one: the follow-up's budget)") if by_screen else ""
    return [f"finite differences: {len(screened)} parameters screened jointly{how}, {flagged} flagged and "
            f"checked on their own{spared}" + (f"; {rest_text}" if rest_text else "")]


# an ONNX LSTM/GRU/RNN's W, R or B: torch's tensors of each direction stacked, the gate blocks reordered
RNN_RELATIONS = {"lstm_gates": "gate blocks in ONNX's order i, o, f, c (torch's: i, f, g, o)",
                 "gru_gates": "gate blocks in ONNX's order z, r, h (torch's: r, z, n)",
                 "rnn_stacked": "each as torch's"}


def _names(entry: dict) -> str:
    name = entry["name"] or f"a tensor the exporter made ('{entry['onnx_name']}')"
    if entry["relation"] == "tied":  # the exporter's copy, computed from the parameter in the graph (ties.py)
        return f"{name} (also read as the exporter's copy '{entry['onnx_name']}', tied: its reads' gradients summed)"
    if entry["relation"] in ("transposed", "reshaped"):
        return f"{name} {entry['relation']}"
    # derived: the tensor takes that parameter's place, computed by the exporter (BatchNorm folded into
    # the Conv's weight; the bias that folding makes has no name: the Conv may have none)
    return f"the exporter's tensor in {name}'s place" if entry["relation"] == "derived" and entry["name"] else name


def source_name_lines(params: list, max_rows: int, max_readers: int = 6) -> list[str]:
    """One line per parameter whose names in the model's framework say more than its own: which torch
    parameters it stands for (merged: its gradient is the sum of theirs; transposed; derived: none of
    theirs), and the nodes that read it."""
    rows = [p for p in params if p.source_names]
    if not rows:
        return []
    lines = ["names in the framework that made the model (source_names; docs/onnx.md):"]
    for p in rows[:max_rows]:
        entries = [s.to_dict() for s in p.source_names]
        shown = list(dict.fromkeys(_names(e) for e in entries))
        readers = list(dict.fromkeys(n for e in entries for n in e["read_by"]))
        what = " + ".join(shown)
        kept = [e for e in entries if e["relation"] not in ("derived", "tied")]
        rnn = [RNN_RELATIONS[e["relation"]] for e in kept if e["relation"] in RNN_RELATIONS]
        if rnn:
            biases = " (input then hidden bias)" if any(".bias_" in n for n in shown) else ""
            what = f"{', '.join(shown)} stacked by direction{biases}, {rnn[0]}"
        elif len({(e["name"], e["relation"]) for e in kept}) > 1:
            what += ": merged by the exporter, its gradient is the sum of theirs"
        elif any(e["relation"] == "derived" for e in entries):
            what += ": its gradient is no torch parameter's"
        more = f" and {len(readers) - max_readers} more" if len(readers) > max_readers else ""
        lines.append(f"  {p.name} = {what}; read by {', '.join(readers[:max_readers])}{more}")
    if len(rows) > max_rows:
        lines.append(f"  ... {len(rows) - max_rows} more (the JSON report lists every one)")
    return lines


def timings_line(timings: dict) -> str:
    """`*_s` keys are seconds: printed as seconds, so the text and the JSON say the same."""
    return "timings: " + ", ".join(f"{k} {v:.3g}" for k, v in timings.items()) + " (seconds)"


def plan_line(plan: dict) -> str:
    """The finite-difference plan (Report.fd_plan's dict) and its cost, one line."""
    modes = ", ".join(f"{n} {m}" for m, n in plan["parameters"].items()) or "no parameter reaching the loss"
    if set(plan["parameters"]) - {"full"}:
        why = plan.get("directions_why")
        modes += f" ({plan['directions']} directions{': ' + why if why else ''})"
    return (f"finite-difference plan: {plan['mode']}: {modes}; first pass "
            f"{plan['forwards']:,} perturbed forwards, {plan['values']:.3g} values "
            f"(~{plan['whole_graph_evaluations']:.3g} whole-graph forwards){_methods(plan)}{_stand_in(plan)}")


def _stand_in(plan: dict) -> str:
    """The parameters the screen judged through the engine's float64 gradient (verify/stand_in.py)."""
    names = list(plan.get("stand_in") or {})
    if not names:
        return ""
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return (f"; the screen judged the engine's float64 gradient in place of {shown} where each element is within "
            "its tolerance of it")


def _methods(plan: dict) -> str:
    """The plan's methods per parameter, counted, and what keeps any on central differences."""
    methods = plan.get("method") or {}
    if not methods:
        return ""
    counts = {m: sum(1 for v in methods.values() if v == m) for m in ("complex", "central")}
    out = "; " + ", ".join(f"{n} by {'complex step' if m == 'complex' else 'central differences'}"
                           for m, n in counts.items() if n)
    why = plan.get("method_fallback") or {}
    if why and counts["complex"]:
        out += " (" + "; ".join(f"{p}: {v}" for p, v in list(why.items())[:4]) + \
            (" ..." if len(why) > 4 else "") + ")"
    return out
