"""What an op is: the OpDef record, its attribute schema, and shape helpers.

An OpDef keeps everything about one operator in one place: how to run it
(`forward`), what its backward needs (`save`) and how to differentiate it
(`vjp`), how to type-check a node (`infer`), its scalar SymPy formula for
elementwise ops, the input domain where it is smooth, and its kinks with the
convention used there. The registry (ops/__init__.py) drives validation, the
oracles, the op audit, ListOps and the registry-wide tests.

Conventions every op follows:
- `forward(xp, *xs, **attrs)` may see extra *leading* batch axes on its float
  inputs (the finite-difference oracle pushes a stack of perturbed inputs
  through the graph in one pass). Ops therefore address axes from the end
  (attributes are normalized to negative axes by `infer`) and take static
  shapes from `attrs`, never from a batched array.
- `vjp(xp, g, saved, **attrs)` runs unbatched and returns one gradient per
  input (None for a non-differentiable input). A gradient may come back in the
  broadcast shape: the engine sums it back to the input's shape in one place.
  A vjp that declares a keyword `needs_input_grad=None` is told which inputs
  need a gradient (a tuple of bools, as PyTorch's ctx.needs_input_grad) and
  may return None for the others (matmul skips the GEMM of a data input); None
  means all. A vjp without that keyword gets no mask and the engine ignores
  the gradients nobody needs, so ops written either way mix.
- `save(xs, y, **attrs)` returns the tensors the vjp needs. The engine owns
  them (fingerprints, version checks and memory accounting live there); an op
  never keeps a tensor itself. A save that declares `needs_input_grad` gets the
  vjp's mask too (when the vjp takes it as well) and keeps only what the needed
  gradients read, as PyTorch saves
  for backward (matmul: a data operand's partner is not kept), with an empty
  placeholder of its own in the unneeded tensor's place.
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import GraphError
from . import slices

FLOAT, INT, BOOL = "float", "int64", "bool"
REQUIRED = object()


@dataclass(frozen=True)
class Spec:
    """Static type of a value: shape plus dtype class (float precision is chosen at run time)."""

    shape: tuple[int, ...]
    dtype: str = FLOAT

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Attr:
    """Schema of one attribute. kind: int, float, bool, str, ints, value (any JSON)."""

    kind: str
    default: Any = REQUIRED
    choices: tuple = ()
    doc: str = ""


@dataclass(frozen=True)
class Domain:
    """Where an input is smooth, for drawing test points: uniform in [lo, hi],
    redrawn while closer than `gap` to any point in `avoid` (the kinks)."""

    lo: float = -2.0
    hi: float = 2.0
    avoid: tuple[float, ...] = ()
    gap: float = 0.05
    signed_magnitude: bool = False  # draw |x| in [lo, hi] with a random sign

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        x = rng.uniform(self.lo, self.hi, size=shape)
        if self.signed_magnitude:
            x = x * rng.choice([-1.0, 1.0], size=shape)
        for _ in range(100):
            bad = np.zeros(np.shape(x), dtype=bool)
            for p in self.avoid:
                bad |= np.abs(x - p) < self.gap
            if not bad.any():
                break
            x = np.where(bad, self.sample_plain(rng, np.shape(x)), x)
        return np.asarray(x, dtype=np.float64)

    def sample_plain(self, rng, shape):
        x = rng.uniform(self.lo, self.hi, size=shape)
        return x * rng.choice([-1.0, 1.0], size=shape) if self.signed_magnitude else x


REALS = Domain()
POSITIVE = Domain(0.2, 3.0)
NONZERO = Domain(0.3, 2.0, signed_magnitude=True)


@dataclass(frozen=True)
class Kink:
    """A non-differentiable point and the (sub)gradient convention used there.

    `distance(xs, attrs)` returns, per element of the op's output broadcast
    shape, how far the inputs are from the kink (0 = exactly at it); the
    diagnosis uses it to tell a kink from a bug."""

    where: str
    convention: str
    distance: Callable | None = None


@dataclass
class Case:
    """One test point for an op: float/int/bool inputs (host arrays) and attributes."""

    inputs: list
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OpDef:
    name: str
    forward: Callable
    vjp: Callable | None
    infer: Callable  # (node, [Spec], attrs) -> (Spec, normalized attrs)
    arity: int | None  # None: variadic (at least one input)
    input_kinds: tuple[str, ...]  # dtype class per input (variadic: one entry for all)
    attrs: dict[str, Attr] = field(default_factory=dict)
    save: Callable = None  # (xs, y, **attrs) -> tuple; default: the inputs
    differentiable: tuple[bool, ...] | None = None  # per input; default: float inputs
    broadcast: bool = False  # numpy broadcasting between inputs (engine aligns/unbroadcasts)
    sympy: Callable | None = None  # (sp, *symbols, **attrs) -> expression, elementwise ops
    domain: tuple[Domain, ...] = ()
    kinks: tuple[Kink, ...] = ()
    cases: Callable | None = None  # (rng) -> [Case], test points incl. broadcasting
    wants_dtype: bool = False  # forward receives dtype= (the run's float dtype)
    wants_input_names: bool = False  # infer receives attrs["input_names"] (the node's input value names)
    doc: str = ""
    # How other tables name this op (ops/functions.py derives them; each is optional):
    formula_name: str | None = None  # a user formula (the expr op) may call it by this name, with `sympy`
    numpy: str | None = None  # NumPy's function with the same inputs and keyword attributes (np.NAME)
    torch: str | None = None  # torch's function with the same inputs and keyword attributes, dotted
    onnx: str | None = None  # ONNX's operator with the same inputs and no attributes (the importer maps it as is)
    # How a stack of one-slice changes (ops/slices.py) passes through the op, for full-Jacobian
    # finite differences: sliced(xp, op, xs, base_out, attrs) -> Sliced | dense stack | None (densify),
    # and the axis each input would best change along (negative: from the end; else from the front).
    # Elementwise ops (those with `sympy`) get slices.elementwise by default; other ops without a
    # rule receive the stack densified.
    sliced: Callable | None = None
    sliced_axes: tuple[int, ...] | None = None
    # Elements of the largest temporary the op allocates besides its output (conv's im2col matrix):
    # scratch(in_shapes, out_shape, attrs) -> int, attrs as `infer` normalized them. Counted against
    # max_elements at validation and in finite differences' batch sizes, before anything is allocated.
    scratch: Callable | None = None
    # Frozen branches, for finite differences (oracles/finite_diff.py) -- forward code, never derivative
    # code: a piecewise op's piece at the unperturbed inputs, select(xp, *xs, **attrs) -> selection (a
    # mask, the argmax positions, the winning side), and its forward on that piece alone,
    # frozen(xp, selection, *xs, **attrs) -> y, equal to `forward` at every input that selects the same
    # piece. The selection has the unbatched shape; xs may carry leading batch axes. At an exact tie the
    # selection is the piece the engine's convention names (relu's x > 0, max_pool's first maximum).
    # An op whose output is piecewise constant (sign, floor, comparisons) needs neither: finite
    # differences hold every such value at its unperturbed one (`held`).
    select: Callable | None = None
    frozen: Callable | None = None
    held: bool = False
    # Complex-step differences (oracles/fd_complex.py): the forward (and frozen piece) takes complex128 inputs
    # and computes the analytic extension, the real part selecting every branch -- NumPy's complex arithmetic,
    # never a derivative table. An op that cannot says False here, or where it cannot, a predicate of its
    # base inputs, complex_step(xs, attrs) -> bool: parameters upstream of it keep real central differences,
    # and the plan names it.
    complex_step: bool | Callable = True
    # The leading inputs in which the forward is multilinear (matmul, conv, einsum: one entry of each in every
    # product term); any later inputs only add to the output and may be left out (conv's bias). A complex
    # step through such an op is written out on (real, imaginary) pairs (engine/executor.py multilinear_step):
    # the real part is the base's output, shared by every copy, and each copy's imaginary part is the
    # forward itself with one factor's imaginary part and the others' base values, summed over the factors
    # (A Bi + Ai B: two real products where NumPy's complex one costs four) -- still the forward's own
    # arithmetic, dropping only Ai Bi, an h^2 term of the real part.
    multilinear: tuple[int, ...] | str = ()  # "all": every input given (einsum)
    # A piecewise op whose frozen piece is linear in its one input (relu's mask, max_pool's gather): a complex
    # step passes it as that piece applied to the imaginary part alone, its real part the base's output.
    frozen_linear: bool = False
    # Linear in all its inputs together (add, sub, concat, the shape ops, sum and mean): a complex step through
    # it is the forward of the inputs' imaginary parts (an input that is not perturbed counts as 0), its real
    # part the base's output (engine/executor.py linear_step) -- a Pair stays a Pair, with no complex copy.
    linear: bool = False

    @property
    def save_takes_needs_input_grad(self) -> bool:
        """The save rule declares `needs_input_grad` (see the module docstring)."""
        return _takes_needs_input_grad(self.save)

    @property
    def takes_needs_input_grad(self) -> bool:
        """The vjp declares a `needs_input_grad` parameter by name (a catch-all **kwargs does not count:
        a wrapper forwarding **kwargs to another op's vjp must not hand it a keyword it may not take)."""
        return _takes_needs_input_grad(self.vjp)

    @property
    def slice_rule(self) -> Callable | None:
        if self.sliced is not None:
            return self.sliced
        return slices.elementwise if self.sympy is not None else None

    def kind_of(self, i: int) -> str:
        return self.input_kinds[min(i, len(self.input_kinds) - 1)]

    def is_differentiable(self, i: int) -> bool:
        if self.vjp is None:
            return False
        if self.differentiable is not None:
            return self.differentiable[min(i, len(self.differentiable) - 1)]
        return self.kind_of(i) == FLOAT

    def domain_of(self, i: int) -> Domain:
        if not self.domain:
            return REALS
        return self.domain[min(i, len(self.domain) - 1)]


@functools.lru_cache(maxsize=None)
def _takes_needs_input_grad(fn) -> bool:
    if fn is None:
        return False
    try:
        p = inspect.signature(fn).parameters.get("needs_input_grad")
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def save_inputs(xs, y, **attrs):
    return tuple(xs)


def save_nothing(xs, y, **attrs):
    return ()


# --- static shape helpers used by `infer` functions ------------------------------


def broadcast_shapes(node: str, shapes: Sequence[tuple]) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise GraphError(
            "cannot broadcast shapes " + ", ".join(str(list(s)) for s in shapes), node=node
        ) from None


def norm_axis(node: str, axis, rank: int, what: str = "axis") -> int:
    """Normalize one axis to a negative index (valid on batched arrays too)."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise GraphError(f"{what} must be an integer, got {axis!r}", node=node)
    if not -rank <= axis < rank:
        raise GraphError(f"{what} {axis} is out of range for rank {rank}", node=node)
    return axis - rank if axis >= 0 else axis


def norm_axes(node: str, axes, rank: int) -> tuple[int, ...]:
    """None -> all axes; int or list -> sorted unique negative axes."""
    if axes is None:
        return tuple(range(-rank, 0))
    if isinstance(axes, int) and not isinstance(axes, bool):
        axes = [axes]
    out = sorted({norm_axis(node, a, rank) for a in axes})
    if len(out) != len(axes):
        raise GraphError(f"repeated axis in {list(axes)}", node=node)
    return tuple(out)


def lead_of(x, rank: int) -> int:
    """Number of leading batch axes on an array whose static rank is `rank`."""
    return x.ndim - rank


def unary_case(rng, domain: Domain, extra_attrs=None):
    shapes = [(), (3,), (2, 1, 3)]
    return [Case([domain.sample(rng, s)], dict(extra_attrs or {})) for s in shapes]


def binary_cases(rng, d0: Domain, d1: Domain):
    # equal shapes, scalar broadcasting, size-1 axes and rank promotion both ways
    pairs = [((3,), (3,)), ((2, 3), ()), ((2, 1, 3), (4, 1)), ((1,), (2, 3)), ((), ())]
    return [Case([d0.sample(rng, a), d1.sample(rng, b)]) for a, b in pairs]
