"""Integer vocabularies (DESIGN §4c): feature columns' categorical_column_with_vocabulary_list
of int64 ids (tf_model.py write_int_vocab) and Keras's IntegerLookup (keras_model.py
integer_lookup), written by real TensorFlow, served against TensorFlow itself. A binding's
`"key_hash": "vocabulary"` with `"key_dtype": "int64"` keys an id by its index in the list
(IntegerKeys); the native route keys those ids in C (native/route_int_vocabulary.c)."""

from __future__ import annotations

import numpy as np
from model_requests import BRANDS, KERAS_ITEMS, SHOPS, int_vocab_requests
from served import assert_served_natively, layouts, worst
from tf_helpers import run_tf, tf_predict

from recserve import Processor

TOLERANCE = 1e-5


def test_integer_vocabulary_columns_serve_within_1e5_of_tensorflow(tmp_path):
    """`shop` ([batch, 3], mean): unknown ids dropped like -1 padding; `brand` (one id, sum):
    unknown ids take default_value 1 (the row of BRANDS[1]), -1 is dropped. 400 requests with
    known ids, -1, and unknown ones (negative, beyond 2**32)."""
    savedmodel = tmp_path / "int_vocab"
    run_tf("int_vocab", str(savedmodel))
    batches = int_vocab_requests(250, 1, 121) + int_vocab_requests(100, 8, 122) + int_vocab_requests(50, 64, 123)
    want = tf_predict(savedmodel, batches, tmp_path)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        bindings = {b.input: b for b in processor._model.spec.embeddings}
        assert {k: (b.key_dtype, b.vocabulary, b.default_id, b.empty_is_padding) for k, b in bindings.items()} == {
            "shop": ("int64", tuple(SHOPS), -1, True), "brand": ("int64", tuple(BRANDS), 1, True)}
        assert worst(processor, batches, want) <= TOLERANCE
        assert_served_natively(processor, batches)
        assert processor.model_info()["native_route"]["fallbacks"]["not_native"] == 0
    finally:
        processor.close()


def test_a_keras_integer_lookup_is_converted(tmp_path):
    """IntegerLookup(vocabulary): ids from 1 in list order, -1 and unknown ids the OOV index 0
    (looked up, not padding: Keras reads the Embedding's row 0 for them)."""
    savedmodel = tmp_path / "integer_lookup"
    run_tf("write", str(savedmodel), "integer_lookup", script="keras_model.py")
    rng = np.random.default_rng(131)
    batches = []
    for n in [1] * 150 + [8] * 50:
        roll = rng.random(n)
        known = np.array(KERAS_ITEMS, dtype=np.int64)[rng.integers(len(KERAS_ITEMS), size=n)]
        batches.append({"item": np.where(roll < 0.6, known, np.where(roll < 0.8, -1, rng.integers(-99, 1 << 40, n)))})
    want = tf_predict(savedmodel, batches, tmp_path, tf2=True)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        (binding,) = processor._model.spec.embeddings
        assert (binding.vocabulary, binding.vocabulary_start, binding.default_id, binding.empty_is_padding) == (
            tuple(KERAS_ITEMS), 1, 0, False)
        largest = max(float(np.abs(processor.predict(b)["output_0"] - w).max()) for b, w in zip(batches, want))
        assert largest <= TOLERANCE
        native = processor.model_info()["native_route"]   # predict's native path: all but each layout's first
        assert native["served"] == len(batches) - layouts(batches), native
        assert native["fallbacks"]["not_native"] == 0, native
        assert len({round(float(v), 5) for w in want for v in w.ravel()}) == len(KERAS_ITEMS) + 1  # every row seen
    finally:
        processor.close()
