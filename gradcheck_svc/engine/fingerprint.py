"""Cheap fingerprints of arrays, computed on the device that holds them.

A Fletcher-style checksum over the array's bytes viewed as unsigned words:
(sum of words, sum of words weighted by position), both mod 2**64 (unsigned
integer sums wrap). Any single changed word changes the first sum; moved or
swapped words change the second. Two device reductions, no host copy of the
data: only the two 64-bit results cross to the host.

Small host (NumPy) arrays take faster paths, because NumPy's reductions
cost tens of microseconds of fixed overhead per call, which dominated graphs
of many small ops: up to 1 KiB the "fingerprint" is the bytes themselves
(exact, and cheaper than any hash); up to 64 KiB, CRC-32 and Adler-32 of the
bytes (zlib, no temporaries). Fingerprints are compared only with
fingerprints of the same array module, by equality.
"""
from __future__ import annotations

import zlib

HOST_COPY_UP_TO = 1 << 10  # bytes: keep the bytes themselves
HOST_HASH_UP_TO = 1 << 16  # bytes: below this, zlib on the host beats two NumPy reductions


def is_small_host(xp, a) -> bool:
    """Small enough that fingerprinting it costs about as much as caching its fingerprint."""
    return a.nbytes <= HOST_COPY_UP_TO and xp.__name__ == "numpy"


def fingerprint(xp, a) -> tuple:
    """(word sum, position-weighted word sum, shape, dtype) -- or, on the host paths, the bytes
    or two zlib checksums in place of the sums."""
    if not isinstance(a, xp.ndarray):
        a = xp.asarray(a)
    shape, dtype = a.shape, a.dtype
    if xp.__name__ == "numpy" and a.nbytes <= HOST_HASH_UP_TO:
        if a.nbytes <= HOST_COPY_UP_TO:
            return a.tobytes(), 0, shape, dtype
        buf = a if a.flags.c_contiguous else xp.ascontiguousarray(a)
        return zlib.crc32(buf), zlib.adler32(buf), shape, dtype
    raw = xp.ascontiguousarray(a).reshape(-1).view(xp.uint8)
    pad = (-raw.size) % 8
    if pad:
        raw = xp.concatenate([raw, xp.zeros(pad, dtype=xp.uint8)])
    words = raw.view(xp.uint64)
    s1 = xp.sum(words, dtype=xp.uint64)
    s2 = xp.sum(words * xp.arange(1, words.size + 1, dtype=xp.uint64), dtype=xp.uint64)
    return int(s1), int(s2), tuple(shape), dtype
