"""model.json's string-key functions for converted SavedModels: `"key_hash": "farmhash64_mod"`
with `buckets`, `"key_hash": "vocabulary"` with `vocabulary` and its options (start, default
id, OOV buckets), `empty_is_padding` — parsed strictly, written back
as read, and applied by StringKeys (no TensorFlow here: test_tf_string_hash compares the
bucket function with TensorFlow itself)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from recserve.embedding import IntegerKeys, StringKeys, string_keys
from recserve.errors import ModelLoadError
from recserve.model_spec import parse_model_spec


def _spec(**binding: object) -> str:
    return json.dumps({"embeddings": [{"input": "city", "table": "t", "dim": 4, "key_dtype": "string", **binding}]})


def test_key_hashes_round_trip():
    for extra in ({"key_hash": "farmhash64_mod", "buckets": 1000}, {"key_hash": "vocabulary", "vocabulary": ["a", "b"]},
                  {"key_hash": "farmhash64_mod", "buckets": 64, "empty_is_padding": False},
                  {"key_hash": "vocabulary", "vocabulary": ["a"], "vocabulary_start": 3, "oov_buckets": 3},
                  {"key_hash": "vocabulary", "vocabulary": ["a"], "vocabulary_start": 1, "default_id": 0,
                   "empty_is_padding": False},
                  {"key_hash": "vocabulary", "vocabulary": ["", None, "a"], "default_id": 1}):
        spec = parse_model_spec(_spec(**extra))
        assert parse_model_spec(spec.dumps()) == spec
        assert {k: v for k, v in spec.to_json()["embeddings"][0].items() if k in extra} == extra
    plain = parse_model_spec(_spec())
    assert "key_hash" not in plain.to_json()["embeddings"][0]  # existing model.json files stay as they are


@pytest.mark.parametrize(("extra", "message"), [
    ({"key_hash": "md5"}, "'key_hash' is 'md5'; valid values are ['xxh64', 'farmhash64_mod', 'vocabulary']"),
    ({"key_hash": "farmhash64_mod"}, "needs 'key_dtype' \"string\" and 'buckets' a positive integer"),
    ({"key_hash": "farmhash64_mod", "buckets": 0}, "'buckets' a positive integer; got key_dtype 'string', buckets 0"),
    ({"buckets": 10}, "'buckets' goes with 'key_hash' 'farmhash64_mod'"),
    ({"key_hash": "vocabulary", "vocabulary": []}, "'vocabulary' a non-empty list of strings"),
    ({"vocabulary": ["a"]}, "'vocabulary' goes with 'key_hash' 'vocabulary'"),
    ({"default_id": 3}, "'default_id' goes with 'key_hash' 'vocabulary'"),
    ({"key_hash": "vocabulary", "vocabulary": [None]}, "'vocabulary' a non-empty list of strings (null: an id"),
    ({"key_hash": "vocabulary", "vocabulary": ["a", 3]}, "'vocabulary' a non-empty list of strings"),
    ({"key_hash": "vocabulary", "vocabulary": ["a"], "default_id": -2}, "'default_id' is -2; it must be an integer >= -1"),
    ({"key_hash": "vocabulary", "vocabulary": ["a"], "oov_buckets": "3"}, "'oov_buckets' is '3'; it must be an integer"),
    ({"empty_is_padding": False}, "false goes with 'key_hash' 'farmhash64_mod' or 'vocabulary'"),
])
def test_bad_key_hashes_are_refused_by_name(extra, message):
    with pytest.raises(ModelLoadError, match=f"embeddings\\[0\\]: .*{re.escape(message)}"):
        parse_model_spec(_spec(**extra))


def test_string_keys_of_a_vocabulary_and_of_buckets():
    vocabulary = StringKeys(vocabulary=("red", "北京"))
    values = np.array([["red", ""], ["北京".encode(), "blue"]], dtype=object)
    assert vocabulary.keys(values).tolist() == [[0, -1], [1, -1]]  # unknown and '' are padding
    data = b"red" + "北京".encode() + b"blue"
    spans = np.array([0, 3, 3, 6, 9, 4, 13, 0], dtype=np.int64)
    vocabulary.keys_at(data, spans)
    assert spans[:4].tolist() == [0, 1, -1, -1]
    buckets = StringKeys(buckets=1000)
    assert buckets.keys(values).tolist() == string_keys(values.ravel(), 1000).reshape(2, 2).tolist()
    assert StringKeys().keys(values).tolist() == string_keys(values.ravel()).reshape(2, 2).tolist()


def test_string_keys_of_keras_and_oov_vocabularies():
    """Keras's StringLookup (OOV id 0, words from 1, '' a string like any), num_oov_buckets
    (unknown words hashed after the vocabulary), and '' hashed when it is not padding."""
    from recserve.embedding._purekeys import fingerprint64

    values = np.array(["red", "", "blue", "北京"], dtype=object)
    keras = StringKeys(vocabulary=("red", "北京"), vocabulary_start=1, default_id=0, empty_is_padding=False)
    assert keras.keys(values).tolist() == [1, 0, 0, 2]
    masked = StringKeys(vocabulary=("", None, "red", "北京"), default_id=1, empty_is_padding=False)
    assert masked.keys(values).tolist() == [2, 0, 1, 3]  # mask token '' -> 0, unknown -> 1
    oov = StringKeys(vocabulary=("red", "北京"), oov_buckets=3, oov_start=2)
    assert oov.keys(values).tolist() == [0, -1, 2 + fingerprint64(b"blue") % 3, 1]  # '' still padding here
    hashed = StringKeys(buckets=64, empty_is_padding=False)
    assert hashed.keys(values).tolist() == [fingerprint64(w.encode()) % 64 for w in values]
    data = b"red" + b"blue"
    spans = np.array([0, 3, 3, 0, 3, 4], dtype=np.int64)
    hashed.keys_at(data, spans)
    assert spans[:3].tolist() == [fingerprint64(b"red") % 64, fingerprint64(b"") % 64, fingerprint64(b"blue") % 64]
    spans = np.array([0, 3, 3, 0, 3, 4], dtype=np.int64)
    keras.keys_at(data, spans)
    assert spans[:3].tolist() == [1, 0, 0]


@pytest.mark.parametrize("options", [
    {}, {"default_id": 0, "vocabulary_start": 1, "empty_is_padding": False}, {"oov_buckets": 5, "oov_start": 40},
    {"oov_buckets": 3, "empty_is_padding": False}, {"vocabulary": ("", None, "w1", "w2"), "default_id": 1,
                                                    "empty_is_padding": False},
])
def test_vocabularies_looked_up_by_hash_and_by_bytes_agree(options):
    """The native path (XXH64 + sorted search) and the by-bytes one (kept for vocabularies
    whose words share an XXH64) give the same ids, for arrays and for the parser's spans."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(30)] + ["北京", ""]
    values = np.array([words[rng.integers(len(words))] if rng.random() < 0.7 else f"other{rng.integers(1000)}"
                       for _ in range(400)], dtype=object)
    fast = StringKeys(**{"vocabulary": tuple(f"w{i}" for i in range(30)) + ("北京",), **options})
    slow = StringKeys(**{"vocabulary": tuple(f"w{i}" for i in range(30)) + ("北京",), **options})
    slow._sorted.clear()  # as when two words share an XXH64
    assert fast._sorted and fast.keys(values).tolist() == slow.keys(values).tolist()
    encoded = [v.encode() for v in values]
    data = b"".join(encoded)
    starts = np.cumsum([0] + [len(b) for b in encoded[:-1]])
    spans = np.column_stack([starts, [len(b) for b in encoded]]).astype(np.int64).reshape(-1)
    fast_spans, slow_spans = spans.copy(), spans.copy()
    fast.keys_at(data, fast_spans)
    slow.keys_at(data, slow_spans)
    assert fast_spans[:400].tolist() == slow_spans[:400].tolist() == fast.keys(values).tolist()


