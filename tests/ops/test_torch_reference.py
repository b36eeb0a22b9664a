"""The engine's gradients against torch autograd on random composite graphs.

torch is the independent reference here: each graph is built once with
GraphBuilder (real protobuf) and, node by node, replayed eagerly in torch
through TORCH_OPS below: the registry's torch names (OpDef.torch) for ops
that torch spells alike, and this test's adapters for the rest. The
engine loads the protobuf message, runs forward and backward, and every
parameter's gradient must match torch's.

Graphs are random DAGs (seeded) mixing elementwise, broadcasting, matmul,
reductions, softmax/logsumexp/losses, shape ops, take and concat; values feed
several consumers. Each graph is forced to contain a slice of the mapped ops
(round robin) so that, together, the graphs exercise every mapped op, and a
registry audit fails when an op has no torch mapping and no written waiver.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import LazyModule

torch = LazyModule("torch")  # imported by the first test that uses it
F = LazyModule("torch.nn.functional")

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import all_ops
from gradcheck_svc.ops.base import REALS
from test_cnn_ops_torch import TORCH as CNN_TORCH  # the ops checked there
from test_onnx_ops_torch import TORCH as ONNX_OPS_TORCH  # and there

N_GRAPHS = 30
RANDOM_NODES = 12  # per graph, after the forced ones
FORCED_PER_GRAPH = 3  # 30 graphs x 3 slots cover every mapped op at least twice


def _dims(axis, ndim):
    return tuple(range(ndim)) if axis is None else tuple([axis] if isinstance(axis, int) else axis)


def _slice(x, starts, ends, axes=None, steps=None):
    index = [slice(None)] * x.ndim
    axes = axes if axes is not None else range(len(starts))
    steps = steps if steps is not None else [1] * len(starts)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        index[ax] = slice(st, en, sp)
    return x[tuple(index)]


def _take(x, idx, axis=0):
    a = axis % x.ndim
    return x[(slice(None),) * a + (idx,)]


def _prod(x, axis, keepdims):
    """torch.prod reduces one dim at a time: the highest first, so the lower indices stay right."""
    for d in sorted((a % x.ndim for a in _dims(axis, x.ndim)), reverse=True):
        x = torch.prod(x, d, keepdim=keepdims)
    return x


def _squeeze(x, axis=None):
    return x.squeeze() if axis is None else x.squeeze(tuple(_dims(axis, x.ndim)))


def _cross_entropy(logits, labels, reduction="mean"):
    if logits.ndim == 1:
        logits, labels = logits[None], labels[None]
    return F.cross_entropy(logits, labels, reduction=reduction)


def _mse(a, b, reduction="mean"):
    a, b = torch.broadcast_tensors(a, b)
    return F.mse_loss(a, b, reduction=reduction)


def _torch_function(dotted: str):
    obj = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


# ops whose OpDef names torch's function of the same inputs and attributes (OpDef.torch)
FROM_REGISTRY = {op.name: _torch_function(op.torch) for op in all_ops() if op.torch}

# the rest: how torch spells them differs (dim for axis, keepdim, ...), so the test says it here;
# op name -> torch function of (inputs..., **the node's attributes as given to GraphBuilder)
ADAPTED = {
    "sum": lambda x, axis=None, keepdims=False: torch.sum(x, _dims(axis, x.ndim), keepdim=keepdims),
    "mean": lambda x, axis=None, keepdims=False: torch.mean(x, _dims(axis, x.ndim), keepdim=keepdims),
    "max": lambda x, axis=None, keepdims=False: torch.amax(x, _dims(axis, x.ndim), keepdim=keepdims),
    "min": lambda x, axis=None, keepdims=False: torch.amin(x, _dims(axis, x.ndim), keepdim=keepdims),
    "norm": lambda x, axis=None, keepdims=False: torch.linalg.vector_norm(x, 2, _dims(axis, x.ndim),
                                                                          keepdim=keepdims),
    "softmax": lambda x, axis=-1: torch.softmax(x, axis),
    "log_softmax": lambda x, axis=-1: torch.log_softmax(x, axis),
    "logsumexp": lambda x, axis=-1, keepdims=False: torch.logsumexp(x, axis, keepdim=keepdims),
    "cross_entropy": _cross_entropy,
    "mse_loss": _mse,
    "reshape": lambda x, shape: x.reshape(shape),
    "transpose": lambda x, axes=None: x.permute(axes if axes is not None else tuple(range(x.ndim))[::-1]),
    "broadcast_to": lambda x, shape: torch.broadcast_to(x, shape),
    "tile": lambda x, reps: torch.tile(x, reps),
    "elu": lambda x, alpha=1.0, scale=1.0: scale * F.elu(x, alpha),
    "expand_dims": lambda x, axis: x.unsqueeze(axis),
    "squeeze": _squeeze,
    "concat": lambda *xs, axis=0: torch.cat(xs, axis),
    "slice": _slice,
    "take": _take,
    "take_along_axis": lambda x, idx, axis: torch.take_along_dim(x, idx, axis),
    "constant": lambda value, dtype="float64": torch.tensor(value, dtype=torch.float64),
    "prod": lambda x, axis=None, keepdims=False: _prod(x, axis, keepdims),
}
TORCH_OPS = {**FROM_REGISTRY, **ADAPTED}

# Registry ops with no torch counterpart in TORCH_OPS, each with the reason.
WAIVED: dict[str, str] = {
    # torch draws its own mask; ours is a pure function of (seed, node), checked against finite
    # differences (test_ops_registry) and replayed bit for bit under checkpointing (test_checkpoint)
    "dropout": "random mask with no torch counterpart",
    # a user formula: checked against SymPy's derivative (test_expr_op, audit-ops)
    "expr": "user-defined formula, no fixed torch counterpart",
    # (N, C, *spatial) ops: the random DAGs here use small generic shapes; each is checked against torch
    # autograd on all its own test cases in test_cnn_ops_torch.py, and in real models in
    # test_onnx_torch_roundtrip.py
    **{op: "N-C-spatial op, against torch in test_cnn_ops_torch.py" for op in CNN_TORCH},
    **{op: "torch spells it differently or it makes a mask, against torch in test_onnx_ops_torch.py"
       for op in ONNX_OPS_TORCH},
    "constant_of_shape": "no inputs, no gradient: a filled tensor (its forward is checked by the ONNX forward tests)",
    "resize": "against nn.Upsample (nearest, bilinear, align_corners) in test_model_zoo.py's U-Nets, and ONNX's own "
              "Resize node tests in test_onnx_node_tests.py",
    "top_k_indices": "int64 positions, no gradient: against torch.topk + gather in test_model_zoo.py's MoE, against "
                     "ONNX's reference at ties in test_onnx_topk_indices.py",
    "put_along_axis": "int64 computed indices: against torch's scatter in test_onnx_every_parameter.py's MoE",
    **{op: "N-C-H-W with int64 corners: against F.grid_sample (every mode, padding, alignment) in "
           "test_onnx_grid_sample.py" for op in ("grid_sample", "grid_sample_corners")},
}


class RandomGraph:
    """Builds one random graph in GraphBuilder and, eagerly, in torch (float64).

    torch's eager values give every value's shape and magnitude while the
    graph grows, so each op is fed inputs that fit it."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.b = GraphBuilder(f"random{seed}")
        self.t: dict[str, torch.Tensor] = {}  # torch value of every graph value
        self.params: list[str] = []
        self.floats: list[str] = []  # float values available as inputs
        self.used: set[str] = set()  # values consumed by some node
        self.ops: set[str] = set()
        self._n = 0

    # --- inputs -------------------------------------------------------------------
    def param(self, shape) -> str:
        name = f"p{len(self.params)}"
        value = self.rng.standard_normal(shape)
        self.b.input(name, value, requires_grad=True)
        self.t[name] = torch.tensor(value, dtype=torch.float64, requires_grad=True)
        self.params.append(name)
        self.floats.append(name)
        return name

    def data(self, value, dtype: str) -> str:
        """A graph input that is not a parameter: int64 indices, bool masks, weights."""
        self._n += 1
        name = f"d{self._n}"
        self.b.input(name, value, dtype=dtype)
        self.t[name] = torch.tensor(np.asarray(value), dtype={"int64": torch.int64, "bool": torch.bool,
                                                              "float64": torch.float64}[dtype])
        return name

    # --- nodes --------------------------------------------------------------------
    def node(self, op: str, *inputs: str, **attrs) -> str:
        name = self.b.node(op, *inputs, **attrs)
        self.t[name] = TORCH_OPS[op](*[self.t[i] for i in inputs], **attrs)
        self.used.update(inputs)
        self.ops.add(op)
        if self.t[name].is_floating_point():
            self.floats.append(name)
        return name

    def shape(self, name: str) -> tuple:
        return tuple(self.t[name].shape)

    def pick(self, ok=lambda shape: True, avoid=()) -> str | None:
        """A float value whose shape passes ok, biased towards recent values (deep graphs)."""
        cands = [v for v in self.floats if v not in avoid and ok(self.shape(v))]
        if not cands:
            return None
        w = np.arange(1, len(cands) + 1, dtype=float) ** 1.5
        return cands[self.rng.choice(len(cands), p=w / w.sum())]

    def partner(self, a: str) -> str:
        """Another value that broadcasts with a (a fresh parameter if none does)."""
        sa = self.shape(a)
        b = self.pick(lambda s: _broadcasts(s, sa), avoid=(a,))
        return b if b is not None else self.param(sa[self.rng.integers(0, len(sa) + 1):])

    def bounded(self, x: str, limit: float) -> str:
        """x, squashed by tanh when its magnitude could overflow the op it feeds."""
        return x if float(self.t[x].detach().abs().max()) <= limit else self.node("tanh", x)

    def positive(self, x: str) -> str:
        """softplus(x) + 0.3 > 0, for ops defined on positive inputs."""
        c = self.node("constant", value=np.full(self.shape(x), 0.3).tolist())
        return self.node("add", self.node("softplus", x), c)

    def finish(self) -> None:
        """loss = sum over unconsumed values v of sum(v * r_v), r_v random weights."""
        leaves = [v for v in self.floats if v not in self.used and v not in self.params]
        terms = []
        for v in leaves:
            w = self.data(self.rng.uniform(0.5, 1.5, size=self.shape(v)), "float64")
            terms.append(self.node("sum", self.node("mul", v, w)))
        loss = terms[0]
        for t in terms[1:]:
            loss = self.node("add", loss, t)
        self.b.output(loss)
        self.loss = loss
        grads = torch.autograd.grad(self.t[loss], [self.t[p] for p in self.params], allow_unused=True)
        self.grads = {p: (np.zeros(self.shape(p)) if d is None else d.numpy()) for p, d in zip(self.params, grads)}


