"""Cheap fingerprints of arrays, computed on the device that holds them.

A Fletcher-style checksum over the array's bytes viewed as unsigned words:
(sum of words, sum of words weighted by position), both mod 2**64 (unsigned
integer sums wrap). Any single changed word changes the first sum; moved or
swapped words change the second. Two device reductions, no host copy of the
data: only the two 64-bit results cross to the host.
"""
from __future__ import annotations


def fingerprint(xp, a) -> tuple[int, int, tuple, str]:
    a = xp.asarray(a)
    shape, dtype = tuple(a.shape), str(a.dtype)
    raw = xp.ascontiguousarray(a).reshape(-1).view(xp.uint8)
    pad = (-raw.size) % 8
    if pad:
        raw = xp.concatenate([raw, xp.zeros(pad, dtype=xp.uint8)])
    words = raw.view(xp.uint64)
    s1 = xp.sum(words, dtype=xp.uint64)
    s2 = xp.sum(words * xp.arange(1, words.size + 1, dtype=xp.uint64), dtype=xp.uint64)
    return int(s1), int(s2), shape, dtype
