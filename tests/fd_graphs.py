"""Graphs for the finite-difference shard tests (test_fd_shards, test_reliability_refusals)."""
from __future__ import annotations

import numpy as np

from gradcheck_svc.graph.build import GraphBuilder, graph_json


def mlp(layers: int = 3, seed: int = 0, kink: bool = False) -> str:
    """x -> (matmul, add bias, tanh) x layers -> * scale -> sum(sin): 2 x layers + 1 parameters of different sizes.
    kink: relu of the last layer times a mask with a zero column, so that relu's inputs there are exactly at
    its kink (the diagnosis' kink notes)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mlp_shards")
    h = b.input("x", rng.uniform(-1, 1, (5, 6)))
    width = 6
    for i in range(layers):
        out = 7 - i
        h = b.node("matmul", h, b.input(f"W{i}", rng.uniform(-0.8, 0.8, (width, out)), requires_grad=True))
        h = b.node("tanh", b.node("add", h, b.input(f"b{i}", rng.uniform(-0.5, 0.5, out), requires_grad=True)),
                   name=f"h{i}")
        width = out
    if kink:
        mask = np.ones((5, width))
        mask[:, 0] = 0.0
        h = b.node("relu", b.node("mul", h, b.input("mask", mask)), name="kinked")
    # a 0-d parameter too: its differences, error and indices are 0-d and empty arrays in a shard's file
    h = b.node("mul", h, b.input("scale", np.array(0.7), requires_grad=True))
    b.output(b.node("sum", b.node("sin", h), name="L"))
    return graph_json(b.build())
