"""Joint directions: k directions spanning several parameters at once (the joint screen's, verify/joint_check.py)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
# OpenSSL's SHA-256 (hashlib): the content seed digests every input's bytes on every verification, and with the
# SHA instructions of today's x86-64 CPUs it runs at ~1.3 GB/s where CPython's own BLAKE2b ran at ~0.4 GB/s
# (MLP-256's 263 k parameters: 1.6 ms against 5.1 ms; ResNet-18's 11.7 M: ~70 against ~230 ms, in every process
# of a split screen)
from hashlib import sha256

import numpy as np

from .fd_formulas import projection_step

# columns per piece when a sign block is widened to float64 (JointDirections.project): 16 rows x
# 8,192 columns is 1 MiB, a piece that stays in cache; the whole (k, n) float64 block never exists
PROJECT_COLUMNS = 8192
# bytes per piece of the directions' random bytes and their level lookup (JointDirections.random), a multiple of
# 8 (the generator's words): NumPy widens an index to intp, 2 MiB per piece here, where 16 directions over
# MLP-1024's 4.2 M parameters were one 537 MB index (0.93 s; 0.48 s in pieces), and the raw bytes of every
# direction at once were the peak of BERT's and ResNet-18's whole verification (27 MB and 187 MB)
LOOKUP_BYTES = 1 << 18
# directions over more bytes than this (k x the parameters' elements) are not held but drawn again when asked
# for (LazyLevels); below it, held (a small graph's many small blocks: one draw each is cheaper). 32 MiB: the
# 4 directions the power usually chooses (verify/joint_check.joint_k) held up to 8 M parameters, half a byte per
# byte of their float64 values (MLP-1024's 4.2 M drawn 3 times over was 20% of its verification); ResNet-18's
# 11.7 M stay lazy
LAZY_BYTES = 32 * 2**20

# the int8 levels a direction's entries take: a standard normal's quantiles at (b + 1/2) / 256 for every byte b,
# times LEVEL_SCALE, rounded, never 0 (every element moves in every direction). Continuous weights, not signs:
# two elements whose sign columns agree in every direction (1 pair in 2^k) move every value alike, and two
# opposite errors on them cancel; with these, columns agree in all k entries about once in 10^(2k)
# (written out, b = 128..255; the lower half is their mirror: importing SciPy's special functions for ndtri cost
# every command ~0.35 s, the standard library's NormalDist ~5 ms (statistics, fractions, decimal, random).
# tests/oracles/test_fd_joint.py derives them from both: no level is within 0.0017 of a rounding boundary)
LEVEL_SCALE = 40.0
_UPPER = (1, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 5, 5, 6, 6, 6, 7, 7, 8, 8, 8, 9, 9, 10, 10, 10, 11, 11, 12, 12, 13, 13,
          13, 14, 14, 15, 15, 15, 16, 16, 17, 17, 18, 18, 18, 19, 19, 20, 20, 21, 21, 22, 22, 22, 23, 23, 24, 24, 25,
          25, 26, 26, 27, 27, 28, 28, 29, 29, 30, 30, 31, 31, 32, 32, 33, 33, 34, 35, 35, 36, 36, 37, 38, 38, 39, 39,
          40, 41, 41, 42, 43, 43, 44, 45, 46, 46, 47, 48, 49, 50, 50, 51, 52, 53, 54, 55, 56, 57, 58, 60, 61, 62, 63,
          65, 66, 68, 70, 71, 73, 76, 78, 81, 84, 88, 93, 101, 115)
LEVELS = np.array([-v for v in reversed(_UPPER)] + list(_UPPER), dtype=np.int8)
LEVEL_RMS = float(np.sqrt(np.mean(LEVELS.astype(np.float64) ** 2)))


def content_seed(program, base: dict, seed: int) -> int:
    """The joint directions' seed: the options' seed mixed with a digest of the graph -- its steps and the
    values of its inputs -- so that the same graph gets the same directions (in every process of a split
    screen too) and two graphs never share one pattern."""
    h = sha256(str(int(seed)).encode())
    made = set()
    for step in program.steps:
        made.add(step.name)
        h.update(repr((step.name, step.op.name, step.inputs, sorted(step.attrs.items(), key=str))).encode())
    named: dict = {}  # id(dtype) -> (dtype, str(dtype)): str() of a dtype is NumPy Python code (~10 us a value)
    for name in sorted(n for n in base if n not in made):
        a = np.ascontiguousarray(np.asarray(base[name]))
        if id(a.dtype) not in named:  # the dtype object itself is held: its id is not reused within the loop
            named[id(a.dtype)] = (a.dtype, str(a.dtype))
        h.update(repr((name, a.shape, named[id(a.dtype)][1])).encode())
        if a.dtype != object:
            h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    return int.from_bytes(h.digest()[:8], "little")


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """rng.bytes(n) as uint8, the same bytes (the generator's raw 64-bit words, little-endian: what
    Generator.bytes returns, tests/oracles/test_fd_joint.py) at a thirtieth of its cost -- Generator.bytes
    draws them through its bounded-integer path (40 ms for 16 directions over MLP-256's 263 k parameters
    on this machine, against 1.4 ms)."""
    return rng.bit_generator.random_raw((n + 7) // 8).astype("<u8", copy=False).view(np.uint8)[:n]


def levels_into(out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """out (int8, flat) filled with the levels of the generator's next out.size bytes, piece by piece (its
    stream in order: the bytes of rng.bytes(out.size), never all held at once, nor an intp index of them)."""
    for lo in range(0, out.size, LOOKUP_BYTES):
        piece = out[lo:lo + LOOKUP_BYTES]
        np.take(LEVELS, random_bytes(rng, piece.size), out=piece)
    return out


def stream_bytes(bits: np.random.PCG64, state: dict, offset: int, n: int) -> np.ndarray:
    """Bytes offset..offset+n-1 of the stream of a PCG64 in `state` (what rng.bytes(offset + n) ends with), drawn
    by `bits` (set to that state: a new PCG64 would seed itself from the OS first)."""
    bits.state = state
    bits.advance(offset // 8)
    skip = offset % 8
    return bits.random_raw((skip + n + 7) // 8).astype("<u8", copy=False).view(np.uint8)[skip:skip + n]


class LazyLevels(Mapping):
    """p -> (k, n_p) int8 levels, drawn again from the seed's stream each time they are asked for (PCG64.advance
    to the block's bytes): the very levels JointDirections.random would hold, none of them kept -- for
    directions over more than LAZY_BYTES (ResNet-18's 16 x 11.7 M were 187 MB held through the whole screen,
    BERT's 27 MB the verification's peak); row() draws one direction's block alone."""

    def __init__(self, state: dict, k: int, spans: dict, total: int):
        self.state, self.k, self.spans, self.total = state, k, spans, total  # spans: p -> (offset, n_p)
        self.bits = np.random.PCG64(0)

    def _draw(self, offset: int, n: int, table: np.ndarray = LEVELS, out: np.ndarray | None = None) -> np.ndarray:
        out = np.empty(n, table.dtype) if out is None else out
        for lo in range(0, n, LOOKUP_BYTES):
            piece = out[lo:lo + LOOKUP_BYTES]
            np.take(table, stream_bytes(self.bits, self.state, offset + lo, piece.size), out=piece)
        return out

    def scaled_row(self, p: str, j: int, factor: float, out: np.ndarray) -> np.ndarray:
        """row(p, j) x factor as float64 into out, in one lookup (a table of the levels times factor: the same
        products as multiplying the levels, without making them first)."""
        lo, n = self.spans[p]
        return self._draw(int(j) * self.total + lo, n, LEVELS.astype(np.float64) * factor, out)

    def row(self, p: str, j: int) -> np.ndarray:
        lo, n = self.spans[p]
        return self._draw(int(j) * self.total + lo, n)

    def __getitem__(self, p: str) -> np.ndarray:
        return np.stack([self.row(p, j) for j in range(self.k)]) if self.spans[p][1] else np.zeros((self.k, 0), np.int8)

    def __iter__(self):
        return iter(self.spans)

    def __len__(self) -> int:
        return len(self.spans)


