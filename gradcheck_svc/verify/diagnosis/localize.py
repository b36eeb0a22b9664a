"""Fault localization: the first node where the engine's gradient goes wrong.

Walking from the loss backwards (reverse topological order), values v on a
path from a failing parameter to the loss have their engine adjoint dL/dv
checked against finite differences that perturb v and re-run only the
downstream part of the graph (FiniteDifferences on an intermediate value;
random projections above a few elements) -- by bisection, then confirmed
locally. A wrong adjoint u whose consumers all have right adjoints locates
the fault in one of u's consumers:
each consumer C's vjp contribution to u is checked against the local
derivative of C's own forward (J_C^T dL/dC, by finite differences of that
one op at the forward's values). The consumer whose contribution disagrees
-- incoming adjoint right, outgoing gradient wrong -- is the faulty node.
If every contribution is right but their sum is wrong, the fault is the
accumulation itself (float32 cancellation).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ...engine.program import Program, Step
from ...oracles.fd_modes import FDMode
from ...oracles.finite_diff import FiniteDifferences, local_vjp, random_directions, refine_local_vjp
from ..compare import Comparison, Tolerance
from ..fd_check import as_referenced, elements_check, fd_check
from ..findings import WorstElement

FULL_UP_TO = 32  # elements: check every element of an adjoint; above, random projections
DIRECTIONS = 8


@dataclass
class LocalCheck:
    """One consumer's vjp contribution to an input, against the local derivative of its forward."""

    step: Step
    k: int  # input index
    engine: np.ndarray  # the contribution the engine's backward produced
    reference: np.ndarray  # J^T a by finite differences, projected on `directions` (or full)
    directions: np.ndarray | None
    comparison: Comparison
    adjoint: np.ndarray  # the incoming adjoint dL/dC used (the engine's, verified right)
    error: np.ndarray  # each reference value's estimated FD error (refined where it failed)
    refine: Callable = field(repr=False, default=None)  # flat indices -> finite_diff.Refined, for more checks


@dataclass
class Located:
    value: str  # first value (walking back from the loss) whose adjoint is wrong
    worst: WorstElement  # in that adjoint (projection mode: a direction index)
    culprit: LocalCheck | None  # the consumer whose contribution is wrong; None: accumulation
    consumers: list[LocalCheck]
    checked: int  # adjoints checked
    copies: int = 0  # perturbed copies of values the finite differences evaluated (fd.copies), checks included


def local_directions(n: int, seed: int = 0, elements=None):
    """Every element up to FULL_UP_TO, else random projections -- and, first, a unit vector at each of
    `elements` (the failing elements of a parameter: per-element evidence, lost in projections)."""
    if n <= FULL_UP_TO:
        return None
    dirs = random_directions(n, DIRECTIONS, seed)
    if elements is None or not len(elements):
        return dirs
    return np.concatenate([_one_hot(n, elements), dirs])


def _one_hot(n: int, elements) -> np.ndarray:
    out = np.zeros((len(elements), n))
    out[np.arange(len(elements)), np.asarray(elements, dtype=np.intp)] = 1.0
    return out


def check_consumer(program: Program, step: Step, k: int, base: dict, adjoints: dict, contributions: dict,
                   tol: Tolerance, elements=None) -> LocalCheck:
    name = step.inputs[k]
    a = np.asarray(adjoints.get(step.name, np.zeros(program.shapes[step.name])), dtype=np.float64)
    a = np.broadcast_to(a, program.shapes[step.name])
    engine = np.asarray(contributions.get((step.name, k), np.zeros(program.shapes[name])), dtype=np.float64)
    xs = [base[n] for n in step.inputs]
    dirs = local_directions(engine.size, elements=elements)
    ref, noise = local_vjp(step, xs, k, a, dirs)
    eng = engine.reshape(-1) if dirs is None else dirs @ engine.reshape(-1)

    def refine(which, settled=None):
        return refine_local_vjp(step, xs, k, a, dirs, which, settled)
    check = fd_check(eng, ref, noise, tol, refine)
    return LocalCheck(step, k, engine, check.reference, dirs, check.comparison, a, check.error, refine)


