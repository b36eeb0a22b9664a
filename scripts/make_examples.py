"""Regenerate the core example graphs in examples/graphs/ (seed.json is hand-written).

    python scripts/make_examples.py
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gradcheck_svc.graph.build import GraphBuilder, graph_json

OUT = Path(__file__).resolve().parent.parent / "examples" / "graphs"


def mlp_cross_entropy():
    """A 2-layer MLP classifier: logits = tanh(x @ W1 + b1) @ W2 + b2, mean cross-entropy."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("mlp_cross_entropy")
    x = b.input("x", rng.standard_normal((4, 3)))
    labels = b.input("labels", np.array([0, 2, 1, 2]), dtype="int64")
    w1 = b.input("W1", rng.standard_normal((3, 5)) * 0.5, requires_grad=True)
    b1 = b.input("b1", rng.standard_normal(5) * 0.1, requires_grad=True)
    w2 = b.input("W2", rng.standard_normal((5, 3)) * 0.5, requires_grad=True)
    b2 = b.input("b2", rng.standard_normal(3) * 0.1, requires_grad=True)
    h = b.node("tanh", b.node("add", b.node("matmul", x, w1, name="xW1"), b1, name="pre1"), name="h")
    logits = b.node("add", b.node("matmul", h, w2, name="hW2"), b2, name="logits")
    b.output(b.node("cross_entropy", logits, labels, name="loss"))
    return b


def shared_value():
    """One value feeding several consumers: L = sum(u*u + sin(u) + u/2) with u = w*x."""
    b = GraphBuilder("shared_value")
    w = b.input("w", np.array([0.5, -1.25, 2.0]), requires_grad=True)
    x = b.input("x", np.array([1.5, 0.75, -0.5]), requires_grad=True)
    two = b.input("two", 2.0)
    u = b.node("mul", w, x, name="u")
    t = b.node("add", b.node("mul", u, u, name="uu"), b.node("sin", u, name="sin_u"), name="t")
    b.output(b.node("sum", b.node("add", t, b.node("div", u, two, name="half_u"), name="s"), name="L"))
    return b


def softmax_logsumexp():
    """Attention-like scores: softmax over rows, weighted values, plus a logsumexp term."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("softmax_logsumexp")
    q = b.input("q", rng.standard_normal((2, 4)), requires_grad=True)
    k = b.input("k", rng.standard_normal((3, 4)), requires_grad=True)
    v = b.input("v", rng.standard_normal((3, 2)), requires_grad=True)
    scores = b.node("matmul", q, b.node("transpose", k, name="kT"), name="scores")
    attn = b.node("softmax", scores, name="attn", axis=-1)
    out = b.node("matmul", attn, v, name="out")
    lse = b.node("logsumexp", scores, name="lse", axis=-1)
    b.output(b.node("add", b.node("sum", b.node("square", out, name="out2"), name="s1"),
                    b.node("mean", lse, name="s2"), name="L"))
    return b


def broadcasting():
    """Broadcasting in every direction: [2,1,3] * [4,1] + [3] - scalar, then mse against a target."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("broadcasting")
    a = b.input("a", rng.standard_normal((2, 1, 3)), requires_grad=True)
    c = b.input("c", rng.standard_normal((4, 1)), requires_grad=True)
    bias = b.input("bias", rng.standard_normal(3), requires_grad=True)
    s = b.input("s", 0.7, requires_grad=True)
    target = b.input("target", rng.standard_normal((4, 3)))
    y = b.node("sub", b.node("add", b.node("mul", a, c, name="ac"), bias, name="acb"), s, name="y")
    b.output(b.node("mse_loss", y, target, name="L"))
    return b


def main():
    for make in (mlp_cross_entropy, shared_value, softmax_logsumexp, broadcasting):
        msg = make().build()
        path = OUT / f"{msg.name}.json"
        path.write_text(graph_json(msg))
        print(path.relative_to(OUT.parent.parent))


if __name__ == "__main__":
    main()
