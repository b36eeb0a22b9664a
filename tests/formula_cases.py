"""Every formula function and elementwise op's SymPy form with its derivatives, and a point in its
domain: the cases test_function_tables and test_cuda_kernels evaluate (read from the registry)."""
from __future__ import annotations

import numpy as np
import sympy as sp

from gradcheck_svc.ops import all_ops
from gradcheck_svc.ops.base import Domain
from gradcheck_svc.ops.functions import formula_functions

ELEMENTWISE = [op for op in all_ops() if op.sympy is not None and op.arity is not None]
FORMULA_ONLY_DOMAIN = Domain(-1.0, 1.0)


def _trees_and_points(rng):
    """(label, symbols, [tree and its derivatives], [point per symbol]) for every function."""
    out = []
    for op in ELEMENTWISE:
        for k, case in enumerate(op.cases(rng)):
            syms = sp.symbols(f"a0:{op.arity}", real=True)
            tree = op.sympy(sp, *syms, **case.attrs)
            point = [float(np.ravel(x)[0]) for x in case.inputs]
            out.append((f"op {op.name} case {k}", syms, tree, point))
    for name, f in formula_functions().items():
        syms = sp.symbols(f"a0:{f.arity}", real=True)
        domain = FORMULA_ONLY_DOMAIN if f.op is None else None
        point = [float(domain.sample(rng, ()) if domain else _op_point(f.op, i, rng)) for i in range(f.arity)]
        out.append((f"formula function {name}", syms, f.sympy(*syms), point))
    return [(label, syms, [tree] + [sp.diff(tree, s) for s in syms], point) for label, syms, tree, point in out]


def _op_point(op_name, i, rng):
    from gradcheck_svc.ops import REGISTRY

    return REGISTRY[op_name].domain_of(i).sample(rng, ())


CASES = _trees_and_points(np.random.default_rng(14))