def _broadcasts(a, b) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


# --- one emitter per mapped op: picks fitting inputs and adds the node ----------------

def _unary(op, **attrs):
    return lambda g: g.node(op, g.pick(), **attrs)


def _binary(op):
    def emit(g):
        a = g.pick()
        return g.node(op, a, g.partner(a))
    return emit


def _square_matrix(g):
    """A well-conditioned 3x3 matrix from the graph: |entries| <= 1 (tanh) plus 4 I."""
    x = g.pick(lambda s: s == (3, 3)) or g.param((3, 3))
    return g.node("add", g.bounded(x, 1.0), g.data(4.0 * np.eye(3), "float64"))


def _emit_solve(g):
    b = g.pick(lambda s: len(s) == 2 and s[0] == 3) or g.param((3, 2))
    return g.node("solve", _square_matrix(g), b)


def _emit_exp(g):
    return g.node("exp", g.bounded(g.pick(), 3.0))


def _emit_arcsin(g):
    """arcsin of 0.9 tanh(x): inside (-1, 1), away from its infinite derivative at the ends."""
    x = g.node("tanh", g.pick())
    return g.node("arcsin", g.node("mul", x, g.node("constant", value=np.full(g.shape(x), 0.9).tolist())))


def _emit_positive_unary(op):
    return lambda g: g.node(op, g.positive(g.pick()))


