"""Opaque nodes: an op the capture cannot replay, checked on its own, in process, and cut out of the graph.

An op outside capture.py's ATEN table (cumsum, a torch.library custom op, a C++/CUDA/Triton kernel),
or a custom autograd.Function whose forward calls one, cannot be written as registry ops, so the
references cannot differentiate through it. It is verified in three parts, none taken on trust:

1. The op itself (local_check): torch's VJP of the op alone -- `torch.autograd.grad` of a re-run of
   just that op on copies of its inputs, at the cotangent torch's backward reached it with (its
   outputs' adjoints) -- against float64 central differences of the op's forward alone along each
   element of each traced input: steps h = cbrt(eps) max(1, |x|) and h/2, Richardson-extrapolated,
   with an error bound (the two steps' gap plus the rounding term eps |a . f| / h). An element off by
   more than twice its bound (and 1e-6 relative) fails the node, naming it. Where the second-order
   one-sided derivatives on each side differ (a kink within the step: relu at 0), torch's value must
   lie between them (a subgradient, torch's convention there) or the node fails. An element whose
   bound is not small next to its value leaves the node undecided, as does an op with more elements
   than MAX_ELEMENTS (not checked at all). A random op is refused (capture.py).
2. Downstream: each float output of the op is a new parameter of the captured graph (`opaque_NAME_k`)
   holding torch's value, whose claimed gradient is torch's adjoint there (dL/d output, kept by
   retain_grad). The references differentiate the rest of the graph from that parameter on: a wrong
   gradient anywhere after the op fails that parameter, as for any other.
3. Upstream: the op's inputs get torch's VJP v handed back: the loss gains, per traced input x, the
   term sum((x - x0) * v) with x0 = x's value as a constant -- zero in value (the loss stays torch's:
   check_call.stated confirms it), gradient v in x. So the references' gradient of everything before
   the op is what it would be if the op's backward were v, and torch's claimed gradients there are
   checked against it. v is the op's own VJP, which part 1 checks against the forward.

So a wrong backward of the op fails part 1; a wrong gradient after it fails part 2 at that parameter;
one before it fails part 3's parameters. report.data["opaque"] lists each node, how it was checked
and its verdict; a failing one fails the report and an undecided one leaves it "undecided" -- never
"pass". What part 1 cannot see: a backward that differs between the re-run and the call in the
function (state kept across calls), which then shows as a failure upstream, not as a pass.
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

EPS = float(np.finfo(np.float64).eps)
MAX_ELEMENTS = 4096  # traced input elements per opaque node checked in process (4 forwards each)
RTOL = 1e-6  # float64 central differences with Richardson's step pair resolve far below this


@dataclass
class Opaque:
    """One opaque call: how to re-run it on new values of its traced inputs, those inputs (copies taken
    when it ran) with their graph Values, its float outputs with the parameters standing for them."""
    name: str  # "aten::cumsum", "mylib::scale", or the Function's class name
    kind: str  # "torch op" | "autograd.Function"
    source: str  # where: the user's line (and a Function's backward)
    module: str
    run: object  # callable(list of input tensors) -> list of float output tensors
    inputs: list  # the traced float input tensors, cloned at the call
    input_values: list  # their Values in the graph
    outputs: list = field(default_factory=list)  # (autograd output tensor, the parameter Value for it)
    reason: str = ""  # why it is opaque, where it is not simply outside the table
    grad_enabled: bool = True  # torch's grad mode when it ran (False: under torch.no_grad)
    surrogate: str = ""  # a Function declared a surrogate: why (surrogate.py); its own check is waived
    unread: dict = field(default_factory=dict)  # traced input k -> the elements the op never reads (_unread)

    @staticmethod
    def of_op(func, args, kwargs, traced, outputs, where: str, capture, reason: str = "") -> Opaque:
        flat, spec = tree_flatten((list(args), dict(kwargs)))
        positions = [i for i, t in enumerate(traced) if t and flat[i].is_floating_point()]
        values = [capture._lift(flat[i]) for i in positions]
        saved = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in flat]

        def call(new):
            a, k = tree_unflatten(new, spec)
            return func(*a, **k)
        run = _runner(saved, positions, call)
        return Opaque(func.name(), "torch op", where, capture.modules[-1] if capture.modules else "", run,
                      [saved[i] for i in positions], values, outputs, reason, torch.is_grad_enabled(),
                      unread=_unread(func.name(), args, kwargs, positions))

    @staticmethod
    def of_function(cls, args, traced, outputs, reason: str, module: str, capture) -> Opaque:
        positions = [i for i, t in enumerate(traced) if t and args[i].is_floating_point()]
        values = [capture._lift(args[i]) for i in positions]
        saved = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
        run = _runner(saved, positions, lambda new: cls.apply(*new))
        return Opaque(cls.__name__, "autograd.Function", backward_line(cls), module, run,
                      [saved[i] for i in positions], values, outputs, reason)


# ops that read one triangle of a (factor) argument: op -> (the argument's position, `upper`'s position). torch's
# VJP there is a convention in the triangle the op never reads (cholesky_solve's and cholesky_inverse's: the full
# matrix's gradient of L L^T), where the forward's differences are 0 -- no error of the backward's; it is compared
# on the read triangle only, and the VJP is handed back whole (an upstream op's own check, or the values screen,
# sees a dependence the forward does not have). linalg.solve_triangular needs no entry: torch's VJP is 0 in the triangle
# it does not read (and on the diagonal, unitriangular), as the differences are.
READS_TRIANGLE = {"aten::cholesky_solve": (1, 2), "aten::cholesky_inverse": (0, 1)}


def _unread(name: str, args, kwargs, positions: list) -> dict:
    """{traced input k: a bool mask of its elements the op does not read} (READS_TRIANGLE)."""
    if name not in READS_TRIANGLE:
        return {}
    at, flag = READS_TRIANGLE[name]
    factor = args[at] if len(args) > at else None
    upper = bool(args[flag] if len(args) > flag else kwargs.get("upper", False))
    if at not in positions or not isinstance(factor, torch.Tensor) or factor.dim() < 2:
        return {}  # (flat index == argument position: the arguments before it are tensors, one leaf each)
    n = factor.shape[-1]
    other = torch.ones(factor.shape[-2], n, dtype=torch.bool)
    other = other.tril(-1) if upper else other.triu(1)
    return {positions.index(at): other.expand(factor.shape).reshape(-1).clone()}


def _runner(saved: list, positions: list, call):
    """run(ts): `call` on the saved arguments with the traced float ones at `positions` replaced by ts; its
    float tensor outputs."""
    def run(ts):
        new = list(saved)
        for i, t in zip(positions, ts):
            new[i] = t
        return _float_list(call(new))
    return run


def _float_list(out) -> list:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [t for t in outs if isinstance(t, torch.Tensor) and t.is_floating_point()]


_LINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Function class -> backward_line's answer


def backward_line(cls) -> str:
    """FILE:LINE of a Function's backward, read once per class (inspect reads the source file: ~2 ms, more than
    a tiny Function's own check)."""
    if cls not in _LINES:
        try:
            _LINES[cls] = f"{inspect.getsourcefile(cls.backward)}:{inspect.getsourcelines(cls.backward)[1]}"
        except (OSError, TypeError):
            _LINES[cls] = "source unknown"
    return _LINES[cls]


