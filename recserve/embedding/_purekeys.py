"""The deterministic functions of keys in pure Python: XXH64 (seed 0) of a string and the
N(0, stddev) default row of an unknown key. native/embedding_keys.c computes the same bits;
the algorithms are spelled out in the package docstring."""

from __future__ import annotations

import math

import numpy as np

_M = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def _merge(acc: int, v: int) -> int:
    return ((acc ^ _round(0, v)) * _P1 + _P4) & _M


def xxh64(data: bytes) -> int:
    """XXH64 of data with seed 0, as an unsigned 64-bit integer."""
    n, p = len(data), 0
    if n >= 32:
        v1, v2, v3, v4 = (_P1 + _P2) & _M, _P2, 0, (-_P1) & _M
        while p + 32 <= n:
            v1 = _round(v1, int.from_bytes(data[p : p + 8], "little"))
            v2 = _round(v2, int.from_bytes(data[p + 8 : p + 16], "little"))
            v3 = _round(v3, int.from_bytes(data[p + 16 : p + 24], "little"))
            v4 = _round(v4, int.from_bytes(data[p + 24 : p + 32], "little"))
            p += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = _P5
    h = (h + n) & _M
    while p + 8 <= n:
        h ^= _round(0, int.from_bytes(data[p : p + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        p += 8
    if p + 4 <= n:
        h ^= (int.from_bytes(data[p : p + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        p += 4
    while p < n:
        h ^= (data[p] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def string_key(data: bytes) -> int:
    """The int64 key of a string's UTF-8 bytes; the empty string is padding (-1)."""
    if not data:
        return -1
    h = xxh64(data)
    return h - (1 << 64) if h >= 1 << 63 else h


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def default_row(stddev: float, seed: int, key: int, dim: int) -> list[float]:
    """One unknown key's default row, as doubles to be rounded to float32 (seed < 2**64)."""
    stream = _splitmix64(_splitmix64(seed) ^ (key & _M))
    row: list[float] = []
    for j in range(0, dim, 2):
        a = _splitmix64((stream + j) & _M)
        b = _splitmix64((stream + j + 1) & _M)
        u1 = float((a >> 11) + 1) * 2.0**-53
        u2 = float(b >> 11) * 2.0**-53
        radius = math.sqrt(-2.0 * math.log(u1))
        theta = 6.283185307179586 * u2
        row.append(stddev * (radius * math.cos(theta)))
        row.append(stddev * (radius * math.sin(theta)))
    return row[:dim]


def default_rows(stddev: float, seed: int, keys: np.ndarray, dim: int) -> np.ndarray:
    rows = [default_row(stddev, seed, int(k), dim) for k in keys.reshape(-1).tolist()]
    return np.array(rows, dtype=np.float64).astype(np.float32).reshape(len(rows), dim)