def _emit_div(g):
    a = g.pick()
    return g.node("div", a, g.positive(g.partner(a)))


def _emit_pow(g):
    a = g.positive(g.pick())
    return g.node("pow", a, g.bounded(g.partner(a), 2.0))


def _emit_where(g):
    a = g.pick()
    b = g.partner(a)
    shape = np.broadcast_shapes(g.shape(a), g.shape(b))
    return g.node("where", g.data(g.rng.random(shape) > 0.5, "bool"), a, b)


def _emit_matmul(g):
    a = g.pick(lambda s: len(s) >= 1)
    k = g.shape(a)[-1]
    b = g.pick(lambda s: (len(s) == 1 and s[0] == k) or (len(s) >= 2 and s[-2] == k and len(s) <= 3), avoid=(a,))
    if b is None or g.rng.random() < 0.3:
        b = g.param((k, int(g.rng.integers(1, 5))) if g.rng.random() < 0.8 else (k,))
    return g.node("matmul", a, b)


def _axes(g, rank):
    choice = g.rng.integers(0, 3)
    if choice == 0 or rank == 0:
        return None
    if choice == 1 or rank == 1:
        return int(g.rng.integers(-rank, rank))
    return sorted(g.rng.choice(rank, size=2, replace=False).tolist())


def _emit_reduce(op):
    def emit(g):
        x = g.pick(lambda s: len(s) >= 1)
        return g.node(op, x, axis=_axes(g, len(g.shape(x))), keepdims=bool(g.rng.random() < 0.5))
    return emit


