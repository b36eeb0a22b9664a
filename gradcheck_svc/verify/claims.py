"""Claimed gradients and adjoints as the subject of a verification.

A graph may carry the gradients other code computed for it (graph.ir.Claims: a hand-written NumPy
backward, another framework, a device's training step). Then those are what is verified: run.py
compares each claimed gradient with the same references (symbolic, finite differences, refined
the same way) under the same tolerances as it would the engine's, and the engine's own gradient is
a third witness (`vs_engine`). The references never change; only the thing under test does.

A parameter without a claimed gradient is "not provided": its row fails (an incomplete claim is
not a verified one) and a warning says which.

Localization under claims needs no engine adjoint: where the claim carries adjoints (dL/dv at
nodes), walking from the loss backwards, each value v with a claimed adjoint (or gradient) is held
to what its consumers' own forwards say it must be given their claimed output adjoints,

    dL/dv  =  sum over consumers C of  J_C(v)^T dL/dC     (+ 1 for the loss itself),

with J_C^T a taken by float64 finite differences of C's forward alone (finite_diff.local_vjp,
refined on its ladder where it disagrees: the same local check localize.py makes of the engine's
contributions). The first v that disagrees names its consumer as the culprit (a `rule_error` of
the claimed backward there); with several consumers, only their sum is claimed, so all are named.
A value whose consumer has no claimed adjoint, or sits at a declared kink, is not checked.
"""
from __future__ import annotations

import numpy as np

from ..oracles.finite_diff import Refined, local_vjp, refine_local_vjp
from .compare import Tolerance, compare
from .diagnosis.classify import near_kink
from .diagnosis.localize import consumers_of, local_directions
from .fd_check import fd_check
from .findings import Finding, WorstElement, parameters_through

from .parameter_result import NOT_PROVIDED, PROVIDED

__all__ = ["NOT_PROVIDED", "PROVIDED", "localize_claims"]


def localize_claims(graph, fd, results, tol: Tolerance, dtype: str = "float64", rounding=None) -> list[Finding]:
    """The first node (from the loss backwards) whose claimed adjoints disagree with its own local
    derivative, for the failing claimed parameters (module docstring); [] without claimed adjoints.
    dtype: the claims' (a float32 forward may take another piece near a kink); rounding(v): whether v's
    disagreement is float32 rounding (diagnosis/claimed.py), which names no culprit."""
    failing = [r.name for r in results if r.claim == PROVIDED and not r.passed]
    if not failing or not graph.claims.adjoints:
        return []
    program = fd.program  # float64, at the forward's values (fd.base)
    seed = _wrong_seed(program, graph.claims.adjoints, tol, failing)
    if seed is not None:
        return [seed]
    known = {**graph.claims.adjoints, **graph.claims.gradients}
    known.setdefault(program.output, np.ones(program.shapes[program.output]))
    consumers = consumers_of(program)
    position = {s.name: i for i, s in enumerate(program.steps)}
    down = program.downstream(failing)
    order = sorted((v for v in known if v in consumers and v in down),
                   key=lambda v: -min(position[s.name] for s, _ in consumers[v]))
    for v in order:
        if any(s.name not in known or near_kink(s, [fd.base[n] for n in s.inputs], fd.frozen, dtype)
               for s, _ in consumers[v]):
            continue  # undecided here: a consumer's claimed adjoint is missing, or it sits at a kink
        check, dirs = consistency(fd, consumers[v], v, known, tol)
        if check.passed or (rounding is not None and rounding(v)):
            continue
        return [_culprit(program, v, consumers[v], check, dirs, failing)]
    return []


def _wrong_seed(program, adjoints: dict, tol: Tolerance, failing: list[str]) -> Finding | None:
    """The loss's own claimed adjoint, when it is not dL/dL = 1: the backward's seed is wrong."""
    loss = program.output
    if loss not in adjoints or compare(adjoints[loss], np.ones_like(adjoints[loss]), tol).passed:
        return None
    value = float(np.asarray(adjoints[loss]).reshape(-1)[0])
    step = program.by_name.get(loss)
    return Finding(loss, step.op.name if step is not None else "input", "rule_error", "error",
                   f"the claimed backward is wrong at its seed: the claimed adjoint of the loss is {value:.8g}, "
                   "while dL/dL is 1", list(failing), WorstElement((), value, 1.0))


def consistency(fd, consumers: list, v: str, known: dict, tol: Tolerance):
    """v's claimed adjoint against the sum of its consumers' local vjps of their claimed adjoints."""
    shape = fd.program.shapes[v]
    dirs = local_directions(int(np.prod(shape, dtype=np.int64)))
    parts = []
    for s, k in consumers:
        xs = [fd.base[n] for n in s.inputs]
        a = np.broadcast_to(np.asarray(known[s.name], dtype=np.float64), fd.program.shapes[s.name])
        parts.append((s, k, xs, a))
    refs = [local_vjp(s, xs, k, a, dirs) for s, k, xs, a in parts]
    ref, noise = sum(r for r, _ in refs), sum(n for _, n in refs)
    claimed = np.broadcast_to(known[v], shape).reshape(-1)

    def refine(which, settled=None):
        got = [refine_local_vjp(s, xs, k, a, dirs, which, settled if len(parts) == 1 else None)
               for s, k, xs, a in parts]
        return Refined(got[0].which, sum(g.values for g in got), sum(g.error for g in got), got[0].step,
                       got[0].method)
    # held to the verification's tolerance (its dtype's): a float32 backward's adjoints carry its rounding
    return fd_check(claimed if dirs is None else dirs @ claimed, ref, noise, tol, refine), dirs


def _culprit(program, v: str, consumers: list, check, dirs, failing: list[str]) -> Finding:
    cmp = check.comparison
    shape = program.shapes[v]
    if dirs is None:
        where = list(np.unravel_index(cmp.worst_index[0], shape)) if shape else []
        where = [int(i) for i in where]
    else:
        where = ["direction", int(cmp.worst_index[0])]
    steps = list(dict.fromkeys(s.name for s, _ in consumers))
    node = steps[0] if len(steps) == 1 else v
    op = program.by_name[node].op.name if node in program.by_name else "input"
    rule = ("its local derivative applied to the claimed adjoint of its output" if len(steps) == 1 else
            "the local derivatives of its consumers " + ", ".join(f"'{s}'" for s in steps) +
            " (one of them is wrong; only their sum is claimed) applied to their claimed adjoints")
    detail = (f"the claimed backward is wrong here: the claimed gradient reaching '{v}' at {where} is "
              f"{cmp.engine_at_worst:.8g}, while {rule} gives {cmp.reference_at_worst:.8g} (off by "
              f"{abs(cmp.engine_at_worst - cmp.reference_at_worst):.3g}; checked by finite differences of the "
              "forward alone, in float64)")
    through = parameters_through(program, node)
    affected = [p for p in failing if p in through] or list(failing)
    return Finding(node, op, "rule_error", "error", detail, affected,
                   WorstElement(tuple(where), cmp.engine_at_worst, cmp.reference_at_worst))