def localize(program: Program, fd: FiniteDifferences, adjoints: dict, contributions: dict, tol: Tolerance,
             params: list[str], evidence=lambda name: None) -> Located | None:
    """program: the engine's (any dtype); fd: the float64 oracle (its base values are the forward's);
    adjoints/contributions: host float64 copies from backward(keep_adjoints=True).

    Finding a wrong adjoint whose consumers' adjoints are all right: bisect over the values in reverse
    topological order (on a chain, wrong exactly from the faulty node back), then walk from the value
    found towards the loss while one of its consumers is wrong. About log2(n) + fan-out checks, each a
    batched forward of the downstream part only. evidence(name) -> the flat indices of a parameter's
    failing elements (or None): its adjoint and its consumers' contributions are checked at those
    elements one by one, besides the random projections."""
    down = program.downstream(params)
    order = [s.name for s in reversed(program.steps) if s.needs_grad and s.name in down and s.name != program.output]
    order += [p for p in params if p not in order]
    position = {v: i for i, v in enumerate(order)}
    consumers = consumers_of(program)
    copies = fd.copies
    checks: dict[str, Comparison] = {}
    shown: dict[str, bool] = {}  # the adjoint shown right: agreeing, and no value undecidable

    def check(v: str) -> bool:
        if v not in checks:
            checks[v], shown[v] = _adjoint_check(program, fd, adjoints, tol, evidence, v)
        return shown[v]

    # bisect: lo is right (or the loss side), hi is wrong
    hi = next((position[p] for p in reversed(params) if not check(p)), None)
    if hi is None:
        return None
    lo = -1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(order[mid]):
            lo = mid
        else:
            hi = mid
    u = order[hi]
    while True:  # walk towards the loss while a consumer's own adjoint is wrong
        nxt = next((s.name for s, _ in consumers.get(u, ()) if s.name in position and not check(s.name)),
                   None)
        if nxt is None:
            break
        u = nxt
    cmp = checks[u]
    worst = WorstElement(cmp.worst_index, cmp.engine_at_worst, cmp.reference_at_worst)
    local = [check_consumer(fd.program, fd.program.by_name[s.name], k, fd.base, adjoints, contributions, tol,
                            evidence(u)) for s, k in consumers.get(u, ())]
    culprit = next((c for c in local if not c.comparison.passed), None)
    return Located(u, worst, culprit, local, len(checks), fd.copies - copies)


def consumers_of(program: Program) -> dict[str, list[tuple[Step, int]]]:
    """Value -> the (step, input position) pairs whose vjp sends it an adjoint (also verify/claims.py's)."""
    out: dict[str, list[tuple[Step, int]]] = {}
    for s in program.steps:
        if s.needs_grad:
            for k, (i, want) in enumerate(zip(s.inputs, s.grad_inputs)):
                if want:
                    out.setdefault(i, []).append((s, k))
    return out


def _adjoint_check(program: Program, fd: FiniteDifferences, adjoints: dict, tol: Tolerance, evidence,
                   v: str) -> tuple[Comparison, bool]:
    """v's adjoint against finite differences (at its failing elements when evidence names them and v is
    large): the comparison, and whether it shows the adjoint right."""
    engine = np.asarray(adjoints.get(v, np.zeros(program.shapes[v])), dtype=np.float64)
    engine = np.broadcast_to(engine, program.shapes[v])
    elements = evidence(v)
    if elements is not None and engine.size > FULL_UP_TO:
        chk = elements_check(fd, v, engine.reshape(-1), elements, tol)
    else:
        ref = fd.gradient(v, mode=FDMode.FULL if engine.size <= FULL_UP_TO else FDMode.PROJECTION,
                          directions=DIRECTIONS)
        chk = fd_check(as_referenced(ref, engine), ref.reference, ref.noise, tol,
                       lambda which, settled: fd.refine(v, ref, which, settled))
    cmp = chk.comparison
    if elements is not None and engine.size > FULL_UP_TO:  # the worst element, as an index of v
        flat = int(elements[cmp.worst_index[0]]) if cmp.worst_index else 0
        cmp = replace(cmp, worst_index=tuple(int(i) for i in np.unravel_index(flat, engine.shape)))
    # an undecidable value (differences straddling a kink nearer than every step) clears nothing:
    # the walk goes on to the node whose kink it is, where the one-sided differences decide
    return cmp, chk.passed and not len(chk.undecidable)

