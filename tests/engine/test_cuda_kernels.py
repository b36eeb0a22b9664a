"""Every CUDA kernel the project can emit compiles, on every commit, without a GPU.

The project's own CUDA source is the `expr` op's ElementwiseKernel (ops/formula_compile.py's
cuda_kernel, built by ops/expr.py); everything else on the CUDA path (fingerprints, erf,
scatter_add, the memory pool) calls CuPy's own kernels. The kernels: every formula function
and elementwise op's SymPy form with its derivatives (formula_cases.CASES), the `expr`
op's registered cases with the derivatives the engine uses, and the constant forms the printer
has (inf, -inf, nan, pi, e, fractions, powers, comparisons) -- each in float32 and float64,
wrapped as CuPy wraps an ElementwiseKernel (tests/cuda_compile.py), in one NVRTC (or nvcc) run.
Skipped only where no CUDA compiler is installed.
"""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import sympy as sp

from cuda_compile import CompileFailed, compile_ptx, compiler, cupy_include, cupy_kernel_code, elementwise_unit
from gradcheck_svc.ops import REGISTRY
from gradcheck_svc.ops.expr import ExprProgram
from gradcheck_svc.ops.formula_compile import ElementwiseSource, cuda_kernel
from formula_cases import CASES

pytestmark = pytest.mark.skipif(compiler() is None, reason="no CUDA compiler (libnvrtc or nvcc) installed")
DTYPES = ("float32", "float64")


def _expr_cases():
    """The registry's `expr` cases: the formula and each derivative the engine's vjp evaluates."""
    out = []
    for k, case in enumerate(REGISTRY["expr"].cases(np.random.default_rng(0))):
        names = case.attrs["args"]
        program = ExprProgram(case.attrs["formula"], tuple(names), case.attrs.get("grad") or {}, "n")
        trees = [program.tree] + [program.engine_grad(i) for i in range(len(names))]
        out += [(f"expr case {k} tree {j}", program.symbols, t) for j, t in enumerate(trees)]
    return out


def _constant_forms():
    x, y = sp.symbols("x y", real=True)
    forms = {
        "inf": sp.Piecewise((sp.oo, x > 0), (x, True)),
        "-inf": sp.Piecewise((-sp.oo, x < 0), (x, True)),
        "nan": sp.Piecewise((sp.nan, sp.Eq(x, 0)), (x, True)),
        "pi and e": sp.pi * x + sp.E,
        "fraction": x + sp.Rational(1, 3),
        "reciprocal": 1 / x,
        "cube root": x ** sp.Rational(1, 3),
        "integer power": x ** 3 - y ** -2,
        "and/or": sp.Piecewise((x, sp.And(x > 0, y < 1)), (y, sp.Or(x < -1, y > 2)), (0, True)),
        "constant": sp.Integer(2) + 0 * x,
    }
    return [(f"constant form {name}", (x, y), tree) for name, tree in forms.items()]


@functools.cache
def kernels():
    """Built at first use, not at import: collecting the suite should not pay for SymPy's printing."""
    trees = [(f"{label} tree {j}", syms, t) for label, syms, ts, _ in CASES for j, t in enumerate(ts)]
    return [(label, cuda_kernel(tree, syms)) for label, syms, tree in trees + _expr_cases() + _constant_forms()]



def test_every_kernel_the_project_emits_compiles_in_float32_and_float64():
    headers = cupy_include()
    batch = [(label, src, dt) for label, src in kernels() for dt in DTYPES]
    ptx, log = compile_ptx(elementwise_unit(batch, headers), headers)
    # every kernel reached the PTX (none silently dropped), each under its own name
    entries = re.findall(r"\.entry\s+(\w+)\(", ptx)
    assert sorted(entries) == sorted(f"gradcheck_expr_{k}" for k in range(len(batch)))
    assert "warning" not in log.lower(), log  # a warning in generated code is a bug to fix, not noise


def test_no_kernel_uses_a_macro_nvrtc_lacks():
    # nvcc includes <math.h>, whose M_PI, M_SQRT2... NVRTC (CuPy's compiler) does not define:
    # where the test compiles with nvcc, this is what would catch such a name
    used = {label: re.findall(r"\bM_[A-Z0-9_]+\b", src.operation) for label, src in kernels()}
    assert not {label: names for label, names in used.items() if names}


def test_the_batch_covers_every_function_of_the_registry():
    # each formula function and elementwise op appears (CASES is read from the registry)
    labels = " ".join(label for label, _ in kernels())
    from gradcheck_svc.ops.functions import formula_functions

    assert all(f"formula function {name} " in labels for name in formula_functions())
    assert "expr case 0" in labels and "constant form inf" in labels


def test_a_kernel_that_does_not_compile_fails_naming_itself():
    bad = ElementwiseSource("T in0", "T y", "y = no_such_function(in0);", "gradcheck_expr")
    with pytest.raises(CompileFailed, match=r"kernel 1: the broken one \(float64\)"):
        compile_ptx(elementwise_unit([("a good one", kernels()[0][1], "float32"), ("the broken one", bad, "float64")],
                                     cupy_include()), cupy_include())


def test_the_wrapper_is_the_code_cupy_generates():
    """Where CuPy is installed (the GPU machine, `make gpu-rehearse`), CuPy's own code generation
    (no device needed) gives the wrapper above, kernel by kernel, token for token. Its internals
    (_ArgInfo's kinds: 1 an array, 2 the indexer) are CuPy 14's."""
    cupy = pytest.importorskip("cupy", reason="CuPy not installed (no GPU environment)")
    from cupy._core import _carray, _kernel

    for label, src in kernels():
        for dtype in DTYPES:
            kernel = cupy.ElementwiseKernel(*src)
            dt = np.dtype(dtype)
            _, _, type_map = kernel._decide_params_type((dt,) * kernel.nin, ())
            arrays = tuple(_kernel._ArgInfo(1, cupy.ndarray, dt, 1, True, True) for _ in range(kernel.nargs))
            infos = arrays + (_kernel._ArgInfo(2, _carray.Indexer, None, 1, True, True),)
            theirs = _kernel._get_elementwise_kernel_code(infos, type_map, kernel.params, kernel.operation,
                                                          kernel.name, kernel.preamble)
            assert theirs.split() == cupy_kernel_code(src, dtype).split(), label
