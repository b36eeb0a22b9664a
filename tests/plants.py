"""Planted gradient bugs for the finite-difference power tests and bench/bench_element_plants.py: an identity
node in front of a parameter's consumer whose vjp is off at one element (or at every element) by a chosen
amount, so the engine's gradient of that parameter is wrong there and nowhere else."""
from __future__ import annotations

import itertools

import numpy as np

from gradcheck_svc.ops.base import FLOAT, OpDef, Spec
from gradcheck_svc.ops.registry import REGISTRY, register

_names = itertools.count()


def element_bug(delta, index=None) -> str:
    """Register an identity op whose vjp adds delta at flat `index` (None: delta, an array of the
    gradient's shape, everywhere); returns its name. Remove it with unregister(name)."""
    name = f"test_element_bug_{next(_names)}"

    def vjp(xp, g, s):
        off = np.zeros(g.shape) if index is not None else np.asarray(delta, dtype=np.float64)
        if index is not None:
            off.reshape(-1)[index] = delta
        return (g + xp.asarray(off, dtype=g.dtype),)
    register(OpDef(name=name, forward=lambda xp, x: x * 1.0, vjp=vjp,
                   infer=lambda node, specs, attrs: (Spec(specs[0].shape, FLOAT), attrs), arity=1,
                   input_kinds=(FLOAT,), doc="test only: identity whose gradient is off by a planted amount"))
    return name


def unregister(name: str) -> None:
    del REGISTRY[name]


def plant(doc: dict, target: str, op: str) -> dict:
    """A copy of graph document `doc` whose parameter `target` reaches its first consumer through `op`
    (node `{target}_bug`)."""
    import copy
    doc = copy.deepcopy(doc)
    nodes = doc["nodes"]
    i = next(k for k, n in enumerate(nodes) if target in n["inputs"])
    nodes[i]["inputs"] = [f"{target}_bug" if x == target else x for x in nodes[i]["inputs"]]
    nodes.insert(i, {"name": f"{target}_bug", "op": op, "inputs": [target]})
    return doc


def plant_message(msg, target: str, op: str):
    """plant() for a gradcheck.v1.Graph message (an imported ONNX model: too large for a JSON document):
    a copy whose parameter `target` reaches its first consumer through `op` (node `{target}_bug`)."""
    out = type(msg)()
    out.CopyFrom(msg)
    del out.nodes[:]
    first = next(k for k, n in enumerate(msg.nodes) if target in n.inputs)
    for k, node in enumerate(msg.nodes):
        if k == first:
            out.nodes.add(name=f"{target}_bug", op=op).inputs.append(target)
        out.nodes.add().CopyFrom(node)
        if k == first:
            out.nodes[-1].inputs[:] = [f"{target}_bug" if x == target else x for x in node.inputs]
    return out


def element_bound(g: np.ndarray, tol, loss: float, x: np.ndarray) -> np.ndarray:
    """Each element's own bound in a per-element check: its tolerance (compare.py) plus the first-pass
    rounding of its central difference at the default step (finite_diff: 4 eps (|L| + 1) / h)."""
    from gradcheck_svc.oracles.finite_diff import EPS, element_steps
    from gradcheck_svc.verify.compare import magnitude
    g = np.asarray(g, dtype=np.float64).reshape(-1)
    h = element_steps(np.asarray(x, dtype=np.float64).reshape(-1))
    return tol.absolute(magnitude(g)) + tol.rtol * np.abs(g) + 4 * EPS * (abs(loss) + 1) / h


def mlp(width: int = 64, depth: int = 3, batch: int = 8, bugs: dict | None = None, scale: float = 1.0,
        offset: float = 0.0, dtype: str | None = None, seed: int = 0):
    """A tanh MLP graph (x -> [W_i, b_i] -> sum * scale + offset); bugs: parameter -> op name put in front
    of its consumer (element_bug)."""
    from gradcheck_svc.graph import load_graph
    from gradcheck_svc.graph.build import GraphBuilder
    rng = np.random.default_rng(seed)
    bugs = bugs or {}
    b = GraphBuilder("mlp")

    def param(name, value):
        p = b.input(name, value, requires_grad=True, dtype=dtype)
        return b.node(bugs[name], p, name=f"{name}_bug") if name in bugs else p
    h = b.input("x", rng.uniform(-1, 1, (batch, width)), dtype=dtype)
    for i in range(depth):
        w = param(f"W{i}", rng.standard_normal((width, width)) / np.sqrt(width))
        h = b.node("tanh", b.node("add", b.node("matmul", h, w), param(f"b{i}", rng.uniform(-0.5, 0.5, width))))
    loss = b.node("sum", h)
    if scale != 1.0:
        loss = b.node("mul", loss, b.input("scale", np.array(scale), dtype=dtype))
    if offset:
        loss = b.node("add", loss, b.input("offset", np.array(offset), dtype=dtype))
    b.output(b.node("add", loss, b.input("zero", np.array(0.0), dtype=dtype), name="L"))
    return load_graph(b.build())


def tanh_over_small_d(n, bug=None):
    """tanh(x / d) with |d| ~ 1e-3: the first pass's step is not small next to x, every value misses.
    bug: an op put between x and the division (element_bug). Used by test_fd_joint and test_fd_power."""
    from gradcheck_svc.graph import load_graph
    from gradcheck_svc.graph.build import GraphBuilder

    rng = np.random.default_rng(0)
    d = rng.choice([-1, 1], n) * rng.uniform(0.5e-3, 2e-3, n)
    b = GraphBuilder("tanh_small_d")
    x = b.input("x", d * rng.uniform(-1.5, 1.5, n), requires_grad=True)
    if bug is not None:
        x = b.node(bug, x, name="x_bug")
    b.output(b.node("sum", b.node("tanh", b.node("div", x, b.input("d", d))), name="L"))
    return load_graph(b.build())


def cnn(c1: int = 32, c2: int = 64, batch: int = 4, size: int = 48, seed: int = 0, name: str = "cnn"):
    """conv 3x3 -> relu -> max_pool 2x2 -> conv 3x3 -> tanh -> sum (a Graph): ReLU zeros tie in max-pool
    windows (kink notes), and big enough channels are screened jointly."""
    from gradcheck_svc.graph import load_graph
    from gradcheck_svc.graph.build import GraphBuilder

    rng = np.random.default_rng(seed)
    b = GraphBuilder(name)
    h = b.input("img", rng.standard_normal((batch, 3, size, size)))
    k1 = b.input("K1", rng.standard_normal((c1, 3, 3, 3)) / 3, requires_grad=True)
    h = b.node("conv", h, k1, b.input("c1", rng.uniform(-0.5, 0.5, c1), requires_grad=True), pads=[1, 1, 1, 1])
    h = b.node("max_pool", b.node("relu", h), kernel_shape=[2, 2], strides=[2, 2])
    k2 = b.input("K2", rng.standard_normal((c2, c1, 3, 3)) / (3 * np.sqrt(c1)), requires_grad=True)
    h = b.node("conv", h, k2, b.input("c2", rng.uniform(-0.5, 0.5, c2), requires_grad=True), pads=[1, 1, 1, 1])
    b.output(b.node("sum", b.node("tanh", h), name="L"))
    return load_graph(b.build())