def _emit_axis_op(op, keepdims=False):
    def emit(g):
        x = g.pick(lambda s: len(s) >= 1)
        r = len(g.shape(x))
        attrs = {"axis": int(g.rng.integers(-r, r))}
        if keepdims:
            attrs["keepdims"] = bool(g.rng.random() < 0.5)
        return g.node(op, x, **attrs)
    return emit


def _emit_cross_entropy(g):
    x = g.pick(lambda s: len(s) in (1, 2) and s[-1] >= 2)
    if x is None:
        x = g.param((3, 4))
    s = g.shape(x)
    labels = g.rng.integers(0, s[-1], size=s[:-1])
    return g.node("cross_entropy", x, g.data(labels, "int64"), reduction=str(g.rng.choice(["mean", "sum"])))


def _emit_mse(g):
    a = g.pick()
    return g.node("mse_loss", a, g.partner(a), reduction=str(g.rng.choice(["mean", "sum"])))


def _emit_reshape(g):
    x = g.pick()
    s = g.shape(x)
    shape = [[-1], list(s[::-1]) or [1], [int(np.prod(s)), 1]][g.rng.integers(0, 3)]
    return g.node("reshape", x, shape=shape)


def _emit_transpose(g):
    x = g.pick(lambda s: len(s) >= 2)
    if x is None:
        x = g.param((2, 3))
    r = len(g.shape(x))
    axes = None if g.rng.random() < 0.3 else g.rng.permutation(r).tolist()
    return g.node("transpose", x, axes=axes)


def _emit_broadcast_to(g):
    x = g.pick(lambda s: len(s) <= 3)
    shape = [2] + [3 if d == 1 else d for d in g.shape(x)]
    return g.node("broadcast_to", x, shape=shape)


def _emit_tile(g):
    x = g.pick(lambda s: len(s) <= 3)
    return g.node("tile", x, reps=[int(g.rng.integers(1, 3)) for _ in g.shape(x)])


def _emit_expand_dims(g):
    x = g.pick(lambda s: len(s) <= 3)
    r = len(g.shape(x))
    return g.node("expand_dims", x, axis=int(g.rng.integers(-(r + 1), r + 1)))


def _emit_squeeze(g):
    x = g.pick(lambda s: 1 in s)
    if x is None:
        x = g.node("expand_dims", g.pick(), axis=0)
    ones = [i for i, d in enumerate(g.shape(x)) if d == 1]
    return g.node("squeeze", x, axis=None if g.rng.random() < 0.4 else [int(g.rng.choice(ones))])


def _emit_concat(g):
    x = g.pick(lambda s: len(s) >= 1)
    s = g.shape(x)
    axis = int(g.rng.integers(-len(s), len(s)))
    a = axis % len(s)
    fits = (lambda t: len(t) == len(s) and all(u == v for i, (u, v) in enumerate(zip(t, s)) if i != a))
    others = [g.pick(fits) for _ in range(int(g.rng.integers(1, 3)))]  # may repeat x: one op, two uses
    return g.node("concat", x, *others, axis=axis)


