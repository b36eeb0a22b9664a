"""A graph no time limit lets finish on its own: what the limit tests (test_inprocess_limits, test_batch,
test_fd_shards) stop, and the slack they allow a stop on a loaded machine."""
from __future__ import annotations

import numpy as np

SLACK = 20.0  # seconds: interpreter start-up and a loaded 2-core machine; the graph below runs for minutes


def unfinishable_graph() -> dict:
    """One einsum of 8 operands (20 x 20 x 20, a cycle of letter triples 'abc,bcd,...,hab->') that no pairwise
    order contracts within the operands' size: NumPy runs it as one C loop over 20^8 = 2.6e10 index
    combinations, many minutes on any CPU, which no signal handler interrupts."""
    n, letters = 20, "abcdefgh"
    rng = np.random.default_rng(0)
    inputs = [{"name": f"x{i}", "value": {"shape": [n, n, n], "data": rng.uniform(-1, 1, n ** 3).round(3).tolist()},
               "requiresGrad": True} for i in range(8)]
    return {"name": "einsum8", "inputs": inputs, "output": "e",
            "nodes": [{"name": "e", "op": "einsum", "inputs": [f"x{i}" for i in range(8)],
                       "attrs": {"equation": ",".join((letters * 2)[i:i + 3] for i in range(8)) + "->"}}]}