def test_integer_vocabularies_round_trip_and_bad_ones_are_named():
    doc = {"key_dtype": "int64", "key_hash": "vocabulary", "vocabulary": [10, None, 7_000_000_000], "default_id": 0,
           "vocabulary_start": 1, "empty_is_padding": False}
    spec = parse_model_spec(json.dumps({"embeddings": [{"input": "item", "table": "t", "dim": 4, **doc}]}))
    assert spec.embeddings[0].vocabulary == (10, None, 7_000_000_000)
    assert parse_model_spec(spec.dumps()) == spec
    for bad in ({"vocabulary": ["a"]}, {"vocabulary": [True]}, {"vocabulary": []}, {"vocabulary": [1], "oov_buckets": 2}):
        raw = {"input": "item", "table": "t", "dim": 4, "key_dtype": "int64", "key_hash": "vocabulary", **bad}
        with pytest.raises(ModelLoadError, match=re.escape("with 'key_dtype' \"int64\" needs 'vocabulary' a non-empty "
                                                           "list of integers (null: a key no id has) and no "
                                                           "'oov_buckets'")):
            parse_model_spec(json.dumps({"embeddings": [raw]}))


@pytest.mark.parametrize(("extra", "message"), [
    ({"vocabulary": [1, 2**63]}, f"'vocabulary' holds the id {2**63}, outside int64 [{-2**63}, {2**63 - 1}]"),
    ({"vocabulary": [-2**63 - 1]}, f"'vocabulary' holds the id {-2**63 - 1}, outside int64"),
    ({"vocabulary": [1], "vocabulary_start": 2**63}, (f"'vocabulary_start' is {2**63}; it must be an integer >= 0 "
                                                      f"and <= {2**63 - 1}")),
    ({"vocabulary": [1], "default_id": 2**64}, f"'default_id' is {2**64}; it must be an integer >= -1"),
    ({"vocabulary": [1, 2, 3], "vocabulary_start": 2**63 - 2},
     f"'vocabulary_start' {2**63 - 2} + 3 vocabulary entries gives keys beyond int64's {2**63 - 1}"),
])
def test_integer_vocabularies_beyond_int64_are_refused_by_name(extra, message):
    raw = {"input": "item", "table": "t", "dim": 4, "key_dtype": "int64", "key_hash": "vocabulary", **extra}
    with pytest.raises(ModelLoadError, match=f"embeddings\\[0\\]: .*{re.escape(message)}"):
        parse_model_spec(json.dumps({"embeddings": [raw]}))
    edge = {**raw, "vocabulary": [-2**63, 2**63 - 1], "vocabulary_start": 2**63 - 2, "default_id": 0}
    assert parse_model_spec(json.dumps({"embeddings": [edge]})).embeddings[0].vocabulary == (-2**63, 2**63 - 1)


def test_integer_keys_of_a_vocabulary():
    """An id's index + vocabulary_start; unknown ids the default; -1 padding unless not."""
    ids = np.array([[10, -1], [7_000_000_000, 5], [-7, 30]], dtype=np.int64)
    columns = IntegerKeys((10, 30, 7_000_000_000))
    assert columns.keys(ids).tolist() == [[0, -1], [2, -1], [-1, 1]]
    keras = IntegerKeys((10, None, 30), vocabulary_start=1, default_id=0, padding=False)
    assert keras.keys(ids).tolist() == [[1, 0], [0, 0], [0, 3]]
    parsed = ids.ravel().copy()
    keras.keys_at(b"", parsed)  # a parsed request's ids, keyed in place
    assert parsed.tolist() == keras.keys(ids).ravel().tolist()