def _emit_slice(g):
    x = g.pick(lambda s: any(d >= 2 for d in s))
    if x is None:
        x = g.param((4, 3))
    s = g.shape(x)
    ax = int(g.rng.choice([i for i, d in enumerate(s) if d >= 2]))
    start = int(g.rng.integers(0, s[ax] - 1))
    return g.node("slice", x, starts=[start], ends=[s[ax]], axes=[ax], steps=[int(g.rng.integers(1, 3))])


def _emit_take(g):
    x = g.pick(lambda s: len(s) >= 1)
    s = g.shape(x)
    axis = int(g.rng.integers(-len(s), len(s)))
    n = s[axis]
    idx = g.rng.integers(-n, n, size=[(4,), (2, 2)][g.rng.integers(0, 2)])  # repeats and negatives
    return g.node("take", x, g.data(idx, "int64"), axis=axis)


def _emit_take_along_axis(g):
    x = g.pick(lambda s: len(s) >= 1)
    s = g.shape(x)
    axis = int(g.rng.integers(0, len(s)))
    ishape = [int(g.rng.integers(1, 4)) if i == axis else d for i, d in enumerate(s)]
    idx = g.rng.integers(0, s[axis], size=ishape)
    return g.node("take_along_axis", x, g.data(idx, "int64"), axis=axis)


def _emit_constant(g):
    x = g.pick()
    c = g.node("constant", value=g.rng.uniform(-1, 1, size=g.shape(x)).tolist())
    return g.node("mul", x, c)


def _emit_unary_by_domain(op):
    """An attribute-free unary op: fed any value when smooth on all reals, else a positive one."""
    d = op.domain_of(0)
    return _unary(op.name) if (d.lo, d.hi) == (REALS.lo, REALS.hi) else _emit_positive_unary(op.name)


EMIT = {
    **{op.name: _emit_unary_by_domain(op) for op in all_ops()
       if op.arity == 1 and op.sympy and not op.attrs and op.name not in ONNX_OPS_TORCH},
    "leaky_relu": lambda g: _unary("leaky_relu", negative_slope=0.1)(g),
    "elu": lambda g: _unary("elu", **[{}, {"alpha": 0.5}, {"alpha": 1.6732632423543772, "scale": 1.0507009873554805}][
        g.rng.integers(0, 3)])(g),
    "gelu": lambda g: _unary("gelu", approximate=str(g.rng.choice(["none", "tanh"])))(g),
    "clip": lambda g: _unary("clip", **[{"min": -0.5, "max": 0.7}, {"min": -0.2}, {"max": 0.4}][
        g.rng.integers(0, 3)])(g),
    "exp": _emit_exp,  # bounded input: exp of a large value would swamp the loss
    **{op: _binary(op) for op in ("add", "sub", "mul", "maximum", "minimum")},
    "div": _emit_div, "pow": _emit_pow, "where": _emit_where, "matmul": _emit_matmul,
    **{op: _emit_reduce(op) for op in ("sum", "mean", "max", "min", "norm")},
    "softmax": _emit_axis_op("softmax"), "log_softmax": _emit_axis_op("log_softmax"),
    "logsumexp": _emit_axis_op("logsumexp", keepdims=True),
    "cross_entropy": _emit_cross_entropy, "mse_loss": _emit_mse,
    "reshape": _emit_reshape, "transpose": _emit_transpose, "broadcast_to": _emit_broadcast_to,
    "tile": _emit_tile,
    "expand_dims": _emit_expand_dims, "squeeze": _emit_squeeze, "concat": _emit_concat, "slice": _emit_slice,
    "take": _emit_take, "take_along_axis": _emit_take_along_axis, "constant": _emit_constant,
    # the NumPy functions' ops (ops/numpy_math.py): steps (derivative 0), arctan2, arcsin, prod, inv, det, solve
    "floor": _unary("floor"), "ceil": _unary("ceil"), "arctan2": _binary("arctan2"), "arcsin": _emit_arcsin,
    "prod": lambda g: g.node("prod", g.bounded(g.pick(lambda s: len(s) >= 1), 1.5),
                             axis=int(g.rng.integers(0, 1)), keepdims=bool(g.rng.random() < 0.5)),
    "inv": lambda g: g.node("inv", _square_matrix(g)), "det": lambda g: g.node("det", _square_matrix(g)),
    "solve": _emit_solve,
}