def vjp(node: Opaque, adjoints: list) -> list:
    """torch's VJP of the op alone at its outputs' adjoints: one tensor per traced input (zeros where the op
    does not reach it)."""
    xs = [x.detach().clone().requires_grad_(True) for x in node.inputs]
    outs = node.run(xs)
    pairs = [(o, a) for o, a in zip(outs, adjoints) if o.requires_grad]
    if not pairs or not xs:
        return [torch.zeros_like(x) for x in xs]
    grads = torch.autograd.grad([o for o, _ in pairs], xs, [a for _, a in pairs], allow_unused=True)
    return [torch.zeros_like(x) if g is None else g.detach() for x, g in zip(xs, grads)]


def local_check(node: Opaque, adjoints: list, vjps: list) -> dict:
    """Part 1 of the module docstring: torch's VJP against central differences of the forward alone."""
    n = sum(x.numel() for x in node.inputs)
    entry = {"op": node.name, "kind": node.kind, "source": node.source, "module": node.module,
             "parameters": [v.name for _, v in node.outputs], "elements": n,
             "checked": "in process: torch's VJP of the op alone at torch's adjoint of its outputs, against float64 "
                        "central differences of its forward alone (steps h and h/2, Richardson-extrapolated, with "
                        "an error bound; one-sided ones at a kink); its outputs are parameters of the graph "
                        "(claimed: torch's adjoint) and its inputs get that VJP handed back"}
    if node.reason:
        entry["reason"] = node.reason
    if n > MAX_ELEMENTS:
        return {**entry, "verdict": "undecided",
                "detail": f"not checked: {n} input elements, over the in-process limit of {MAX_ELEMENTS}"}
    worst, undecided, kinks = None, 0, 0
    with torch.no_grad():
        base = _weighted(node, adjoints, 0, [0], 0.0)[0]
        for k, (x, v) in enumerate(zip(node.inputs, vjps)):
            for j, got in _directions(node, k, x, v):
                d = _difference(node, adjoints, base, k, j)
                verdict, ref, bound = _judged(d, got)
                kinks += verdict == "kink"
                undecided += verdict == "undecided"
                if verdict == "fail" and (worst is None or abs(got - ref) > worst[0]):
                    worst = (abs(got - ref), k, j, got, ref, bound)
    if worst is not None:
        off, k, j, got, ref, bound = worst
        index = [int(i) for i in np.unravel_index(j[0], tuple(node.inputs[k].shape))]
        return {**entry, "verdict": "fail",
                "detail": f"its backward disagrees with the derivative of its forward: input {k} (worst "
                          f"{index}: torch's VJP {got:.6g}, differences {ref:.6g} +- {bound:.2g})"}
    if undecided:
        return {**entry, "verdict": "undecided",
                "detail": f"not decided: {undecided} of {n} elements have a difference whose error bound is not "
                          "small next to it"}
    at_kinks = f"; {kinks} at a kink, where torch's value lies between the one-sided derivatives" if kinks else ""
    unread = sum(int(m.sum()) for m in node.unread.values())
    at_kinks += f"; {unread} it never reads (a triangle) not compared" if unread else ""
    return {**entry, "verdict": "pass",
            "detail": f"its backward agrees with the derivative of its forward ({n} elements{at_kinks})"}


