"""A safe parser for user formulas (the `expr` op): text -> SymPy tree.

Our own tokenizer and recursive-descent parser over a whitelist: numbers,
the node's local input names, + - * / ** and parentheses, and the functions
of ops/functions.py (read from the op registry). Nothing from the request is ever given to sympify, parse_expr,
eval or exec; SymPy objects are built directly from the tokens. Every
resource is bounded before SymPy sees it: text length, token count, nesting
depth, literal size, constant exponents (so `9**9**9**9` is refused instead
of computed) and the magnitude of constant powers.

Errors are GraphErrors naming the node, the attribute and the offending
token with its column, on one line.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

import sympy as sp

from ..errors import GraphError
from ..limits import FORMULA_MAX_DEPTH
from .functions import formula_functions

MAX_CHARS = 100_000
MAX_TOKENS = 50_000
MAX_DEPTH = FORMULA_MAX_DEPTH
MAX_EXPONENT = 64  # |exponent| of a constant power
MAX_CONSTANT_DIGITS = 300  # |log10| of a constant power's value
MAX_LITERAL = 40  # characters in one numeric literal

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# digits are ASCII only: `\d` would also take "٣" (Arabic-Indic three), and Fraction() reads it as 3
_TOKEN = re.compile(r"\s*(?:(?P<num>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op>\*\*|[-+*/(),])|(?P<bad>\S))")


CONSTANTS = {"pi": sp.pi, "e": sp.E}


class _Token:
    __slots__ = ("kind", "text", "col")

    def __init__(self, kind, text, col):
        self.kind, self.text, self.col = kind, text, col


def tokenize(text: str) -> list[_Token]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # only trailing whitespace left
            break
        kind = m.lastgroup
        out.append(_Token(kind, m.group(kind), m.start(kind) + 1))
        pos = m.end()
        if kind == "bad":  # the parser reports it when it gets there
            break
    out.append(_Token("end", "end of formula", len(text) + 1))
    return out


class FormulaParser:
    def __init__(self, text: str, names: dict, node: str, what: str):
        self.node, self.what = node, what
        if not isinstance(text, str):
            self.fail(f"must be a string, got {type(text).__name__}")
        if len(text) > MAX_CHARS:
            self.fail(f"is {len(text)} characters long, the limit is {MAX_CHARS}")
        self.tokens = tokenize(text)
        if len(self.tokens) > MAX_TOKENS:
            self.fail(f"has more than {MAX_TOKENS} tokens")
        self.names = names
        self.i = 0
        self.depth = 0

    def fail(self, reason: str, tok: _Token | None = None):
        where = f" at column {tok.col}: '{tok.text}'" if tok is not None and tok.kind != "end" else (
            " at end of formula" if tok is not None else "")
        raise GraphError(f"attribute '{self.what}' {reason}{where}", node=self.node)

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def expect(self, text: str):
        t = self.take()
        if t.text != text or t.kind != "op":
            self.fail(f"expects '{text}'", t)

    def parse(self):
        if self.tok.kind == "end":
            self.fail("is empty")
        e = self.sum()
        if self.tok.kind != "end":
            self.fail("has an unexpected " + ("character" if self.tok.kind == "bad" else "token"), self.tok)
        if e.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
            self.fail("is undefined (division by zero?)")
        if any(a.is_Number and a != 0 and _log10(a) > MAX_CONSTANT_DIGITS for a in sp.preorder_traversal(e)):
            self.fail("has a constant too large to represent")
        return e

    def nested(self, tok):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"is nested deeper than {MAX_DEPTH} levels", tok)

    # sums and products are collected and built once: SymPy flattens a chain
    # of binary + in quadratic time
    def sum(self):
        terms = [self.product()]
        while self.tok.kind == "op" and self.tok.text in "+-":
            op = self.take().text
            r = self.product()
            terms.append(r if op == "+" else -r)
        return sp.Add(*terms) if len(terms) > 1 else terms[0]

    def product(self):
        factors = [self.unary()]
        while self.tok.kind == "op" and self.tok.text in "*/":
            t = self.take()
            r = self.unary()
            if t.text == "/" and r == 0:
                self.fail("divides by zero", t)
            factors.append(r if t.text == "*" else 1 / r)
        return sp.Mul(*factors) if len(factors) > 1 else factors[0]

    def unary(self):
        t = self.tok
        if t.kind == "op" and t.text in "+-":
            self.take()
            self.nested(t)
            e = self.unary()
            self.depth -= 1
            return -e if t.text == "-" else e
        return self.power()

    def power(self):
        base = self.atom()
        if self.tok.kind == "op" and self.tok.text == "**":
            t = self.take()
            self.nested(t)
            ex = self.unary()
            self.depth -= 1
            return self.checked_power(base, ex, t)
        return base

    def checked_power(self, base, ex, tok):
        if ex.is_Number:
            if abs(ex) > MAX_EXPONENT:
                self.fail(f"has exponent {ex} (constant exponents are limited to {MAX_EXPONENT} in magnitude)", tok)
            if base.is_Number and base != 0 and abs(float(ex)) * _log10(base) > MAX_CONSTANT_DIGITS:
                self.fail("has a constant power too large to represent", tok)
            if base == 0 and ex < 0:
                self.fail("divides by zero", tok)
        return base**ex

    def atom(self):
        t = self.take()
        if t.kind == "num":
            return self.number(t)
        if t.kind == "name":
            if self.tok.kind == "op" and self.tok.text == "(":
                return self.call(t)
            if t.text in self.names:
                return self.names[t.text]
            if t.text in CONSTANTS:
                return CONSTANTS[t.text]
            self.fail(f"uses unknown name '{t.text}' (inputs: {', '.join(self.names) or 'none'})", t)
        if t.kind == "op" and t.text == "(":
            self.nested(t)
            e = self.sum()
            self.expect(")")
            self.depth -= 1
            return e
        if t.kind == "bad":
            self.fail("has an unexpected character", t)
        self.fail("has an unexpected token" if t.kind != "end" else "ends too early", t)

    def call(self, name_tok):
        functions = formula_functions()
        function = functions.get(name_tok.text)
        if function is None:
            self.fail(f"calls unknown function '{name_tok.text}' (allowed: {', '.join(sorted(functions))})",
                      name_tok)
        arity, build = function.arity, function.sympy
        open_tok = self.take()
        self.nested(open_tok)
        args = [self.sum()]
        while self.tok.kind == "op" and self.tok.text == ",":
            self.take()
            args.append(self.sum())
        self.expect(")")
        self.depth -= 1
        if len(args) != arity:
            self.fail(f"calls '{name_tok.text}' with {len(args)} argument(s), it takes {arity}", name_tok)
        return build(*args)

    def number(self, t):
        if len(t.text) > MAX_LITERAL:
            self.fail(f"has a numeric literal longer than {MAX_LITERAL} characters", t)
        mant, _, exp = t.text.lower().partition("e")
        if exp and abs(int(exp)) > MAX_CONSTANT_DIGITS:
            self.fail("has a numeric literal out of range", t)
        f = Fraction(t.text)
        return sp.Integer(f.numerator) if f.denominator == 1 else sp.Rational(f.numerator, f.denominator)


def _log10(x) -> float:
    if x.is_Rational:
        return abs((abs(x.p).bit_length() - x.q.bit_length()) * math.log10(2.0)) + 1.0
    return abs(math.log10(abs(float(x))))


def symbols_for(names) -> dict:
    return {n: sp.Symbol(n, real=True) for n in names}


def parse_formula(text, symbols: dict, node: str, what: str = "formula"):
    """SymPy tree of `text`, whose only free symbols are values of `symbols` (name -> Symbol)."""
    return FormulaParser(text, symbols, node, what).parse()
