"""The user-defined op `expr`: a formula of the node's inputs, with an
optional hand-written derivative per input.

    {"op": "expr", "inputs": ["x"],
     "attrs": {"formula": "x*sigmoid(x)",
               "grad": {"x": "sigmoid(x)*(1 + x*(1 - sigmoid(x)))"}}}

Names in the formulas are the node's input names; inputs whose names are not
identifiers (or a node reading one value twice) bind local names by position
with `args`, e.g. "args": ["a", "b"]. Inputs broadcast like NumPy's.

Everything happens at graph load (`infer`): the formulas are parsed by our
whitelist parser (formula.py) into SymPy trees, so a bad formula is a
GraphError naming the node and the offending token before anything runs.
The engine evaluates the trees (formula_compile.py: SymPy's lambdify on
NumPy, a generated ElementwiseKernel on CuPy) and uses the user's derivative
in the vjp when one is given, SymPy's derivative of the formula otherwise.
The symbolic oracle uses `sympy` below: the formula only, never the user's
derivative -- whether that derivative is right is exactly what gets checked.
SymPy is imported only when a graph uses this op.
"""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from .base import FLOAT, NONZERO, REALS, Attr, Case, OpDef, Spec, broadcast_shapes, save_inputs
from .registry import register


class ExprProgram:
    """The parsed formula, its derivatives and their compiled forms (compiled lazily;
    only the trees are pickled)."""

    def __init__(self, formula: str, names: tuple[str, ...], user_grad_text: dict, node: str):
        import sympy as sp

        from .formula import parse_formula, symbols_for

        self.formula, self.names, self.node = formula, names, node
        table = symbols_for(names)
        self.symbols = tuple(table[n] for n in names)
        self.tree = parse_formula(formula, table, node, "formula")
        self.user_grad_text = dict(user_grad_text)
        self.user_grads = {n: parse_formula(t, table, node, f"grad.{n}") for n, t in user_grad_text.items()}
        self._sympy_grads = {}
        self._cache = {}
        self._sp = sp

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_sp")}

    def __setstate__(self, state):
        import sympy as sp

        self.__dict__.update(state, _cache={}, _sp=sp)

    def _key(self):
        return (self.formula, self.names, tuple(sorted(self.user_grad_text.items())))

    def __eq__(self, other):
        return isinstance(other, ExprProgram) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"ExprProgram({self.formula!r})"

    def sympy_grad(self, k: int):
        """SymPy's derivative of the formula by input k."""
        if k not in self._sympy_grads:
            self._sympy_grads[k] = self._sp.diff(self.tree, self.symbols[k])
        return self._sympy_grads[k]

    def engine_grad(self, k: int):
        """The derivative the engine uses: the user's when given, else SymPy's."""
        name = self.names[k]
        return self.user_grads[name] if name in self.user_grads else self.sympy_grad(k)

    def evaluate(self, xp, tree, xs):
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        dtype = xp.result_type(*xs)
        if xp is not np and hasattr(xp, "ElementwiseKernel"):  # CuPy: one fused kernel per tree
            kernel = self._cache.get(("cuda", tree))
            if kernel is None:
                from .formula_compile import cuda_kernel

                kernel = xp.ElementwiseKernel(*cuda_kernel(tree, self.symbols))
                self._cache[("cuda", tree)] = kernel
            return kernel(*[x.astype(dtype, copy=False) for x in xs])
        from .formula_compile import array_function

        f = array_function(tree, self.symbols, xp)
        y = xp.asarray(f(*[xp.broadcast_to(x, shape) for x in xs])).astype(dtype, copy=False)
        return y if y.shape == shape and y.base is None else xp.broadcast_to(y, shape).copy()


def _infer(node, specs, attrs):
    names = attrs["args"]
    if names is None:
        names = list(attrs["input_names"])
        from .formula import IDENTIFIER

        for n in names:
            if not IDENTIFIER.match(n):
                raise GraphError(f"input name '{n}' is not an identifier; set attribute 'args' to a local "
                                 f"name for each input", node=node)
    elif not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise GraphError("attribute 'args' must be a list of names, one per input", node=node)
    else:
        from .formula import IDENTIFIER

        for n in names:
            if not IDENTIFIER.match(n):
                raise GraphError(f"attribute 'args': '{n}' is not an identifier", node=node)
    if len(names) != len(specs):
        raise GraphError(f"attribute 'args' names {len(names)} inputs, the node has {len(specs)}", node=node)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise GraphError(f"name '{dup}' is bound to two inputs; set attribute 'args' to distinct names",
                         node=node)
    grad = attrs["grad"]
    if grad is None:
        grad = {}
    if not isinstance(grad, dict):
        raise GraphError("attribute 'grad' must be an object: input name -> derivative formula", node=node)
    for n, text in grad.items():
        if n not in names:
            raise GraphError(f"attribute 'grad' names '{n}', which is not an input (inputs: {', '.join(names)})",
                             node=node)
        if not isinstance(text, str):
            raise GraphError(f"attribute 'grad.{n}' must be a formula string", node=node)
    program = ExprProgram(attrs["formula"], tuple(names), grad, node)
    return Spec(broadcast_shapes(node, [s.shape for s in specs]), FLOAT), {"program": program}


def _forward(xp, *xs, program):
    return program.evaluate(xp, program.tree, xs)


def _vjp(xp, g, saved, program):
    return tuple(g * program.evaluate(xp, program.engine_grad(k), saved) for k in range(len(saved)))


def _sympy(sp, *syms, program):
    return program.tree.xreplace(dict(zip(program.symbols, syms)))


def _cases(rng):
    return [
        Case([REALS.sample(rng, (2, 3))], {"formula": "x*sigmoid(x)", "args": ["x"]}),
        Case([REALS.sample(rng, (4,))], {"formula": "x*sigmoid(x)", "args": ["x"],
                                         "grad": {"x": "sigmoid(x)*(1 + x*(1 - sigmoid(x)))"}}),
        Case([REALS.sample(rng, (2, 1)), NONZERO.sample(rng, (3,))],
             {"formula": "a*exp(-b**2) + log(1 + a**2)/b - tanh(a*b)**3", "args": ["a", "b"]}),
        Case([REALS.sample(rng, ()), REALS.sample(rng, (2,))],
             {"formula": "sqrt(1 + u**2) * erf(v) + softplus(u - v)", "args": ["u", "v"]}),
    ]


register(OpDef(
    name="expr", forward=_forward, vjp=_vjp, infer=_infer, arity=None, input_kinds=(FLOAT,),
    attrs={"formula": Attr("str", doc="formula in the input names, e.g. x*sigmoid(x)"),
           "grad": Attr("value", None, doc="optional object: input name -> derivative formula"),
           "args": Attr("value", None, doc="optional local names bound to the inputs by position")},
    save=save_inputs, broadcast=True, sympy=_sympy, cases=_cases, wants_input_names=True,
    doc="user-defined elementwise op from a formula, with an optional hand-written derivative"))