# ops that read one triangle of a matrix they take to be symmetric (UPLO): torch's VJP is the one for the
# symmetric matrix, so on a symmetric input element (i, j) is differenced along E_ij + E_ji against
# v_ij + v_ji -- a lone upper-triangle step changes nothing (eigh reads the lower one), which is no
# error of the backward's. On an input that is not symmetric, the elements one by one, as torch's gradcheck.
SYMMETRIC_INPUT = {"aten::_linalg_eigh", "aten::linalg_cholesky_ex", "aten::cholesky"}


def _directions(node: Opaque, k: int, x: torch.Tensor, v: torch.Tensor):
    """(the flat indices of input k one difference moves together, torch's VJP along them), for each one."""
    flat = v.reshape(-1)
    if k in node.unread:  # the triangle the op reads (READS_TRIANGLE)
        yield from (([j], float(flat[j])) for j in range(x.numel()) if not node.unread[k][j])
        return
    n = x.shape[-1] if x.dim() >= 2 else 0
    if k or node.name not in SYMMETRIC_INPUT or x.dim() < 2 or x.shape[-2] != n or \
            not torch.allclose(x, x.mT, rtol=1e-12, atol=0.0):
        yield from (([j], float(flat[j])) for j in range(x.numel()))
        return
    for j in range(x.numel()):
        row, col = divmod(j % (n * n), n)
        if row == col:
            yield [j], float(flat[j])
        elif row > col:
            mirror = j + (col - row) * (n - 1)  # (row, col) -> (col, row): j - row*n - col + col*n + row
            yield [j, mirror], float(flat[j] + flat[mirror])


@dataclass
class _Difference:
    """One element's differences: Richardson's value, its error bound and truncation part, the rounding
    term, and the second-order one-sided derivatives on each side."""
    value: float
    bound: float
    truncation: float
    rounding: float
    left: float
    right: float


def _judged(d: _Difference, got: float):
    """(verdict of torch's value `got` for one element: pass | fail | kink | undecided, reference, bound). Where
    the one-sided derivatives differ (a kink within the step), torch's value must lie between them."""
    size = max(abs(d.value), abs(got))
    sides = max(abs(d.left), abs(d.right), abs(got))
    if abs(d.right - d.left) > 1e-4 * sides + 16 * d.rounding:
        lo, hi = min(d.left, d.right), max(d.left, d.right)
        inside = lo - 16 * d.rounding - RTOL * sides <= got <= hi + 16 * d.rounding + RTOL * sides
        return ("kink" if inside else "fail"), (lo if got < lo else hi), 16 * d.rounding
    if abs(got - d.value) > 2 * d.bound + RTOL * size:
        return "fail", d.value, d.bound
    if d.truncation > 1e-3 * size + 4 * d.rounding:
        return "undecided", d.value, d.bound
    return "pass", d.value, d.bound


def _weighted(node: Opaque, adjoints: list, k: int, j: list, step: float):
    """(sum(a . f(x)), sum |a . f(x)|) with the elements j (flat indices) of input k moved by step."""
    xs = [t.clone(memory_format=torch.contiguous_format) for t in node.inputs]
    if xs:
        xs[k].reshape(-1)[j] += step
    terms = [(o.to(torch.float64) * a) for o, a in zip(node.run(xs), adjoints)]
    return float(sum(t.sum() for t in terms)), float(sum(t.abs().sum() for t in terms))


def _difference(node: Opaque, adjoints: list, base: float, k: int, j: list) -> _Difference:
    """The derivative of sum(a . f(x)) along the elements j of input k together, at steps h and h/2 (base: its
    value at x)."""
    x0 = float(node.inputs[k].reshape(-1)[j[0]])  # (the elements moved together hold one value: symmetric)
    h = float(np.cbrt(EPS) * max(1.0, abs(x0)))
    h = (x0 + h) - x0  # exact in binary: x + h - x == h
    (p1, m1), (n1, m2), (p2, m3), (n2, m4) = (_weighted(node, adjoints, k, j, s) for s in (h, -h, h / 2, -h / 2))
    d1, d2 = (p1 - n1) / (2 * h), (p2 - n2) / h
    value = (4 * d2 - d1) / 3
    truncation = abs(value - d2)
    rounding = 4 * EPS * max(m1, m2, m3, m4, abs(base)) / (h / 2)
    return _Difference(value, truncation + rounding, truncation, rounding,
                       left=(3 * base - 4 * n2 + n1) / h, right=(-3 * base + 4 * p2 - p1) / h)
