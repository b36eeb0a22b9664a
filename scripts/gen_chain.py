"""Write examples/graphs/chain_256.json: 256 layers of tanh(h @ W_i + b_i) at
width 32, then a sum -- the deep chain the memory profile and checkpointing
are demonstrated on.

    python scripts/gen_chain.py [--layers 256] [--width 32] [--batch 4] [-o PATH]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from google.protobuf import json_format

from gradcheck_svc.graph.build import GraphBuilder

ROOT = Path(__file__).resolve().parent.parent


def chain(layers: int, width: int = 32, batch: int = 4, seed: int = 0, requires_grad: bool = True) -> GraphBuilder:
    """x [batch, width] -> `layers` x tanh(h @ W_i + b_i) -> sum. Weights scaled 1/sqrt(width) so
    activations stay in tanh's sensitive range all the way down (gradients neither vanish nor saturate).
    Values are rounded to 3 decimals: the JSON stays small (data lists, as 32x32 tensors are under the
    raw-bytes threshold) and the graph is still a generic one."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"chain_{layers}")
    r = lambda a: np.round(a, 3)  # noqa: E731
    h = b.input("x", r(rng.uniform(-1, 1, size=(batch, width))))
    for i in range(layers):
        w = b.input(f"W{i}", r(rng.standard_normal((width, width)) / np.sqrt(width)), requires_grad=requires_grad)
        bias = b.input(f"b{i}", r(rng.uniform(-0.1, 0.1, size=(width,))), requires_grad=requires_grad)
        z = b.node("matmul", h, w, name=f"z{i}")
        h = b.node("tanh", b.node("add", z, bias, name=f"a{i}"), name=f"h{i}")
    b.output(b.node("sum", h, name="loss"))
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=256)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    out = args.output or ROOT / "examples" / "graphs" / f"chain_{args.layers}.json"
    msg = chain(args.layers, args.width, args.batch).build()
    out.write_text(json_format.MessageToJson(msg, indent=None) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
