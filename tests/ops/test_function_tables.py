"""Every consumer of the registry's function tables covers every function in them.

The functions: each formula function (ops/functions.py) and each elementwise
op's SymPy form at its own test points and attributes, plus their first
derivatives (what the engine's expr vjp, the symbolic oracle and the op audit
evaluate). The consumers: the formula parser, the engine's NumPy evaluation
and CUDA source (formula_compile), the mpmath evaluator (mp_eval) and the
symbolic array module (sympy_arrays). Values are compared, not just "no error":
NumPy's and mpmath's evaluations of one tree must agree.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import mpmath
import numpy as np
import pytest
import sympy as sp

from gradcheck_svc.ops import all_ops
from gradcheck_svc.ops.formula import parse_formula, symbols_for
from gradcheck_svc.ops.formula_compile import array_function, cuda_source
from gradcheck_svc.ops.functions import FORMULA_ONLY, array_functions, formula_functions
from gradcheck_svc.oracles.mp_eval import MpEvaluator, make_context
from gradcheck_svc.oracles.sympy_arrays import SYMPY_XP

from formula_cases import CASES  # (shared with test_cuda_kernels)


def test_the_tables_hold_what_they_should():
    # the parser's functions are exactly the ops with a formula name plus the formula-only ones
    ops = {op.formula_name: op.name for op in all_ops() if op.formula_name}
    assert {n: f.op for n, f in formula_functions().items() if f.op} == ops
    assert sorted(n for n, f in formula_functions().items() if f.op is None) == sorted(f.name for f in FORMULA_ONLY)
    assert {"exp", "log", "sigmoid", "relu", "max", "erf", "tan"} <= set(formula_functions())
    assert {"exp", "log1p", "maximum", "sqrt"} <= set(array_functions())


def test_the_docs_list_the_formula_functions():
    from conftest import ROOT

    text = (ROOT / "docs" / "symbolic.md").read_text()
    listed = re.search(r"and the\s+functions `([a-z0-9 ]+)`", text).group(1).split()
    assert listed == sorted(formula_functions()), "docs/symbolic.md lists other formula functions than the parser's"


@pytest.mark.parametrize("name", sorted(formula_functions()))
def test_parser_builds_each_formula_function_with_its_sympy_form(name):
    f = formula_functions()[name]
    names = [f"a{i}" for i in range(f.arity)]
    table = symbols_for(names)
    tree = parse_formula(f"{name}({', '.join(names)})", table, "n")
    assert tree == f.sympy(*(table[n] for n in names))


@pytest.mark.parametrize("label,syms,trees,point", CASES, ids=[c[0] for c in CASES])
def test_numpy_and_mpmath_evaluate_every_function_and_derivative_alike(label, syms, trees, point):
    ev = MpEvaluator(make_context(30))
    env = {s: ev.ctx.mpf(v) for s, v in zip(syms, point)}
    for tree in trees:
        want = float(ev.value(tree, env, {}))
        got = array_function(tree, syms, np)(*[np.array([v]) for v in point])
        np.testing.assert_allclose(np.broadcast_to(got, (1,)), [want], rtol=1e-13, atol=1e-15,
                                   err_msg=f"{label}: {tree} at {point}")


@pytest.mark.parametrize("label,syms,trees,point", CASES, ids=[c[0] for c in CASES])
def test_cuda_source_prints_every_function_and_derivative(label, syms, trees, point):
    for tree in trees:
        src = cuda_source(tree, syms)
        assert all(str(s) not in src for s in syms), src  # inputs by position only
        assert all(f"in{k}" in src for k, s in enumerate(syms) if s in tree.free_symbols), src


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_cuda_source_computes_what_numpy_computes(tmp_path):
    """The kernel bodies, compiled as host C++ in double (CUDA's math functions have the same
    names and meaning), give NumPy's values at every case's point."""
    bodies, calls, want = [], [], []
    x = sp.Symbol("x", real=True)
    negative_root = ("x**(1/3) at a negative x: NaN on both backends (C's cbrt would be real)", (x,),
                     [x ** sp.Rational(1, 3)], [-8.0])
    for label, syms, trees, point in CASES + [negative_root]:
        for tree in trees:
            k = len(bodies)
            params = ", ".join(f"T in{i}" for i in range(3))
            bodies.append(f"template <typename T> T f{k}({params}) {{ return {cuda_source(tree, syms)}; }}")
            args = ", ".join(repr(float(v)) for v in (list(point) + [0.0, 0.0, 0.0])[:3])
            calls.append(f'    std::printf("%.17g\\n", (double)f{k}<double>({args}));')
            with np.errstate(invalid="ignore"):  # the negative root's NaN is the value wanted
                value = array_function(tree, syms, np)(*[np.array([v]) for v in point])
            want.append(float(np.broadcast_to(value, (1,))[0]))
    src = tmp_path / "kernels.cpp"
    src.write_text("#include <cmath>\n#include <cstdio>\nusing namespace std;\n" + "\n".join(bodies)
                   + "\nint main() {\n" + "\n".join(calls) + "\n    return 0;\n}\n")
    exe = tmp_path / "kernels"
    subprocess.run(["g++", "-O0", "-o", str(exe), str(src)], check=True, capture_output=True, timeout=120)
    got = [float(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", sorted(array_functions()))
def test_symbolic_arrays_offer_every_numpy_named_function(name):
    f = array_functions()[name]
    syms = sp.symbols(f"a0:{f.arity}", positive=True)
    got = getattr(SYMPY_XP, name)(*[np.array([s], dtype=object) for s in syms])
    assert got.dtype == object and got.shape == (1,)
    at = {s: sp.Rational(k + 3, 7) for k, s in enumerate(syms)}
    assert float(got[0].subs(at)) == pytest.approx(float(f.sympy(*syms).subs(at)), rel=1e-15)


def test_mpmath_refuses_what_it_has_no_function_for():
    from gradcheck_svc.oracles.mp_eval import Unsupported

    x = sp.Symbol("x", real=True)
    ev = MpEvaluator(make_context(20))
    with pytest.raises(Unsupported):
        ev.value(sp.Function("frobnicate")(x), {x: mpmath.mpf(1)}, {})
