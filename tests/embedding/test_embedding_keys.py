"""String keys (XXH64) and default rows: published vectors, and both engines agreeing bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from recserve.embedding import _native, _pure
from recserve.embedding._purekeys import xxh64
from recserve.errors import RequestError
from recserve.model_spec import DefaultSpec

# XXH64, seed 0, as int64. "Nobody inspects..." and the empty input's value are published in
# python-xxhash's README; the rest were computed with the `xxhash` package 4.1.0.
KNOWN = {
    b"a": -3292477735350538661,  # 0xD24EC4F1A98C6E5B
    b"abc": 4952883123889572249,  # 0x44BC2CF5AD770999
    b"xxhash": 3665147885093898016,  # 0x32DD38952C4BC720
    b"Nobody inspects the spammish repetition": -302119147016844303,  # 0xFBCEA83C8A378BF1
    "héllo wörld".encode(): 6918685708591841596,
    "用户_42".encode(): -6731260371663176794,
    bytes(range(1, 101)): 1874685200345616295,
}
PATTERN = bytes((i * 7 + 3) % 256 for i in range(80))
BY_LENGTH = {  # PATTERN[:n]: every tail branch and the 32-byte stripe loop
    1: 2244420788148980662,
    3: 3589991498569311433,
    4: -7226505550099472422,
    5: -4080104041438227970,
    7: -7315230520863989544,
    8: -2685942436135894894,
    9: 1660621821610511362,
    12: -3085457809694830285,
    15: 1965763522714177074,
    16: 4848213110847732706,
    31: -6725458417449017063,
    32: 2577116162849570199,
    33: 5811842300876720004,
    39: -8643605145958069449,
    63: 6790958421027277116,
    64: 1060117496095223839,
    65: -6664281655332760847,
    70: -7151507540178355193,
}


def test_xxh64_of_empty_input_is_the_published_value() -> None:
    assert xxh64(b"") == 0xEF46DB3751D8E999


def test_string_keys_match_known_xxh64_values(engine) -> None:
    strings = list(KNOWN) + [PATTERN[:n] for n in BY_LENGTH]
    expected = list(KNOWN.values()) + list(BY_LENGTH.values())
    keys = engine.string_keys(strings)
    assert keys.dtype == np.int64
    assert keys.tolist() == expected


def test_str_is_hashed_as_utf8_and_empty_string_is_padding(engine) -> None:
    keys = engine.string_keys(["héllo wörld", "", b"a", ""])
    assert keys.tolist() == [6918685708591841596, -1, -3292477735350538661, -1]


def test_numpy_string_arrays_keep_their_shape(engine) -> None:
    as_bytes = np.array([[b"a", b"abc"], [b"", b"xxhash"]])
    as_str = np.array([["a", "abc"], ["", "xxhash"]])
    as_object = np.array([["a", b"abc"], ["", "xxhash"]], dtype=object)
    expected = [[KNOWN[b"a"], KNOWN[b"abc"]], [-1, KNOWN[b"xxhash"]]]
    for values in (as_bytes, as_str, as_object):
        keys = engine.string_keys(values)
        assert keys.shape == (2, 2)
        assert keys.tolist() == expected


def test_string_keys_at_hash_spans_of_a_buffer_in_place(engine) -> None:
    """The request parser's layout: (start, length) pairs into the request bytes; each key
    lands over the first half of the pairs, the second half is left as it was."""
    strings = [*KNOWN, b"", PATTERN[:33]]
    data = b"junk" + b"".join(strings) + b"tail"
    spans, at = [], 4
    for s in strings:
        spans += [at, len(s)]
        at += len(s)
    values = np.array([7, *spans, 9], dtype=np.int64)  # neighbours stay untouched
    engine.string_keys_at(data, values[1:-1])
    n = len(strings)
    assert values[1:1 + n].tolist() == [*KNOWN.values(), -1, BY_LENGTH[33]]
    assert values[1 + n:-1].tolist() == spans[n:]
    assert (values[0], values[-1]) == (7, 9)


def test_string_keys_reject_non_strings(engine) -> None:
    with pytest.raises(RequestError, match="string ids must be bytes or str, got int"):
        engine.string_keys([b"a", 5])


def test_both_engines_hash_random_strings_alike() -> None:
    rng = np.random.default_rng(3)
    strings = [rng.bytes(int(n)) for n in rng.integers(0, 100, size=300)]
    assert _native.string_keys(strings).tolist() == _pure.string_keys(strings).tolist()


def test_zero_default_rows_are_zeros(engine) -> None:
    rows = engine.default_vectors(DefaultSpec(), np.array([1, 2, 3]), 4)
    assert rows.dtype == np.float32
    assert np.array_equal(rows, np.zeros((3, 4), np.float32))


def test_normal_default_rows_are_bit_identical_across_engines_and_calls() -> None:
    spec = DefaultSpec(kind="normal", stddev=0.05, seed=-12345)  # seed taken modulo 2**64
    keys = np.concatenate([np.arange(-5, 200), [2**63 - 1, -(2**63)]]).astype(np.int64)
    for dim in (1, 7, 16):
        native = _native.default_vectors(spec, keys, dim)
        assert native.shape == (len(keys), dim) and native.dtype == np.float32
        assert native.tobytes() == _pure.default_vectors(spec, keys, dim).tobytes()
        assert native.tobytes() == _native.default_vectors(spec, keys, dim).tobytes()


def test_normal_default_rows_depend_on_seed_and_key_and_have_the_stddev(engine) -> None:
    keys = np.arange(4000, dtype=np.int64)
    rows = engine.default_vectors(DefaultSpec(kind="normal", stddev=2.0, seed=1), keys, 8)
    other_seed = engine.default_vectors(DefaultSpec(kind="normal", stddev=2.0, seed=2), keys, 8)
    assert not np.array_equal(rows, other_seed)
    assert len({r.tobytes() for r in rows}) == len(keys)
    assert abs(float(rows.mean())) < 0.05
    assert abs(float(rows.std()) - 2.0) < 0.05
    # a row's prefix does not depend on dim: the generator is counter-based per component
    assert np.array_equal(
        rows[:, :5], engine.default_vectors(DefaultSpec("normal", 2.0, 1), keys, 5)
    )


def test_default_vectors_reject_bad_arguments(engine) -> None:
    with pytest.raises(ValueError, match="default_vectors: dim must be a positive integer, got 0"):
        engine.default_vectors(DefaultSpec(), np.array([1]), 0)
    with pytest.raises(ValueError, match="default_vectors: keys must be integers"):
        engine.default_vectors(DefaultSpec(), np.array([1.5]), 2)
