"""Graphs for the checkpointing and memory tests: a deep chain, a residual
network whose skip connections cross segment boundaries, and an MLP with
dropout and a cross-entropy loss. Built with the real GraphBuilder and loaded
through the real protobuf validation."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from gen_chain import chain as _chain  # noqa: E402  (the generator of examples/graphs/chain_256.json)


def chain(n: int, width: int = 8, batch: int = 4):
    return load_graph(_chain(n, width, batch).build())


def residual(blocks: int = 6, width: int = 6, seed: int = 1, as_message: bool = False):
    """h_{k+1} = h_k + tanh(h_k @ W_k) * s_k, plus a long skip from the input to the end
    and a value (h1) read by every later block: multi-consumer values across segments."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("residual")
    x = b.input("x", rng.uniform(-1, 1, size=(3, width)), requires_grad=True)
    h = x
    first = None
    for k in range(blocks):
        w = b.input(f"W{k}", rng.standard_normal((width, width)) / np.sqrt(width), requires_grad=True)
        s = b.input(f"s{k}", rng.uniform(0.5, 1.5, size=(width,)), requires_grad=True)
        f = b.node("mul", b.node("tanh", b.node("matmul", h, w, name=f"z{k}"), name=f"t{k}"), s, name=f"f{k}")
        if first is not None:
            f = b.node("add", f, b.node("mul", first, b.input(f"c{k}", 0.1), name=f"g{k}"), name=f"fg{k}")
        h = b.node("add", h, f, name=f"h{k}")
        first = first or h
    y = b.node("add", h, b.node("sin", x, name="skip"), name="y")
    b.output(b.node("sum", b.node("square", y, name="y2"), name="loss"))
    return b.build() if as_message else load_graph(b.build())


def mlp(dropout: bool = True, seed: int = 2):
    """x [8,5] -> linear 16 -> relu -> (dropout) -> linear 16 -> tanh -> (dropout) -> linear 3 -> cross-entropy."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mlp")
    h = b.input("x", rng.standard_normal((8, 5)))
    labels = b.input("labels", rng.integers(0, 3, size=8))
    sizes = [5, 16, 16, 3]
    acts = ["relu", "tanh", None]
    for k in range(3):
        w = b.input(f"W{k}", rng.standard_normal((sizes[k], sizes[k + 1])) / np.sqrt(sizes[k]), requires_grad=True)
        bias = b.input(f"b{k}", rng.uniform(-0.1, 0.1, size=(sizes[k + 1],)), requires_grad=True)
        h = b.node("add", b.node("matmul", h, w, name=f"mm{k}"), bias, name=f"lin{k}")
        if acts[k]:
            h = b.node(acts[k], h, name=f"act{k}")
            if dropout:
                h = b.node("dropout", h, name=f"drop{k}", p=0.3, seed=7)
    b.output(b.node("cross_entropy", h, labels, name="loss"))
    return load_graph(b.build())
