"""TF2 / Keras SavedModels served as they are (DESIGN §4c): the model of keras_model.py
(StringLookup, Hashing and Embedding layers inside the model), written by real Keras 3 with
`model.export` (what Keras 3 gives TF Serving users) and with `tf.saved_model.save`, served
within 1e-5 of TensorFlow running the same SavedModel: `tf.saved_model.load`'s signature,
and for the `export` form also session.run (what TF Serving runs; Keras 3's
tf.saved_model.save writes a model a session-style load cannot run, recserve converts it by
its object graph)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from model_requests import KERAS_CITIES, KERAS_HIST_ROWS, KERAS_ITEM_ROWS, KERAS_TAGS, keras_requests
from tf_helpers import run_tf, tf_predict

from recserve import Processor
from recserve.server.cli import main as cli_main
from recserve.wire.codec import decode_response, encode_request

TOLERANCE = 1e-5
NAMES = ["age", "city", "hist", "item", "query", "tags"]
# tf.saved_model.save names a dict's entries inputs, inputs_1, ... in key order.
SAVED_KEYS = {name: "inputs" if i == 0 else f"inputs_{i}" for i, name in enumerate(NAMES)}


@pytest.fixture(scope="module", params=["export", "save"])
def keras_savedmodel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("keras") / request.param
    run_tf("write", str(out), request.param, script="keras_model.py")
    return out, request.param


def _batches(how: str, seed: int) -> list[dict[str, np.ndarray]]:
    """200 requests at batch 1, 8 and 64: known, unseen and '' strings."""
    batches = keras_requests(150, 1, seed) + keras_requests(40, 8, seed + 1) + keras_requests(10, 64, seed + 2)
    if how == "save":
        batches = [{SAVED_KEYS[k]: v for k, v in b.items()} for b in batches]
    return batches


def _key(how: str, name: str) -> str:
    return SAVED_KEYS[name] if how == "save" else name


def test_keras_savedmodel_serves_within_1e5_of_tensorflow(keras_savedmodel, tmp_path):
    savedmodel, how = keras_savedmodel
    batches = _batches(how, 71)
    assert any(w == "" for b in batches for w in b[_key(how, "city")])  # '' is OOV in Keras, not padding
    want = tf_predict(savedmodel, batches, tmp_path, tf2=True)
    if how == "export":  # TF Serving's session-style run agrees (it cannot load the `save` form)
        assert np.abs(np.concatenate(tf_predict(savedmodel, batches[:20], tmp_path)) -
                      np.concatenate(want[:20])).max() <= 1e-6
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        inputs = processor._model.spec.signatures["serving_default"].inputs
        bindings = {name: b for b in processor._model.spec.embeddings for name in NAMES
                    if inputs[_key(how, name)] == b.input}
        city, tags, query = bindings["city"], bindings["tags"], bindings["query"]
        assert (list(city.vocabulary), city.vocabulary_start, city.default_id, city.empty_is_padding) == \
            (KERAS_CITIES, 1, 0, False)  # StringLookup: OOV index 0, words from 1, '' is a word like any
        assert (list(tags.vocabulary), tags.vocabulary_start, tags.oov_buckets, tags.oov_start) == \
            (KERAS_TAGS, 3, 3, 0)  # num_oov_indices=3: unknown words hashed into ids 0..2
        assert (query.buckets, query.empty_is_padding) == (64, False)  # Hashing(64) hashes '' too
        # GlobalAveragePooling1D right after an Embedding is pooled by the engine itself.
        assert {name: b.combiner for name, b in bindings.items()} == {
            "city": "none", "hist": "mean", "item": "none", "query": "none", "tags": "mean"}
        worst = 0.0
        for batch, expected in zip(batches, want):
            status, body = processor.process(encode_request(batch))
            assert status == 200, body
            got = decode_response(body)["output_0"]
            assert got.shape == expected.shape
            by_predict = processor.predict(batch)["output_0"]
            worst = max(worst, float(np.abs(got - expected).max()), float(np.abs(by_predict - expected).max()))
        assert worst <= TOLERANCE
        # The lookups run in recserve's engine: no table is left in the served ONNX graph.
        tables = {name: processor._manager.current.tables[b.table] for name, b in bindings.items()}
        assert {name: len(t) for name, t in tables.items()} == {
            "city": 5, "tags": 23, "query": 64, "item": KERAS_ITEM_ROWS, "hist": KERAS_HIST_ROWS}
        model = onnx.load(processor._model.onnx_path)
        shapes = {tuple(t.dims) for t in model.graph.initializer}
        assert {(25, 16), (16, 1)} <= shapes  # the Dense layers' kernels
        assert not shapes & {(len(t), t.dim) for t in tables.values()}
    finally:
        processor.close()


def test_recserve_convert_checks_a_keras_savedmodel(keras_savedmodel, tmp_path, capsys):
    savedmodel, _ = keras_savedmodel
    out = tmp_path / "converted"
    assert cli_main(["convert", str(savedmodel), str(out), "--check", "60"]) == 0
    report = capsys.readouterr().out
    line = next(s for s in report.splitlines() if s.startswith("parity: 60 requests"))
    assert float(line.rsplit("= ", 1)[1]) <= TOLERANCE, report
    # Keras reads id -1 as the table's last row; recserve says it answers zeros instead.
    assert re.search(r"warning: the lookup of 'item_emb/embeddings(_1)?' reads a negative id as counted from the "
                     r"table's end \(Keras's take\); recserve answers zeros for negative ids", report), report


def test_a_string_lookup_with_a_mask_token_is_converted(tmp_path):
    """StringLookup(mask_token=''): '' -> 0, unknown -> 1, words from 2 (a vocabulary whose
    id 1 no string has)."""
    savedmodel = tmp_path / "masked"
    run_tf("write", str(savedmodel), "mask", script="keras_model.py")
    batches = [{"city": b["city"]} for b in keras_requests(100, 1, 75) + keras_requests(20, 16, 76)]
    assert sum(w == "" for b in batches for w in b["city"]) > 10
    want = tf_predict(savedmodel, batches, tmp_path, tf2=True)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        (binding,) = processor._model.spec.embeddings
        assert (binding.vocabulary, binding.vocabulary_start, binding.default_id) == (
            ("", None, *KERAS_CITIES), 0, 1)
        worst = max(float(np.abs(processor.predict(b)["output_0"] - w).max()) for b, w in zip(batches, want))
        assert worst <= TOLERANCE
    finally:
        processor.close()


def test_a_tf_module_saved_by_tf_saved_model_save_is_converted(tmp_path):
    """A TF2 model without Keras (keras_model._Ranker): ResourceGather on captured variable
    handles (Keras 2's Embedding does the same), strings hashed by to_hash_bucket_fast ('' too);
    within 1e-5 of TensorFlow's session.run (what TF Serving runs) and of tf.saved_model.load."""
    savedmodel = tmp_path / "module"
    run_tf("write", str(savedmodel), "module", script="keras_model.py")
    batches = [{"item": b["item"], "city": b["query"], "age": b["age"]}
               for b in keras_requests(100, 1, 77) + keras_requests(20, 16, 78)]
    session_run = tf_predict(savedmodel, batches, tmp_path)
    loaded = tf_predict(savedmodel, batches, tmp_path, tf2=True)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        bindings = {b.input: b for b in processor._model.spec.embeddings}
        assert {(b.table, b.buckets, b.empty_is_padding) for b in bindings.values()} == {
            ("item_emb", 0, True), ("city_emb", 16, False)}
        for want in (session_run, loaded):
            worst = max(float(np.abs(processor.predict(b)["prob"] - w).max()) for b, w in zip(batches, want))
            assert worst <= TOLERANCE
    finally:
        processor.close()