MAPPED = sorted(set(TORCH_OPS) & set(EMIT))  # a mapped op without an emitter fails a test below


def random_graph(seed: int) -> RandomGraph:
    g = RandomGraph(seed)
    for shape in [(3, 4), (4,), (), (3, 1), (2, 3, 4)]:
        g.param(shape)
    forced = [MAPPED[(seed * FORCED_PER_GRAPH + k) % len(MAPPED)] for k in range(FORCED_PER_GRAPH)]
    ops = forced + list(g.rng.choice(MAPPED, size=RANDOM_NODES))
    g.rng.shuffle(ops)
    for op in ops:
        EMIT[op](g)
    g.finish()
    return g


GRAPHS = {seed: random_graph(seed) for seed in range(N_GRAPHS)}


def engine_gradients(g: RandomGraph, dtype):
    program = Program(load_graph(g.b.build()), dtype)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY))
    grads = backward(tape)
    return float(np.asarray(tape.loss)), {p: np.asarray(grads[p]) for p in g.params}


# float64: both sides agree up to rounding in a different order (observed
# worst: 1.4e-15 relative to the largest gradient element).
# float32: the engine in float32 against torch in float64, so the tolerance
# covers float32 rounding amplified through ~40 ops (observed worst: 4e-7).
TOLERANCE = {np.float64: (1e-10, 1e-12), np.float32: (1e-4, 2e-5)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("seed", sorted(GRAPHS))
def test_gradients_match_torch(seed, dtype):
    g = GRAPHS[seed]
    rtol, atol = TOLERANCE[dtype]
    ref = g.grads
    loss, grads = engine_gradients(g, dtype)
    want_loss = float(g.t[g.loss].detach())
    assert loss == pytest.approx(want_loss, rel=rtol, abs=atol * max(1.0, abs(want_loss)))
    for p in g.params:
        assert grads[p].dtype == dtype
        scale = max(1.0, float(np.abs(ref[p]).max(initial=0.0)))
        np.testing.assert_allclose(grads[p], ref[p], rtol=rtol, atol=atol * scale,
                                   err_msg=f"graph {seed} ({sorted(g.ops)}), parameter {p}")


def test_graphs_are_not_trivial():
    """Some gradient is non-zero in every graph, and values feed several consumers."""
    for seed, g in GRAPHS.items():
        assert any(np.any(v != 0) for v in g.grads.values()), seed
    readers = {}
    for g in GRAPHS.values():
        for node in g.b.build().nodes:
            for i in node.inputs:
                readers[(g, i)] = readers.get((g, i), 0) + 1
    assert sum(n >= 2 for n in readers.values()) >= N_GRAPHS


def test_every_registry_op_is_mapped_to_torch_or_waived():
    registry = {op.name for op in all_ops()}
    missing = sorted(registry - set(TORCH_OPS) - set(WAIVED))
    assert not missing, f"ops without a torch mapping in {__name__}.TORCH_OPS (or a reason in WAIVED): {missing}"
    stale = sorted((set(TORCH_OPS) | set(WAIVED)) - registry)
    assert not stale, f"mapped or waived ops that are not in the registry: {stale}"
    assert not set(TORCH_OPS) & set(WAIVED), "an op is both mapped and waived"
    assert not set(FROM_REGISTRY) & set(ADAPTED), "an op has a torch name in the registry and an adapter here"


def test_every_mapped_op_is_exercised():
    exercised = set().union(*(g.ops for g in GRAPHS.values()))
    assert set(TORCH_OPS) <= exercised, f"mapped ops no random graph uses: {sorted(set(TORCH_OPS) - exercised)}"
    assert set(EMIT) == set(TORCH_OPS), f"ops mapped but never emitted, or emitted but not mapped: " \
                                        f"{sorted(set(EMIT) ^ set(TORCH_OPS))}"
