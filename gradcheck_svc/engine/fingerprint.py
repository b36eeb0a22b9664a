"""Cheap fingerprints of arrays, computed on the device that holds them.

A Fletcher-style checksum over the array's bytes viewed as unsigned words:
(sum of words, sum of words weighted by position), both mod 2**64 (unsigned
integer sums wrap). Any single changed word changes the first sum; moved or
swapped words change the second. Two device reductions, no host copy of the
data: only the two 64-bit results cross to the host.

Small host (NumPy) arrays take faster paths, because NumPy's reductions
cost microseconds of fixed overhead per call, which dominated graphs
of many small ops: up to 1 KiB the "fingerprint" is the bytes themselves
(exact, and cheaper than any hash); up to 8 KiB, Python's hash of the bytes
(SipHash, keyed per process: fingerprints are compared only within one); beyond, for a contiguous float array, the word
sum and a dot with fixed random weights (pass_fingerprint: two reads in place,
no position-weighted temporary). Fingerprints are compared only with
fingerprints of the same array module, by equality.
"""
from __future__ import annotations

import functools

from ..backend import host

HOST_COPY_UP_TO = 1 << 10  # bytes: keep the bytes themselves
HOST_HASH_UP_TO = 1 << 13  # bytes: below this, hashing the bytes on the host beats the word sums' few NumPy calls


def small_host_fingerprint(a) -> tuple:
    """`fingerprint` of a NumPy array of at most HOST_COPY_UP_TO bytes, for callers that have
    tested that already (the saved-tensor store, once per save and load): the bytes themselves.
    Fingerprinting one costs about as much as caching its fingerprint would."""
    return a.tobytes(), 0, a.shape, _dtype_name(a.dtype)  # (a NumPy shape is a tuple already)


def hashed_host_fingerprint(a) -> tuple:
    """`fingerprint` of a NumPy array of at most HOST_HASH_UP_TO bytes (and more than HOST_COPY_UP_TO),
    for callers that have tested that already: Python's own hash of the bytes -- SipHash, keyed per
    process (prints are compared only within one), 64 bits in one pass: ~4 us a 4 KiB array, where
    CRC-32 and Adler-32 took ~7."""
    return hash(a.tobytes()), 0, a.shape, _dtype_name(a.dtype)


def small_or_hashed_host_fingerprint(a) -> tuple:
    """`fingerprint` of a NumPy array of at most HOST_HASH_UP_TO bytes, for callers that have tested that
    already (the saved store's hot paths): its bytes up to HOST_COPY_UP_TO, else their hash."""
    return small_host_fingerprint(a) if a.nbytes <= HOST_COPY_UP_TO else hashed_host_fingerprint(a)


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype) -> str:
    return str(dtype)  # str(dtype) costs microseconds; fingerprints run once per value on hot paths


def _weighted(xp, words):
    """words * (1, 2, 3, ...), in place in the position array: one temporary, not two (two large
    temporaries at once made the allocator return and re-fault their pages on every call)."""
    w = xp.arange(1, words.size + 1, dtype=xp.uint64)
    w *= words
    return w


def fingerprint(xp, a) -> tuple:
    """(word sum, position-weighted word sum, shape, dtype) -- or, on the host paths, the bytes or
    their hash (and 0), or pass_fingerprint's pair, in place of the sums."""
    if not isinstance(a, xp.ndarray):
        a = xp.asarray(a)
    shape, dtype = tuple(a.shape), _dtype_name(a.dtype)
    if xp.__name__ == "numpy" and a.nbytes <= HOST_HASH_UP_TO:
        return small_or_hashed_host_fingerprint(a)
    if xp.__name__ == "numpy":  # a larger float host array: the word sum and a weighted dot, at ~60% of
        return pass_fingerprint(xp, a)  # word_sums' cost (its other arrays take word_sums)
    return word_sums(xp, a)


