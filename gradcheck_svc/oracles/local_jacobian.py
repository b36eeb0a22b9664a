"""One node's symbolic form and its exact local partial derivatives.

Elementwise ops (OpDef.sympy) give one scalar formula in generic symbols;
it is differentiated symbolically once per node (`derivative`) and the
formula and its partials are evaluated per output element. Every other op is
scalarized by running its own forward over SymPy object arrays
(sympy_arrays.py): each output element becomes an expression in per-element
input symbols, whose partials by all its symbols are accumulated in one
reverse pass over the expression (`ReverseAccumulator`). Either way the
derivative of every elementary function is SymPy's; no op's vjp is used.

The result, a NodeJacobian, holds the output values and the non-zero pattern
of the local Jacobian as (output element, input, input element, value)
triples -- the symbolic oracle composes them by the chain rule.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from math import prod

import numpy as np
import sympy as sp
from sympy.functions.elementary.miscellaneous import MinMaxBase

from ..ops.base import FLOAT, INT, OpDef, Spec
from .mp_eval import MpEvaluator, Unsupported
from .sympy_arrays import SYMPY_XP


class OverBudget(Exception):
    """Raised between small steps when the oracle's time or size budget is spent."""


@dataclass
class Budget:
    deadline: float  # time.monotonic() value
    max_edges: int
    edges: int = 0
    # where the oracle is (the reason names it when time runs out): a node's symbolic form is one SymPy
    # call no tick splits, its partials are ticked per element
    node: str = ""  # "'name' (op)"
    phase: str = "the oracle's set-up"
    expired_at: str = ""  # where the alarm at the deadline found the oracle (symbolic._alarm_at), once it fired

    @property
    def at(self) -> str:
        return f"node {self.node}: {self.phase}" if self.node else self.phase

    def expire(self) -> None:
        """The deadline's alarm fired: where the oracle was. Its raise may be dropped (in a finalizer the garbage
        collector ran just then); the next tick then stops the oracle, naming this place, not its own."""
        self.expired_at = self.expired_at or self.at

    @property
    def reached(self) -> str:
        return f"wall-clock limit reached in {self.expired_at or self.at}"

    def tick(self):
        if time.monotonic() > self.deadline:
            raise OverBudget(self.reached)

    def add_edges(self, n: int):
        self.edges += n
        if self.edges > self.max_edges:
            raise OverBudget(f"more than {self.max_edges} non-zero local partial derivatives")


@dataclass
class NodeJacobian:
    values: np.ndarray  # object array of mpf, the output
    edges: list = field(default_factory=list)  # (out_flat, input k, in_flat, mpf partial)


def elementwise_formula(op: OpDef, attrs: dict, n_inputs: int, wanted):
    """(symbols, formula, [partial or None per input]) in generic symbols."""
    syms = [sp.Symbol(f"in{k}[]", real=True) for k in range(n_inputs)]  # not Dummy: see _scalarized
    expr = _as_expr(op.sympy(sp, *syms, **attrs))
    return syms, expr, [derivative(expr, s) if w else None for s, w in zip(syms, wanted)]


def _as_expr(v):
    if isinstance(v, sp.Basic):
        return v
    return sp.Integer(v) if isinstance(v, int) else sp.Float(float(v))


def derivative(e, s):
    """d e / d s, exact. The derivative of each elementary function comes from
    SymPy (`fdiff`: d exp, d log, d tanh, d Max = Heaviside, ...; and SymPy's
    own `diff` for powers with a variable exponent, Piecewise and anything
    else); they are composed here by the sum, product and chain rules. Going
    through SymPy's Derivative machinery for every sum and product cost
    ~0.5 ms per product and dominated matmul and softmax nodes."""
    if e == s:
        return sp.S.One
    if s not in e.free_symbols:
        return sp.S.Zero
    if e.is_Add:
        return sp.Add(*[derivative(a, s) for a in e.args])
    if e.is_Mul:
        args = e.args
        return sp.Add(*[sp.Mul(*(args[:i] + (derivative(f, s),) + args[i + 1:]))
                        for i, f in enumerate(args) if s in f.free_symbols])
    if e.is_Pow and s not in e.exp.free_symbols:
        b, n = e.args
        return n * b ** (n - 1) * derivative(b, s)
    if e.is_Piecewise:  # piece by piece, by these rules (SymPy's diff writes d a**b/da as a**b*b/a: inf/inf at inf)
        return sp.Piecewise(*[(derivative(piece, s), cond) for piece, cond in e.args])
    if isinstance(e, (sp.Function, MinMaxBase)) and not e.is_Piecewise:
        return sp.Add(*[e.fdiff(i + 1) * derivative(a, s) for i, a in enumerate(e.args) if s in a.free_symbols])
    return e.diff(s)