@dataclass
class JointDirections:
    """k directions spanning several parameters at once. Per parameter a (k, n_p) block of random
    int8 Gaussian levels (LEVELS, `signs` for short) times one weight per block, 1/(sqrt(n_p) LEVEL_RMS) to
    begin with, so each row of a block is about a unit vector and each block moves as much whatever its size;
    one step for them all. One byte per element, not float64 Gaussians (ResNet-18's 11.7 M parameters x 16
    directions as float64 were 1.5 GB, and building them and the perturbed copies from them took 15 s against
    0.6 s for the forwards themselves), a copy is one multiply and one add per element, and no entry is 0, so
    no element is left out of a direction; continuous weights (LEVELS' comment) so no two move alike."""

    signs: dict[str, np.ndarray]  # p -> (k, n_p) int8, Gaussian levels (LEVELS)
    weight: dict[str, float]  # p -> |v| of every element of the block
    step: float
    # random()'s stream (k: unbounded): rows past k drawn from it are the rows a larger k would hold (beyond())
    stream: LazyLevels | None = None
    # a reach (scalar) up to which every element's power was shown to meet its goal on these rows
    # (verify/joint_check.joint_k), or None
    proven_at: float | None = None

    @classmethod
    def random(cls, values: dict, k: int, seed: int) -> "JointDirections":
        """k directions over the parameters `values` (p -> its value, in order): per block random signs
        (seeded), each row a unit vector; the step is projection_step of all the blocks together."""
        rng = np.random.default_rng(seed)
        sizes = [int(np.size(v)) for v in values.values()]
        total = sum(sizes)
        lazy = k * total > LAZY_BYTES
        stream = LazyLevels(rng.bit_generator.state, k, {}, total)
        signs = stream if lazy else {}
        bits = None if lazy else levels_into(np.empty(k * total, np.int8), rng).reshape(k, total)
        weight, lo, top = {}, 0, 0.0
        for (p, v), n in zip(values.items(), sizes):
            stream.spans[p] = (lo, n)
            if not lazy:
                signs[p] = bits[:, lo:lo + n]
            weight[p] = 1.0 / (math.sqrt(n) * LEVEL_RMS) if n else 0.0
            lo += n
            if n:  # projection_step of all the blocks together, without concatenating them
                top = max(top, float(np.abs(np.asarray(v, dtype=np.float64)).max()))
        return cls(signs, weight, projection_step(np.array([top])), stream)

    @property
    def k(self) -> int:
        if isinstance(self.signs, LazyLevels):
            return self.signs.k
        return len(next(iter(self.signs.values()))) if self.signs else 0

    def row(self, p: str, j: int) -> np.ndarray:
        """Direction j's levels over block p, (n_p,) int8."""
        return self.signs.row(p, j) if isinstance(self.signs, LazyLevels) else self.signs[p][j]

    def proven(self, reach: np.ndarray) -> bool:
        """Whether every direction's reach is within what proven_at was shown for (then so is every element's
        least error: least_error only grows with the reach)."""
        return self.proven_at is not None and bool(np.all(np.asarray(reach) <= self.proven_at))

    def beyond(self, p: str, j: int) -> np.ndarray:
        """Row j >= k of the same seeded stream over block p, (n_p,) int8: what random() with more than j
        directions holds as row j (the first k rows of a draw are the same whatever k: joint_check.joint_k adds
        rows until the power it states is met)."""
        return self.stream.row(p, j)

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

    def largest(self, p: str) -> np.ndarray:
        """(n_p,) float64: per element its largest |level| over the k rows -- with one reach R for every direction,
        its least error is R / (weight x this) (least_error's, without a float64 pass over every level)."""
        if isinstance(self.signs, LazyLevels):
            out = np.zeros(self.signs.spans[p][1], np.int16)
            for j in range(self.k):
                np.maximum(out, np.abs(self.row(p, j).astype(np.int16)), out=out)
        else:  # on the int8 levels themselves: none is -128 (LEVELS' largest magnitude is 115), |s| is exact
            out = np.abs(self.signs[p]).max(axis=0, initial=0)
        return out.astype(np.float64)

    def least_error(self, p: str, reach: np.ndarray) -> np.ndarray:
        """(n_p,): per element, the least error that moves some direction j past reach[j] (reach: (k,), what a
        direction's value must move by to fail): min_j reach_j / (weight |s_ji|) -- the power of the
        directions for that element, in column pieces."""
        reach = np.asarray(reach, dtype=np.float64)[:, None]
        s = self.signs[p]
        out = np.empty(s.shape[1])
        for lo in range(0, out.size, PROJECT_COLUMNS):
            a = np.abs(s[:, lo:lo + PROJECT_COLUMNS].astype(np.float64))
            out[lo:lo + PROJECT_COLUMNS] = np.min(reach / a, axis=0) / self.weight[p]
        return out

    def perturbed(self, p: str, x: np.ndarray, h: float, rows: np.ndarray, negative: np.ndarray,
                  out: np.ndarray) -> np.ndarray:
        """(len(rows), n_p): copy c is x + h v_j with j = rows[c], or x - h v_j where negative[c].
        out: a float64 buffer of at least that many rows, written into (a fresh 100 MB array per
        copy spends more on page faults than on the arithmetic)."""
        hv = h * self.weight[p]
        out = out[:len(rows)]
        for c, (j, neg) in enumerate(zip(rows, negative)):  # row by row: a scalar factor is the fast loop
            np.multiply(self.row(p, j), -hv if neg else hv, out=out[c], dtype=np.float64)
            out[c] += x
        return out

    def perturbed_imag(self, p: str, h: float, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """(len(rows), n_p) real: the imaginary parts h v_j (j = rows[c]) of perturbed_complex's copies, whose
        real part is the base point for every copy -- what the executor carries as a Pair (no complex copy
        of x per row, no contiguous copy of its imaginary part for a matmul's or a conv's BLAS call).
        out: a float64 buffer of at least that many rows, written into."""
        hv = h * self.weight[p]
        out = out[:len(rows)]
        if not isinstance(self.signs, LazyLevels):  # the rows' levels held: one multiply for them all
            return np.multiply(self.signs[p][np.asarray(rows, dtype=np.intp)], hv, out=out, dtype=np.float64)
        for c, j in enumerate(rows):
            self.signs.scaled_row(p, j, hv, out[c])
        return out

    def perturbed_complex(self, p: str, x: np.ndarray, h: float, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """(len(rows), n_p) complex: copy c is x + i h v_j with j = rows[c] (complex steps, fd_complex.py).
        out: a complex128 buffer of at least that many rows, written into."""
        hv = h * self.weight[p]
        out = out[:len(rows)]
        for c, j in enumerate(rows):
            out.real[c] = x
            np.multiply(self.row(p, j), hv, out=out.imag[c], dtype=np.float64)
        return out
