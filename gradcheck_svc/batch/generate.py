"""Generated graphs: a deterministic family of small MLP-like graphs.

Used by the per-node screen (every node must build the very same graphs, so
everything here is a pure function of index, size and seed), by the tests'
Indexed-Job simulation and by the benchmark. `kind` plants known answers:
"ok" verifies, "mismatch" has a custom op whose user-given derivative is
wrong, "invalid" uses an op that does not exist.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

KINDS = ("ok", "mismatch", "invalid")


def _tensor(rng: np.random.Generator, shape: tuple, requires_grad: bool = False) -> dict:
    data = [round(float(v), 6) for v in rng.uniform(-1.0, 1.0, size=shape).reshape(-1)]
    value = {"shape": list(shape), "data": data} if shape else {"data": data}
    return {"value": value, **({"requiresGrad": True} if requires_grad else {})}


def graph_dict(index: int, size: int = 4, kind: str = "ok", seed: int = 0) -> dict:
    """x[size,size] @ W + b -> tanh -> a; square(a) saves `a` (so `--fault a:...` has a cached value to
    corrupt); the loss is the sum. "mismatch" adds a swish with a wrong user derivative."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    rng = np.random.default_rng([seed, index, size])
    inputs = [{"name": "x", **_tensor(rng, (size, size))}, {"name": "W", **_tensor(rng, (size, size), True)},
              {"name": "b", **_tensor(rng, (size,), True)}]
    nodes = [{"name": "h", "op": "matmul", "inputs": ["x", "W"]},
             {"name": "z", "op": "add", "inputs": ["h", "b"]},
             {"name": "a", "op": "tanh", "inputs": ["z"]},
             {"name": "sq", "op": "square", "inputs": ["a"]}]
    last = "sq"
    if kind == "mismatch":  # d/dz z*sigmoid(z) is NOT sigmoid(z): the planted wrong derivative
        nodes.append({"name": "act", "op": "expr", "inputs": ["sq"],
                      "attrs": {"formula": "sq*sigmoid(sq)", "grad": {"sq": "sigmoid(sq)"}}})
        last = "act"
    if kind == "invalid":
        nodes.append({"name": "bogus", "op": "no_such_op", "inputs": [last]})
        last = "bogus"
    nodes.append({"name": "L", "op": "sum", "inputs": [last]})
    return {"name": f"gen-{index:05d}-{kind}", "opsetVersion": 1, "inputs": inputs, "nodes": nodes, "output": "L"}


def write_graphs(out: Path, count: int, size: int = 4, seed: int = 0, kinds=None, prefix: str = "gen") -> list[Path]:
    """Write `count` graphs gen-00000.json... under out; kinds(i) -> kind (default: all "ok")."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        kind = kinds(i) if kinds else "ok"
        path = out / f"{prefix}-{i:05d}.json"
        path.write_text(json.dumps(graph_dict(i, size, kind, seed)))
        paths.append(path)
    return paths
