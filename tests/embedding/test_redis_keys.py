"""The Redis key layout and row encoding documented in recserve/embedding/redis_keys.py."""

from __future__ import annotations

import numpy as np
import pytest

from recserve.embedding.redis_keys import KeySpace, decode_rows, encode_rows, row_keys


def test_row_keys_are_prefix_plus_big_endian_hex() -> None:
    prefix = KeySpace("ctr").row_prefix("7", "user")
    assert prefix == b"rs:ctr:7:user:"
    assert row_keys(prefix, np.array([1000, -1 - 2**40, 0])) == [
        b"rs:ctr:7:user:00000000000003e8",
        b"rs:ctr:7:user:fffffeffffffffff",
        b"rs:ctr:7:user:0000000000000000",
    ]


def test_names_cannot_break_the_layout_or_hash_tags() -> None:
    space = KeySpace("a:b{c}")
    assert space.row_prefix("v:1", "emb/user") == b"rs:a%3Ab%7Bc%7D:v%3A1:emb/user:"
    assert space.ready("v:1") == "rs:{a%3Ab%7Bc%7D}:ready:v%3A1"
    assert space.updates == "rs:{a%3Ab%7Bc%7D}:updates"
    assert KeySpace("m").version_pattern("v*") == "rs:m:v%2A:*"  # no glob characters left


def test_rows_round_trip_and_missing_rows_are_reported() -> None:
    values = np.array([[0.0, 1.5, -2.0], [3.0, 0.0, 0.0]], np.float32)
    encoded = encode_rows(values)
    assert encoded[1] == values[1].astype("<f4").tobytes()  # trailing zero bytes kept
    found, rows = decode_rows([encoded[0], None, encoded[1]], 3, "table 'u'")
    assert found.tolist() == [True, False, True]
    np.testing.assert_array_equal(rows, values)
    with pytest.raises(ValueError, match=r"table 'u': rows in Redis are not 12 bytes \(float32 x dim 3\) each"):
        decode_rows([b"abc"], 3, "table 'u'")
