"""The deterministic functions of keys in pure Python: XXH64 (seed 0) of a string, TensorFlow's
Fingerprint64 (farmhash) bucket of a string, and the N(0, stddev) default row of an unknown key. native/embedding_keys.c computes the same bits;
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


_K0 = 0xC3A5C85C97CB3127
_K1 = 0xB492B66FBE98F273
_K2 = 0x9AE16A3B2F90404F


def _rotr(v: int, s: int) -> int:
    return v if s == 0 else ((v >> s) | (v << (64 - s))) & _M


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def _f64(data: bytes, p: int) -> int:
    return int.from_bytes(data[p : p + 8], "little")


def _f32(data: bytes, p: int) -> int:
    return int.from_bytes(data[p : p + 4], "little")


def _len16(u: int, v: int, mul: int) -> int:
    a = ((u ^ v) * mul) & _M
    a ^= a >> 47
    b = ((v ^ a) * mul) & _M
    b ^= b >> 47
    return (b * mul) & _M


def _weak32(data: bytes, p: int, a: int, b: int) -> tuple[int, int]:
    w, x, y, z = _f64(data, p), _f64(data, p + 8), _f64(data, p + 16), _f64(data, p + 24)
    a = (a + w) & _M
    b = _rotr((b + a + z) & _M, 21)
    c = a
    a = (a + x + y) & _M
    b = (b + _rotr(a, 44)) & _M
    return (a + z) & _M, (b + c) & _M


def fingerprint64(s: bytes) -> int:
    """TensorFlow's Fingerprint64 (farmhash's farmhashna::Hash64), unsigned."""
    n = len(s)
    if n <= 16:
        if n >= 8:
            mul = _K2 + n * 2
            a = (_f64(s, 0) + _K2) & _M
            b = _f64(s, n - 8)
            c = (_rotr(b, 37) * mul + a) & _M
            d = ((_rotr(a, 25) + b) * mul) & _M
            return _len16(c, d, mul)
        if n >= 4:
            return _len16(n + (_f32(s, 0) << 3), _f32(s, n - 4), _K2 + n * 2)
        if n > 0:
            y = s[0] + (s[n >> 1] << 8)
            z = n + (s[n - 1] << 2)
            return (_shift_mix(((y * _K2) ^ (z * _K0)) & _M) * _K2) & _M
        return _K2
    mul = _K2 + n * 2
    if n <= 32:
        a = (_f64(s, 0) * _K1) & _M
        b = _f64(s, 8)
        c = (_f64(s, n - 8) * mul) & _M
        d = (_f64(s, n - 16) * _K2) & _M
        return _len16((_rotr((a + b) & _M, 43) + _rotr(c, 30) + d) & _M, (a + _rotr((b + _K2) & _M, 18) + c) & _M, mul)
    if n <= 64:
        a = (_f64(s, 0) * _K2) & _M
        b = _f64(s, 8)
        c = (_f64(s, n - 8) * mul) & _M
        d = (_f64(s, n - 16) * _K2) & _M
        y = (_rotr((a + b) & _M, 43) + _rotr(c, 30) + d) & _M
        z = _len16(y, (a + _rotr((b + _K2) & _M, 18) + c) & _M, mul)
        e = (_f64(s, 16) * mul) & _M
        f = _f64(s, 24)
        g = ((y + _f64(s, n - 32)) * mul) & _M
        h = ((z + _f64(s, n - 24)) * mul) & _M
        return _len16((_rotr((e + f) & _M, 43) + _rotr(g, 30) + h) & _M, (e + _rotr((f + a) & _M, 18) + g) & _M, mul)
    x, y = 81, (81 * _K1 + 113) & _M
    z = (_shift_mix((y * _K2 + 113) & _M) * _K2) & _M
    v, w = (0, 0), (0, 0)
    x = (x * _K2 + _f64(s, 0)) & _M
    end = ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    p = 0
    while True:
        x = (_rotr((x + y + v[0] + _f64(s, p + 8)) & _M, 37) * _K1) & _M
        y = (_rotr((y + v[1] + _f64(s, p + 48)) & _M, 42) * _K1) & _M
        x ^= w[1]
        y = (y + v[0] + _f64(s, p + 40)) & _M
        z = (_rotr((z + w[0]) & _M, 33) * _K1) & _M
        v = _weak32(s, p, (v[1] * _K1) & _M, (x + w[0]) & _M)
        w = _weak32(s, p + 32, (z + w[1]) & _M, (y + _f64(s, p + 16)) & _M)
        z, x = x, z
        p += 64
        if p == end:
            break
    mul = _K1 + ((z & 0xFF) << 1)
    p = last64
    w0 = (w[0] + ((n - 1) & 63)) & _M
    v0 = (v[0] + w0) & _M
    w = ((w0 + v0) & _M, w[1])
    v = (v0, v[1])
    x = (_rotr((x + y + v[0] + _f64(s, p + 8)) & _M, 37) * mul) & _M
    y = (_rotr((y + v[1] + _f64(s, p + 48)) & _M, 42) * mul) & _M
    x ^= (w[1] * 9) & _M
    y = (y + v[0] * 9 + _f64(s, p + 40)) & _M
    z = (_rotr((z + w[0]) & _M, 33) * mul) & _M
    v = _weak32(s, p, (v[1] * mul) & _M, (x + w[0]) & _M)
    w = _weak32(s, p + 32, (z + w[1]) & _M, (y + _f64(s, p + 16)) & _M)
    z, x = x, z
    return _len16((_len16(v[0], w[0], mul) + _shift_mix(y) * _K0 + z) & _M, (_len16(v[1], w[1], mul) + x) & _M, mul)


def string_bucket(data: bytes, buckets: int) -> int:
    """TensorFlow's StringToHashBucketFast of a string's UTF-8 bytes; '' is padding (-1)."""
    return fingerprint64(data) % buckets if data else -1


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
