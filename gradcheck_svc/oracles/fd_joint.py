"""Joint directions: k directions spanning several parameters at once (the joint screen's, verify/joint_check.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .fd_formulas import projection_step

# columns per piece when a sign block is widened to float64 (JointDirections.project): 16 rows x
# 8,192 columns is 1 MiB, a piece that stays in cache; the whole (k, n) float64 block never exists
PROJECT_COLUMNS = 8192


@dataclass
class JointDirections:
    """k directions spanning several parameters at once. Per parameter a (k, n_p) block of random
    signs (int8 +-1) times one weight per block, 1/sqrt(n_p) to begin with, so each row of a block
    is a unit vector and each block moves as much whatever its size; one step for them all.
    Signs, not Gaussians: one byte per element (ResNet-18's 11.7 M parameters x 16 directions as
    float64 were 1.5 GB, and building them and the perturbed copies from them took 15 s against
    0.6 s for the forwards themselves), a copy is one multiply and one add per element, and every
    element moves by the same amount, so none is all but left out of a direction."""

    signs: dict[str, np.ndarray]  # p -> (k, n_p) int8, +-1
    weight: dict[str, float]  # p -> |v| of every element of the block
    step: float

    @classmethod
    def random(cls, values: dict, k: int, seed: int) -> "JointDirections":
        """k directions over the parameters `values` (p -> its value, in order): per block random signs
        (seeded), each row a unit vector; the step is projection_step of all the blocks together."""
        rng = np.random.default_rng(seed)
        sizes = [int(np.size(v)) for v in values.values()]
        total = sum(sizes)
        bits = np.unpackbits(np.frombuffer(rng.bytes((k * total + 7) // 8), np.uint8))[:k * total]
        bits = bits.reshape(k, total).view(np.int8)
        bits *= 2
        bits -= 1  # the signs, +-1
        signs, weight, lo, top = {}, {}, 0, 0.0
        for (p, v), n in zip(values.items(), sizes):
            signs[p] = bits[:, lo:lo + n]
            weight[p] = 1.0 / math.sqrt(n) if n else 0.0
            lo += n
            if n:  # projection_step of all the blocks together, without concatenating them
                top = max(top, float(np.max(np.abs(np.asarray(v, dtype=np.float64)))))
        return cls(signs, weight, projection_step(np.array([top])))

    @property
    def k(self) -> int:
        return len(next(iter(self.signs.values()))) if self.signs else 0

    def block(self, p: str, rows=None) -> np.ndarray:
        """The (rows of the) block as float64 directions (len(rows), n_p)."""
        s = self.signs[p] if rows is None else self.signs[p][np.asarray(rows)]
        return np.multiply(s, self.weight[p], dtype=np.float64)

    def project(self, p: str, values: np.ndarray) -> np.ndarray:
        """(k,) the block's directions times values (n_p,): sum_i v_ji values_i, in float64 pieces
        (the whole (k, n_p) float64 block never exists)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        s, out = self.signs[p], np.zeros(self.k)
        for lo in range(0, values.size, PROJECT_COLUMNS):
            out += s[:, lo:lo + PROJECT_COLUMNS].astype(np.float64) @ values[lo:lo + PROJECT_COLUMNS]
        return out * self.weight[p]

    def perturbed(self, p: str, x: np.ndarray, h: float, rows: np.ndarray, negative: np.ndarray,
                  out: np.ndarray) -> np.ndarray:
        """(len(rows), n_p): copy c is x + h v_j with j = rows[c], or x - h v_j where negative[c]. h v is
        +-fl(h |v|) at every element, exactly, so these are the float64 values x + fl(h v) gives.
        out: a float64 buffer of at least that many rows, written into (a fresh 100 MB array per
        copy spends more on page faults than on the arithmetic)."""
        hv = h * self.weight[p]
        out = out[:len(rows)]
        for c, (j, neg) in enumerate(zip(rows, negative)):  # row by row: a scalar factor is the fast loop
            np.multiply(self.signs[p][j], -hv if neg else hv, out=out[c], dtype=np.float64)
            out[c] += x
        return out