class ReverseAccumulator:
    """All partials of one output element's expression at once: reverse
    accumulation over the expression's DAG, in mpmath. The local derivative of
    each elementary function is SymPy's (`fdiff`, evaluated at the node's
    values); sums, products, powers and Piecewise are composed by their rules.
    One pass costs O(size of the expression) whatever the number of symbols,
    so a softmax row (every output depends on every input, through the
    stabilizing max) costs O(n) per output instead of O(n) per partial.
    fdiff expressions and values are cached per node: subexpressions shared
    by several outputs (the row's logsumexp) are differentiated once."""

    def __init__(self, ev: MpEvaluator, env: dict, memo: dict, budget: Budget):
        self.ev, self.env, self.memo, self.budget = ev, env, memo, budget
        self.ctx = ev.ctx
        self._fdiff: dict = {}

    def value(self, e):
        return self.ev.value(e, self.env, self.memo)

    def gradient(self, root) -> dict:
        order = _post_order(root)
        adj = {root: self.ctx.one}
        grads = {}
        for n, e in enumerate(reversed(order)):
            if n % 512 == 511:
                self.budget.tick()
            a = adj.pop(e, None)
            if not a:
                continue
            if e.is_Symbol:
                grads[e] = a
                continue
            for child, local in self._locals(e):
                adj[child] = adj[child] + a * local if child in adj else a * local
        return grads

    def _locals(self, e):
        """(child, d e / d child) for the children that can carry a gradient."""
        if e.is_Add:
            return [(c, self.ctx.one) for c in e.args if not c.is_Number]
        if e.is_Mul:
            vals = [self.value(c) for c in e.args]
            return [(c, self.ctx.fprod(vals[:i] + vals[i + 1:])) for i, c in enumerate(e.args) if not c.is_Number]
        if e.is_Pow:
            b, n = e.args
            out = []
            if not b.is_Number:
                out.append((b, self.value(n) * self._power(self.value(b), n, self.value(n) - 1)))
            if not n.is_Number:
                out.append((n, self.value(e) * self.ctx.log(self.value(b))))
            return out
        if e.is_Piecewise:
            for piece, cond in e.args:
                if self.value(cond):
                    return [(piece, self.ctx.one)]
            return []
        if isinstance(e, (sp.Function, MinMaxBase)):
            out = []
            for i, c in enumerate(e.args):
                if c.is_Number:
                    continue
                key = (e, i)
                d = self._fdiff.get(key)
                if d is None:
                    d = self._fdiff[key] = e.fdiff(i + 1)
                out.append((c, self.value(d)))
            return out
        if e.is_Number or e.is_NumberSymbol:
            return []
        raise Unsupported(f"no derivative rule for {type(e).__name__}")

    def _power(self, vb, n, p):
        """vb ** p, where p = n - 1, in the real domain (nan outside it)."""
        c = self.ctx
        if n.is_Integer:
            return vb ** int(p) if vb != 0 or p >= 0 else c.inf
        if vb > 0:
            return c.power(vb, p)
        if vb == 0:
            return c.zero if p > 0 else c.inf
        return c.nan


def _post_order(root) -> list:
    """Unique subexpressions of root, children before parents (iterative: no recursion limit)."""
    seen, out, stack = set(), [], [(root, False)]
    while stack:
        e, done = stack.pop()
        if done:
            out.append(e)
            continue
        if e in seen:
            continue
        seen.add(e)
        stack.append((e, True))
        if e.is_Symbol or e.is_Number or e.is_NumberSymbol:
            continue
        if e.is_Piecewise:  # conditions carry no gradient
            stack.extend((p, False) for p, _ in e.args)
        elif not (e.is_Relational or e.is_Boolean):
            stack.extend((c, False) for c in e.args)
    return out


# Elementwise formulas and their exact partials per (op, attrs, arity, wanted), kept for the process: SymPy
# builds them in milliseconds (pow's Piecewise: ~2 ms), more than a small graph's whole check, and they
# depend on nothing but the key (SymPy expressions are immutable). The op object is part of the key (a
# custom op registered again under its name is another op); bounded, cleared when full.
_FORMULAS: dict = {}
_FORMULAS_MAX = 4096


