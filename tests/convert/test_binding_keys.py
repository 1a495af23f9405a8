"""model.json's string-key functions for converted SavedModels: `"key_hash": "farmhash64_mod"`
with `buckets`, `"key_hash": "vocabulary"` with `vocabulary` — parsed strictly, written back
as read, and applied by StringKeys (no TensorFlow here: test_tf_string_hash compares the
bucket function with TensorFlow itself)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from recserve.embedding import StringKeys, string_keys
from recserve.errors import ModelLoadError
from recserve.model_spec import parse_model_spec


def _spec(**binding: object) -> str:
    return json.dumps({"embeddings": [{"input": "city", "table": "t", "dim": 4, "key_dtype": "string", **binding}]})


def test_key_hashes_round_trip():
    for extra in ({"key_hash": "farmhash64_mod", "buckets": 1000}, {"key_hash": "vocabulary", "vocabulary": ["a", "b"]}):
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
