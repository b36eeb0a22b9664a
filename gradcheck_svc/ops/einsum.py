"""einsum: ONNX Einsum and numpy.einsum, for equations without ellipses or repeated letters in one
operand (a diagonal): products, contractions, transpositions, reductions, outer products.

The vjp of operand k is the einsum of the output's gradient with the other operands, written back to
operand k's letters; a letter only operand k has (summed away, as in "ij->i") is broadcast back.
Every operand and the output get a leading "..." internally: the extra batch axes that finite
differences push through the graph broadcast like any other.

Contracted with `optimize=True` (NumPy's greedy pairwise order; CuPy's einsum takes the same option):
an 8-operand chain is seven small products instead of one loop over every letter combination (20^9
of them for 20 x 20 operands). The order keeps each intermediate no larger than the largest operand
or output (NumPy's default memory limit), so memory stays within what validation counted; an
equation that has no such order is one loop, as before, and only the time limit ends it (bounded.py
in-process, the worker's kill in the server).
"""
from __future__ import annotations

from ..errors import GraphError
from .base import FLOAT, REALS, Attr, Case, OpDef, Spec
from .registry import register


def parse(node: str, equation: str, n_inputs: int) -> tuple[list[str], str]:
    """(input subscripts, output subscript) of an equation in explicit or implicit form."""
    eq = equation.replace(" ", "")
    if "." in eq:
        raise GraphError("einsum with an ellipsis (...) is not supported", node=node)
    lhs, arrow, out = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != n_inputs:
        raise GraphError(f"einsum equation '{equation}' names {len(ins)} operands, the node has {n_inputs}",
                         node=node)
    letters = "".join(ins)
    if not all(c.isalpha() for c in letters + out):
        raise GraphError(f"einsum equation '{equation}' holds a character that is not a letter", node=node)
    for s in ins:
        if len(set(s)) != len(s):
            raise GraphError(f"einsum operand '{s}' repeats a letter (a diagonal): not supported", node=node)
    if not arrow:  # implicit: the letters that appear once, in alphabetical order
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(set(out)) != len(out) or any(c not in letters for c in out):
        raise GraphError(f"einsum output '{out}' repeats a letter or names one no operand has", node=node)
    return ins, out


def _infer(node, specs, attrs):
    ins, out = parse(node, attrs["equation"], len(specs))
    dims: dict[str, int] = {}
    for s, spec in zip(ins, specs):
        if len(s) != spec.rank:
            raise GraphError(f"einsum operand '{s}' has {len(s)} letters for a value of rank {spec.rank}", node=node)
        for c, d in zip(s, spec.shape):
            if dims.setdefault(c, d) != d:
                raise GraphError(f"einsum letter '{c}' has sizes {dims[c]} and {d}", node=node)
    return Spec(tuple(dims[c] for c in out), FLOAT), {"equation": ",".join(ins) + "->" + out}


def _split(equation):
    lhs, _, out = equation.partition("->")
    return lhs.split(","), out


def _forward(xp, *xs, equation):
    ins, out = _split(equation)
    return xp.einsum(",".join("..." + s for s in ins) + "->..." + out, *xs, optimize=True)


def _vjp(xp, g, saved, *, equation):
    ins, out = _split(equation)
    grads = []
    for k, (s, x) in enumerate(zip(ins, saved)):
        others = [(t, y) for j, (t, y) in enumerate(zip(ins, saved)) if j != k]
        seen = set(out).union(*[set(t) for t, _ in others])
        kept = "".join(c for c in s if c in seen)
        gk = xp.einsum(",".join([out] + [t for t, _ in others]) + "->" + kept, g, *[y for _, y in others],
                       optimize=True)
        if kept != s:  # letters only operand k has: its gradient is constant along them
            shape = tuple(x.shape[i] if c in seen else 1 for i, c in enumerate(s))
            gk = xp.broadcast_to(gk.reshape(shape), x.shape)
        grads.append(gk)
    return tuple(grads)


def _cases(rng):
    def case(equation, *shapes):
        return Case([REALS.sample(rng, s) for s in shapes], {"equation": equation})
    return [case("ij,jk->ik", (2, 3), (3, 4)), case("bhqd,bhkd->bhqk", (1, 2, 3, 2), (1, 2, 4, 2)),
            case("ij->ji", (2, 3)), case("ij->i", (3, 4)), case("i,j->ij", (3,), (2,)), case("ij,jk", (2, 2), (2, 3)),
            case("ij,ij->", (2, 3), (2, 3)), case("abc,cd,da->b", (2, 3, 2), (2, 4), (4, 2))]


register(OpDef(
    name="einsum", forward=_forward, vjp=_vjp, infer=_infer, arity=None, input_kinds=(FLOAT,),
    attrs={"equation": Attr("str", doc="e.g. 'bij,bjk->bik'; no ellipsis, no repeated letter in one operand")},
    cases=_cases, numpy=None, multilinear="all",
    doc="Einstein summation over letters (numpy.einsum, ONNX Einsum) without ellipses or diagonals"))
