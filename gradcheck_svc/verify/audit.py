"""The op-rule audit: every registered op's VJP against SymPy's derivative.

For each op, at its own test points (OpDef.cases: random points of its smooth
domain, with broadcasting) and at points near each declared kink (within
1e-3 of OpDef.domain's avoided points, or of a tie for ops whose kink is a
tie), the one-op graph  loss = sum(op(inputs) * r)  is differentiated by the
engine (float64 and float32) and by the symbolic oracle, which scalarizes the
op (its SymPy formula, or its forward over SymPy arrays) and never calls a
vjp. The forward is checked against the symbolic value as well, so a SymPy
formula that does not describe the op fails too. Input values are rounded to
float32 first, so both engine precisions and the oracle see the same point.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from ..graph import Graph, load_graph
from ..graph.build import GraphBuilder
from ..graph.validate import convert_attrs
from ..ops import all_ops, get_op
from ..ops.base import BOOL, FLOAT, INT, Case, OpDef, Spec
from ..oracles.symbolic import SymbolicOptions, symbolic_gradients
from .compare import Tolerance, compare
from .engine_run import run_engine
from .options import VerifyOptions

KINK_OFFSET = 1e-3
DTYPES = ("float64", "float32")


@dataclass
class AuditRow:
    op: str
    points: str  # "domain" | "near kink"
    dtype: str
    cases: int
    max_abs_error: float
    max_rel_error: float
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return {"op": self.op, "points": self.points, "dtype": self.dtype, "cases": self.cases,
                "max_abs_error": self.max_abs_error, "max_rel_error": self.max_rel_error,
                "passed": self.passed, "detail": self.detail}


def _f32(x):
    x = np.asarray(x)
    return x.astype(np.float32).astype(np.float64) if x.dtype.kind == "f" else x


def near_kink_cases(op: OpDef, cases: list[Case], rng) -> list[Case]:
    """The op's cases moved next to its kinks: each float input within KINK_OFFSET
    of a declared kink point, or all float inputs near one common value (ties)."""
    if not op.kinks:
        return []
    out = []
    for case in cases:
        floats = [i for i, x in enumerate(case.inputs) if np.asarray(x).dtype.kind == "f"]
        if not floats:
            continue
        points = sorted({p for i in floats for p in op.domain_of(i).avoid})
        centers = points or [float(rng.uniform(-1.0, 1.0))]
        for c in centers:
            for _ in range(20):  # redraw until no two (float32) values coincide: near, never at, a kink
                xs = list(case.inputs)
                for i in floats:
                    shape = np.shape(case.inputs[i])
                    off = KINK_OFFSET * rng.uniform(0.1, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
                    xs[i] = _f32(c + off)
                flat = np.concatenate([np.ravel(xs[i]) for i in floats] + [np.array(points, np.float32)])
                if np.unique(flat.astype(np.float32)).size == flat.size:
                    break
            out.append(Case(xs, dict(case.attrs)))
    return out


def _out_spec(op: OpDef, case: Case):
    kinds = {"f": FLOAT, "b": BOOL}
    specs = [Spec(np.shape(x), kinds.get(np.asarray(x).dtype.kind, INT)) for x in case.inputs]
    return op.infer("y", specs, convert_attrs("y", op, dict(case.attrs)))


def mask_shape(op: OpDef, case: Case):
    """The output shape when the op makes a bool mask, else None."""
    spec, _ = _out_spec(op, case)
    return spec.shape if spec.dtype == BOOL else None


def index_range(op: OpDef, case: Case) -> int | None:
    """When the op makes int64 values (indices): 1 + the largest it makes at the case, else None."""
    spec, attrs = _out_spec(op, case)
    if spec.dtype != INT:
        return None
    y = np.asarray(op.forward(np, *[np.asarray(x) for x in case.inputs], **attrs))
    return int(y.max(initial=0)) + 1


def op_graph(op: OpDef, case: Case, weights=None) -> Graph:
    """The one-op graph  loss = sum(op(inputs) * weights)  (plain sum without weights), so every
    output element matters differently; float inputs the op differentiates require gradients."""
    b = GraphBuilder(op.name)
    names = []
    for i, x in enumerate(case.inputs):
        x = np.asarray(x)
        diff = x.dtype.kind == "f" and op.is_differentiable(i)
        names.append(b.input(f"in{i}", x, requires_grad=diff))
    y = b.node(op.name, *names, name="y", **case.attrs)
    mask, n_index = mask_shape(op, case), index_range(op, case)
    if n_index is not None:  # int values (indices) are read as take(r, y), r distinct: each value counts
        y = b.node("take", b.input("r_index", 1.0 + 0.37 * np.arange(n_index)), y, name="y_read", axis=0)
    if mask is not None:  # a bool output (a mask) is read as where(mask, r, -r): each element counts
        r = np.ones(mask) if weights is None else weights
        y = b.node("where", y, b.input("r", r), b.input("-r", -r), name="yr")
    elif weights is not None:
        y = b.node("mul", y, b.input("r", weights), name="yr")
    b.output(b.node("sum", y, name="loss"))
    return load_graph(b.build(), require_parameters=False)  # an op with no differentiable input is audited too


def _graph(op: OpDef, case: Case, rng) -> Graph:
    case = Case([_f32(x) for x in case.inputs], dict(case.attrs))
    shape = op_graph(op, case).specs["y"].shape
    return op_graph(op, case, _f32(rng.uniform(0.5, 1.5, size=shape)))


def _check(graph, dtype: str, sym) -> tuple[float, float, bool, str]:
    engine = run_engine(graph, VerifyOptions(dtype=dtype), dtype, profile=False)  # the rule's gradients only
    tol = Tolerance.for_dtype(dtype)
    worst_abs = worst_rel = 0.0
    ok, detail = True, ""
    fwd = compare(np.array(engine.loss), np.array(sym.loss), tol)
    if not fwd.passed:
        ok, detail = False, f"forward {engine.loss:.10g} vs symbolic {sym.loss:.10g}"
    for p in graph.parameters:
        c = compare(engine.gradients[p], sym.gradients[p], tol)
        worst_abs, worst_rel = max(worst_abs, c.max_abs_error), max(worst_rel, c.max_rel_error)
        if not c.passed and ok:
            ok, detail = False, (f"d/d{p}{list(c.worst_index)}: vjp {c.engine_at_worst:.10g} vs "
                                 f"SymPy {c.reference_at_worst:.10g}")
    return worst_abs, worst_rel, ok, detail


def audit_op(op: OpDef, seed: int = 0, dtypes=DTYPES) -> list[AuditRow]:
    rng = np.random.default_rng(seed)
    cases = op.cases(rng) if op.cases else []
    if not cases:
        return [AuditRow(op.name, "domain", d, 0, 0.0, 0.0, False, "op declares no test cases") for d in dtypes]
    rows = []
    for label, group in (("domain", cases), ("near kink", near_kink_cases(op, cases, rng))):
        if not group:
            continue
        acc = {d: [0.0, 0.0, True, ""] for d in dtypes}
        for case in group:
            graph = _graph(op, case, rng)
            sym = symbolic_gradients(graph, SymbolicOptions(timeout_s=60.0))
            for d in dtypes:
                a = acc[d]
                if not sym.ran:
                    a[2], a[3] = False, a[3] or f"no symbolic reference: {sym.reason}"
                    continue
                ab, rel, ok, detail = _check(graph, d, sym)
                a[0], a[1] = max(a[0], ab), max(a[1], rel)
                if not ok and a[2]:
                    a[2], a[3] = False, f"{detail} (attrs {case.attrs})"
        rows += [AuditRow(op.name, label, d, len(group), *acc[d]) for d in dtypes]
    return rows


def audit_ops(names: list[str] | None = None, seed: int = 0, dtypes=DTYPES) -> list[AuditRow]:
    ops = all_ops() if not names else []
    for n in names or ():
        op = get_op(n)
        if op is None:
            raise OptionError(f"unknown op '{n}'", field="--op")
        ops.append(op)
    return [row for op in ops for row in audit_op(op, seed, dtypes)]


def format_table(rows: list[AuditRow]) -> str:
    lines = [f"{'op':<16} {'points':<10} {'dtype':<8} {'cases':>5} {'max abs err':>11} {'max rel err':>11}  result"]
    for r in rows:
        lines.append(f"{r.op:<16} {r.points:<10} {r.dtype:<8} {r.cases:>5} {r.max_abs_error:>11.3g} "
                     f"{r.max_rel_error:>11.3g}  {'ok' if r.passed else 'FAIL ' + r.detail}")
    failed = sum(not r.passed for r in rows)
    lines.append(f"{len(rows)} rows, {failed} failed")
    return "\n".join(lines)