def _byte_parts(xp, a) -> list:
    """a's bytes, zero-padded to whole 64-bit words: [bytes] or [bytes, padding]."""
    raw = xp.ascontiguousarray(a).reshape(-1).view(xp.uint8)
    pad = (-raw.size) % 8
    return [raw, xp.zeros(pad, dtype=xp.uint8)] if pad else [raw]


CHUNK_WORDS = 1 << 15  # 256 KiB of words: fingerprints' bound on the temporaries of a group of small arrays
GROUP_WORDS = 1 << 10  # 8 KiB: larger host arrays are fingerprinted one by one (no temporaries)
SUM_CHUNK_WORDS = 1 << 17  # 1 MiB: _host_word_sums reads each chunk twice, the second time from L2
LANES = 1 << 11  # _host_word_sums views a chunk as rows of this many words
_lane_weights = []  # [arange(1, LANES + 1)] and [arange(0, SUM_CHUNK_WORDS, LANES)], made on first use


def _host_word_sums(np, words) -> tuple[int, int]:
    """The two sums on the host, one read of memory and no large temporaries.

    Per chunk (read twice, the second time from L2), viewed as rows of LANES words: with word
    i = r * LANES + l, sum((i + 1) * w_i) = sum_r r * LANES * rowsum_r + sum_l (l + 1) * colsum_l.
    The row and column sums are plain reductions, which NumPy vectorizes; only two short dots
    remain (NumPy's integer dot is not vectorized: over every word it took 3/4 of the time). Words
    past the last whole row are weighted directly; a chunk starting at word lo adds lo * its sum
    to make the weights global positions. Unsigned sums and dots wrap mod 2**64, as the sums do."""
    if not _lane_weights:
        _lane_weights.extend([np.arange(1, LANES + 1, dtype=np.uint64),
                              np.arange(0, SUM_CHUNK_WORDS, LANES, dtype=np.uint64)])
    lanes, row_starts = _lane_weights
    s1 = s2 = 0
    for lo in range(0, words.size, SUM_CHUNK_WORDS):
        c = words[lo:lo + SUM_CHUNK_WORDS]
        rows = c.size // LANES
        full = rows * LANES
        c1 = c2 = 0
        if rows:
            m = c[:full].reshape(rows, LANES)
            row_sums = m.sum(axis=1, dtype=np.uint64)
            c1 = int(row_sums.sum(dtype=np.uint64))
            c2 = int(np.dot(m.sum(axis=0, dtype=np.uint64), lanes)) + int(np.dot(row_starts[:rows], row_sums))
        if full < c.size:
            tail = c[full:]
            t1 = int(tail.sum(dtype=np.uint64))
            c2 += int(np.dot(tail, lanes[:tail.size])) + full * t1
            c1 += t1
        s1 += c1
        s2 += c2 + lo * c1
    return s1 & 0xFFFFFFFFFFFFFFFF, s2 & 0xFFFFFFFFFFFFFFFF


def word_sums(xp, a) -> tuple:
    """(word sum, position-weighted word sum, shape, dtype): the device path of `fingerprint`."""
    parts = _byte_parts(xp, a)
    words = (parts[0] if len(parts) == 1 else xp.concatenate(parts)).view(xp.uint64)
    if xp.__name__ == "numpy":
        return (*_host_word_sums(xp, words), tuple(a.shape), _dtype_name(a.dtype))
    s1 = words.sum(dtype=xp.uint64)  # methods, not xp.sum: no Python wrapper layer per call
    s2 = _weighted(xp, words).sum(dtype=xp.uint64)
    # only the 16-byte digest crosses to the host, through the explicit door (one copy, not two)
    d1, d2 = host(xp, xp.stack([s1, s2])).tolist()
    return d1, d2, tuple(a.shape), _dtype_name(a.dtype)


