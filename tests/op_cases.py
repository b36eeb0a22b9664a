"""Op tables read from the registry and one-op graphs, shared by the registry-wide test modules
(test_diagnosis_registry, test_fd_error_bounds, test_bug_zoo, test_diagnosis_second_pass)."""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import all_ops
from gradcheck_svc.ops.registry import REGISTRY, register

# smooth ops from the registry (no kinks, defined on all reals): the random graphs' vocabulary
SMOOTH_UNARY = [op.name for op in all_ops() if op.arity == 1 and op.sympy is not None and op.vjp and not op.kinks
                and not op.attrs and op.domain_of(0).lo <= -2 and not op.domain_of(0).avoid]
SMOOTH_BINARY = [op.name for op in all_ops() if op.arity == 2 and op.broadcast and op.sympy is not None and op.vjp
                 and not op.kinks and all(op.domain_of(i).lo <= -2 and not op.domain_of(i).avoid for i in (0, 1))]


# ops a gradient flows through (sign, floor, ceil have a vjp but no differentiable input: nothing to plant)
DIFFERENTIABLE = [op for op in all_ops() if op.vjp is not None and op.cases is not None
                  and any(op.is_differentiable(i) for i in range(op.arity or 1))]


def op_graph(op_name, case, rng):
    """loss = sum(op(inputs) * r): every output element weighs differently."""
    b = GraphBuilder(op_name)
    op = REGISTRY[op_name]
    names = []
    for i, x in enumerate(case.inputs):
        x = np.asarray(x)
        names.append(b.input(f"in{i}", x, requires_grad=x.dtype.kind == "f" and op.is_differentiable(i)))
    y = b.node(op_name, *names, name="y", **case.attrs)
    shape = load_graph(_probe(b)).specs["y"].shape
    b.output(b.node("sum", b.node("mul", y, b.input("r", rng.uniform(0.5, 1.5, size=shape)), name="yr"), name="L"))
    return load_graph(b.build())


def _probe(b):
    """The graph so far, with sum(y) as its loss: to learn y's shape."""
    p = GraphBuilder("probe")
    p.msg.CopyFrom(b.msg)
    p.output(p.node("sum", "y", name="_probe_sum"))
    return p.build()


@contextlib.contextmanager
def registered_scaled_rule(op, factor: float, suffix: str):
    """A copy of `op` named op.name + suffix whose vjp is `factor` times the right one (a planted
    wrong rule), registered for the block."""
    bad = dataclasses.replace(op, name=f"{op.name}{suffix}",
                              vjp=lambda xp, g, saved, **a: tuple(None if v is None else factor * v
                                                                  for v in op.vjp(xp, g, saved, **a)))
    register(bad)
    try:
        yield bad
    finally:
        del REGISTRY[bad.name]