class LocalJacobians:
    """Evaluates nodes one at a time; elementwise formulas from the process-wide cache (_FORMULAS)."""

    def __init__(self, ev: MpEvaluator, budget: Budget):
        self.ev = ev
        self.ctx = ev.ctx
        self.budget = budget
        self._formulas = _FORMULAS

    def node(self, op: OpDef, attrs: dict, in_values: list, in_specs: list[Spec], out_spec: Spec,
             wanted: tuple[bool, ...]) -> NodeJacobian:
        if out_spec.dtype == INT and op.vjp is None:
            return _indices(op, attrs, in_values, in_specs)
        if op.sympy is not None:
            return self._elementwise(op, attrs, in_values, in_specs, out_spec, wanted)
        return self._scalarized(op, attrs, in_values, in_specs, out_spec, wanted)

    def _formula(self, op, attrs, n, wanted):
        try:
            key = (op.name, id(op), tuple(sorted(attrs.items())), n, tuple(wanted))
            hash(key)
        except TypeError:
            key = None
        hit = self._formulas.get(key) if key is not None else None
        if hit is None:
            hit = elementwise_formula(op, attrs, n, wanted)
            if key is not None:
                if len(self._formulas) >= _FORMULAS_MAX:
                    self._formulas.clear()
                self._formulas[key] = (*hit, op)  # (op held: its id stays its own while the entry lives)
        return hit[:3]

    def _elementwise(self, op, attrs, in_values, in_specs, out_spec, wanted):
        syms, expr, parts = self._formula(op, attrs, len(in_values), wanted)
        self.budget.phase = "its partials"
        shape = out_spec.shape
        index = [np.broadcast_to(np.arange(s.size).reshape(s.shape), shape).reshape(-1) for s in in_specs]
        flat = [np.asarray(v, dtype=object).reshape(-1) for v in in_values]
        n = prod(shape)
        out = np.empty(n, dtype=object)
        edges = []
        self.budget.add_edges(n * sum(1 for p in parts if p is not None))
        ev, mpf = self.ev, self.ctx.mpf
        for j in range(n):
            self.budget.tick()
            at = [int(ix[j]) for ix in index]
            env = {s: _mp(mpf, f[i]) for s, f, i in zip(syms, flat, at)}
            memo: dict = {}
            out[j] = ev.value(expr, env, memo)
            for k, p in enumerate(parts):
                if p is not None:
                    edges.append((j, k, at[k], ev.value(p, env, memo)))
        return NodeJacobian(out.reshape(shape), edges)

    def _scalarized(self, op, attrs, in_values, in_specs, out_spec, wanted):
        xs, env, owner = [], {}, {}
        for k, (v, spec) in enumerate(zip(in_values, in_specs)):
            if spec.dtype != FLOAT:
                xs.append(np.asarray([int(e) for e in np.asarray(v).reshape(-1)],
                                     dtype=np.int64 if spec.dtype != "bool" else bool).reshape(spec.shape))
                continue
            flat = np.asarray(v, dtype=object).reshape(-1)
            syms = np.empty(flat.size, dtype=object)
            for i in range(flat.size):
                # named, not Dummy: the same symbols every call, so SymPy's global caches do
                # not fill with fresh expressions on every verification (a leak in a server);
                # '[' cannot appear in a formula's names, so no user symbol can collide
                s = sp.Symbol(f"in{k}[{i}]", real=True)
                syms[i], env[s], owner[s] = s, flat[i], (k, i)
            xs.append(syms.reshape(spec.shape))
        extra = {"dtype": np.float64} if op.wants_dtype and "dtype" not in attrs else {}
        y = np.asarray(op.forward(SYMPY_XP, *xs, **attrs, **extra), dtype=object)
        self.budget.phase = "its partials"
        if y.shape != out_spec.shape:
            raise Unsupported(f"symbolic forward of '{op.name}' gave shape {list(y.shape)}, "
                              f"expected {list(out_spec.shape)}")
        flat_y = y.reshape(-1)
        out = np.empty(flat_y.size, dtype=object)
        edges = []
        memo: dict = {}
        ev, mpf = self.ev, self.ctx.mpf
        reverse = ReverseAccumulator(ev, env, memo, self.budget)
        for j, e in enumerate(flat_y):
            self.budget.tick()
            if not isinstance(e, sp.Basic):
                out[j] = _mp(mpf, e)
                continue
            out[j] = ev.value(e, env, memo)
            if not any(wanted):
                continue
            # (not e.free_symbols: on a DAG whose terms share a subexpression -- every
            # softmax term holds the row's max -- SymPy walks it once per term)
            n_before = len(edges)
            for s, d in reverse.gradient(e).items():
                k, i = owner[s]
                if wanted[k]:
                    edges.append((j, k, i, d))
            self.budget.add_edges(len(edges) - n_before)
        return NodeJacobian(out.reshape(out_spec.shape), edges)


def _indices(op: OpDef, attrs: dict, in_values: list, in_specs: list[Spec]) -> NodeJacobian:
    """An int64 output computed from float values (top_k_indices: positions) is piecewise constant, of
    derivative 0 wherever it is defined, and no SymPy expression: its own forward on the inputs' values
    (rounded to float64, which orders them as the engine's float64 run does), with no edges."""
    xs = [np.asarray([float(e) for e in np.asarray(v, dtype=object).reshape(-1)], dtype=np.float64
                     if s.dtype == FLOAT else None).reshape(s.shape) for v, s in zip(in_values, in_specs)]
    return NodeJacobian(np.asarray(op.forward(np, *xs, **attrs), dtype=np.int64), [])


def _mp(mpf, v):
    if isinstance(v, (bool, np.bool_)):
        return mpf(int(v))
    if isinstance(v, (int, np.integer)):
        return mpf(int(v))
    if isinstance(v, (float, np.floating)):
        return mpf(float(v))
    return v  # already an mpf