def fingerprints(xp, arrays) -> list[tuple[int, int, tuple, str]]:
    """Word-sum fingerprints of many arrays in a fixed number of device calls (always the
    word sums, never the small-host shortcuts of `fingerprint`: compare them only with each other).

    For many small arrays (a checkpoint segment's values) the per-call overhead of
    `fingerprint` dominates; here the arrays' words are concatenated once and both
    sums of every array come from one segmented reduction each. With global word
    positions j + 1, the weighted sum is corrected to local positions by
    subtracting lo * sum (mod 2**64, as unsigned arithmetic wraps)."""
    arrays = [xp.asarray(a) for a in arrays]
    if not hasattr(xp.add, "reduceat"):  # an array module without segmented reductions: one by one
        return [word_sums(xp, a) for a in arrays]
    if xp.__name__ == "numpy":
        # On the host, only small arrays are grouped (their per-call overhead is what grouping
        # saves), up to CHUNK_WORDS together, which bounds the temporaries (the concatenation and
        # its weighted copy). An array of more than GROUP_WORDS goes alone through the chunked
        # word_sums, which reads it once and makes no temporaries: copying 64 KiB activations into
        # a concatenation and weighting them made the recompute check cost 1 ms per 4 values --
        # more than the recomputation it checks. (The sums are the same either way.)
        out = [None] * len(arrays)
        group, where, words = [], [], 0

        def flush():
            for i, fp in zip(where, _segmented(xp, group)):
                out[i] = fp
        for i, a in enumerate(arrays):
            n = (a.nbytes + 7) // 8
            if n > GROUP_WORDS:
                out[i] = word_sums(xp, a)
                continue
            if group and words + n > CHUNK_WORDS:
                flush()
                group, where, words = [], [], 0
            group.append(a)
            where.append(i)
            words += n
        if group:
            flush()
        return out
    return _segmented(xp, arrays)


def _segmented(xp, arrays) -> list:
    """Both sums of every array from one segmented reduction each, over their concatenation."""
    parts, lo, size = [], [], 0
    for a in arrays:
        if a.size == 0:
            continue
        mine = _byte_parts(xp, a)
        parts += mine
        lo.append(size)
        size += sum(p.size for p in mine) // 8
    sums = iter(())
    if parts:
        words = xp.concatenate(parts).view(xp.uint64)
        starts = xp.asarray(lo)
        s1 = xp.add.reduceat(words, starts, dtype=xp.uint64)
        s2 = xp.add.reduceat(_weighted(xp, words), starts, dtype=xp.uint64)
        s2 -= starts.astype(xp.uint64) * s1
        sums = iter(host(xp, xp.stack([s1, s2])).T.tolist())  # the digests only, explicitly
    return [(*((0, 0) if a.size == 0 else map(int, next(sums))), tuple(a.shape), _dtype_name(a.dtype))
            for a in arrays]


_dot_weights = []  # [fixed random float64 weights], grown on demand


def pass_fingerprint(np, a) -> tuple:
    """A cheaper fingerprint of a float host array, for comparing two evaluations of the same value
    (the checkpoint recompute check), never with `fingerprint`'s: (word sum mod 2**64, the bytes of
    the dot product of the words read as float64 with fixed random weights -- both as bytes --,
    shape, dtype). The
    word sum changes with any single changed word; the weighted dot with any moved one (a
    permutation, rows swapped). Two reductions that read the array once each, in place (BLAS's
    dot; no position-weighted temporary): about a sixth of word_sums' cost on 64 KiB activations.
    Other dtypes (integers read as float64 are subnormals, slow in a dot) take word_sums."""
    if a.dtype.kind != "f" or a.nbytes % 8 or not a.flags.c_contiguous:
        return word_sums(np, a)
    words = a.reshape(-1).view(np.uint64)
    n = words.size
    if not _dot_weights or _dot_weights[0].size < n:
        _dot_weights[:] = [np.random.default_rng(0x5EED).uniform(0.5, 1.5, max(n, 1 << 12))]
    # (BLAS's dot raises no floating-point warnings: NaN/Inf in the data give NaN/Inf bytes, equal
    # for equal data; the few Python-level calls here are most of the cost on 64 KiB values)
    dot = words.view(np.float64).dot(_dot_weights[0][:n])
    return words.sum(dtype=np.uint64).tobytes() + dot.tobytes(), a.shape, _dtype_name(a.dtype)
