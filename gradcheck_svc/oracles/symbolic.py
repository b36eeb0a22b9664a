"""The symbolic reference gradient: exact derivatives from SymPy, evaluated in
high precision (mpmath, 40 significant digits by default), independent of the
engine's derivative code (no vjp is ever called).

Design -- why it does not blow up on shared subexpressions: the loss is never
expanded into one expression of the parameters. Each node is scalarized on
its own (local_jacobian.py): its output elements are SymPy expressions of its
own input elements (elementwise ops: the OpDef.sympy formula; other ops: their
forward run over SymPy object arrays). The derivative of every elementary
function comes from SymPy (`fdiff`, `diff`); the node's local partials are
composed from them by the sum, product and chain rules (symbolically once per
elementwise node, by one reverse pass over each output element's expression
otherwise) and evaluated in mpmath at the node's input values, which come from
the same high-precision forward pass. The nodes are then composed by the
reverse-mode chain rule in mpmath: dL/dx_i = sum over consumers j of
dL/dy_j * dy_j/dx_i. A value read by many consumers is one symbol per
consumer, not a copy of its whole history, so the work is linear in the
number of non-zero local partials ("edges") of the graph. The price: the
result is exact derivatives evaluated at 40 digits (rounding ~1e-40 relative
per operation, far below any float64 comparison), not one closed-form
expression of the loss.

Limits: budgeted by scalar elements (inputs plus node outputs, checked before
any work), by edges, and by wall clock (checked between per-element steps, each
of which is small; the one step that is not split is building one node's
symbolic form -- a dense node's takes seconds: a 1,200-wide softmax divides
each element by a 1,200-term sum -- so where the process's interval timer is
free, an alarm stops that too, at the deadline), so the oracle returns
`skipped` with the reason, the node it was at and the sizes it saw rather than
hanging or filling memory. Nodes whose scalar form
SymPy or our evaluator cannot handle also give `skipped`, with the reason.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod

import numpy as np

from ..alarm import alarm, timer_free
from ..engine.program import Program, program_of
from ..graph.ir import Graph
from ..ops.base import FLOAT


@dataclass
class SymbolicOptions:
    enabled: bool = True
    max_elements: int = 5000  # scalar elements: graph inputs plus every node output
    max_edges: int = 250_000  # non-zero local partial derivatives
    timeout_s: float = 30.0
    digits: int = 40
    simplify_timeout_s: float = 10.0  # per expr node: is the user's derivative SymPy's? (verify/custom_ops.py)


@dataclass
class SymbolicResult:
    status: str  # "ok" | "skipped" | "off"
    reason: str = ""
    elements: int = 0
    edges: int = 0
    seconds: float = 0.0
    digits: int = 0
    loss: float | None = None
    gradients: dict = field(default_factory=dict)  # parameter -> float64 array
    adjoints: dict = field(default_factory=dict)  # every value reached by the backward -> dL/dv (float64)
    mp_values: dict = field(default_factory=dict)  # value name -> object array of mpf (forward values)

    @property
    def ran(self) -> bool:
        return self.status == "ok"

    def __getstate__(self) -> dict:
        # pickled (bounded.py's child returns the report) without the mpf values: mpmath's classes are
        # made per context and do not pickle, and they serve the diagnosis inside verify() only
        return dict(self.__dict__, mp_values={})

    def to_dict(self) -> dict:
        d = {"status": self.status, "elements": self.elements, "edges": self.edges,
             "seconds": round(self.seconds, 6), "digits": self.digits}
        if self.reason:
            d["reason"] = self.reason
        return d


def graph_elements(program: Program) -> int:
    names = set(program.graph.inputs) | {s.name for s in program.steps}
    return sum(prod(program.shapes[n]) for n in names)


def symbolic_gradients(graph: Graph, options: SymbolicOptions | None = None) -> SymbolicResult:
    options = options or SymbolicOptions()
    if not options.enabled:
        return SymbolicResult("off", "disabled by option")
    t0 = time.monotonic()
    program = program_of(graph, np.float64)
    elements = graph_elements(program)
    if elements > options.max_elements:
        return SymbolicResult("skipped", f"graph has {elements} scalar elements, budget is {options.max_elements} "
                              "(raise it with symbolic_budget / --symbolic-budget)",
                              elements=elements, digits=options.digits)
    # SymPy and mpmath load here, on the first graph the oracle runs on: never with the oracle off
    from .local_jacobian import Budget, LocalJacobians, OverBudget
    from .mp_eval import MpEvaluator, Unsupported, make_context

    budget = Budget(t0 + options.timeout_s, options.max_edges)
    ctx = make_context(options.digits)

    def skipped(reason: str) -> SymbolicResult:
        return SymbolicResult("skipped", reason, elements=elements, edges=budget.edges,
                              seconds=time.monotonic() - t0, digits=options.digits)

    try:
        with _alarm_at(budget):
            result = _run(program, LocalJacobians(MpEvaluator(ctx), budget), ctx)
    except (OverBudget, _OutOfTime) as exc:
        # the partials are not counted on past the budget (each costs SymPy work): the amount is a lower bound
        what = exc if isinstance(exc, OverBudget) else budget.reached
        return skipped(f"over budget: {what} (timeout {options.timeout_s:g} s, {budget.edges} edges so far; "
                       "raise them with --symbolic-timeout / --symbolic-max-partials)")
    except Unsupported as exc:
        return skipped(f"no symbolic form: {exc}")
    except Exception as exc:  # noqa: BLE001 - SymPy failing on one node must not cost the whole report
        return skipped(f"symbolic evaluation failed: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}")
    result.elements, result.edges, result.digits = elements, budget.edges, options.digits
    result.seconds = time.monotonic() - t0
    return result


class _OutOfTime(BaseException):
    """The alarm at the oracle's deadline, raised inside SymPy's work (a BaseException: no `except Exception`
    on its way out swallows it)."""


@contextmanager
def _alarm_at(budget):
    """The budget's deadline held inside one node's SymPy work too, where the interval timer is ours to take (the
    commands' child, a server worker's main thread: alarm.timer_free); elsewhere the ticks between steps
    hold it, a node's form finishing first -- as where the alarm's raise was dropped in a finalizer, the place it
    fired at (Budget.expire) still the one named."""
    if not timer_free():
        yield
        return
    with alarm(max(budget.deadline - time.monotonic(), 1e-3), _OutOfTime, fired=budget.expire):
        yield


def _run(program: Program, local: LocalJacobians, ctx) -> SymbolicResult:
    graph = program.graph
    mpf = ctx.mpf
    values: dict[str, np.ndarray] = {}
    for name, gi in graph.inputs.items():
        arr = np.empty(gi.value.size, dtype=object)
        arr[:] = [mpf(float(v)) if gi.declared_dtype.startswith("float") else int(v) for v in gi.value.reshape(-1)]
        values[name] = arr.reshape(gi.value.shape)
    jac = {}
    for step in program.steps:
        local.budget.tick()
        local.budget.node, local.budget.phase = f"'{step.name}' ({step.op.name})", "its symbolic form"
        in_specs = [graph.specs[n] for n in step.inputs]
        wanted = step.grad_inputs if step.needs_grad else (False,) * len(step.inputs)
        j = local.node(step.op, step.attrs, [values[n] for n in step.inputs], in_specs,
                       graph.specs[step.name], wanted)
        local.budget.node, local.budget.phase = "", f"the steps after node '{step.name}'"
        if graph.specs[step.name].dtype != FLOAT and j.values.size:  # int/bool outputs are index data
            j.values = np.vectorize(int, otypes=[object])(j.values)
        values[step.name] = j.values
        if step.needs_grad:
            jac[step.name] = j.edges

    # reverse-mode chain rule in mpmath
    local.budget.phase = "the chain rule over the nodes' partials"
    adj: dict[str, np.ndarray] = {program.output: np.array([mpf(1)], dtype=object)}
    out: dict[str, np.ndarray] = {}
    for step in reversed(program.steps):
        a = adj.pop(step.name, None)
        if a is None or step.name not in jac:
            continue
        out[step.name] = a
        targets = {}
        for k, name in enumerate(step.inputs):
            if step.grad_inputs[k] and name not in targets:
                targets[name] = adj.setdefault(name, _zeros(ctx, prod(program.shapes[name])))
        for jj, k, i, d in jac[step.name]:
            g = a[jj]
            if g:
                targets[step.inputs[k]][i] += g * d
        local.budget.tick()
    out.update(adj)
    to64 = lambda arr, name: np.array([float(v) for v in arr], dtype=np.float64).reshape(program.shapes[name])  # noqa: E731
    grads = {p: to64(out[p], p) if p in out else np.zeros(program.shapes[p]) for p in program.params}
    loss = values[program.output].reshape(-1)[0]
    return SymbolicResult("ok", loss=float(loss), gradients=grads,
                          adjoints={n: to64(a, n) for n, a in out.items()}, mp_values=values)


def _zeros(ctx, n: int) -> np.ndarray:
    z = np.empty(n, dtype=object)
    z[:] = [ctx.zero] * n
    return z
