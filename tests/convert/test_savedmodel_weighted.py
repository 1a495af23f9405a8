"""Weighted categorical columns (`weighted_categorical_column` under `embedding_column`:
embedding_lookup_sparse with sp_weights), written by real TensorFlow (tf_model.py
write_weighted), served against TensorFlow's own session.run (DESIGN §4c): the engine gives
each id's row unpooled, the weights input stays a dense input of the ONNX graph, which pools
the rows as TensorFlow does."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from model_requests import weighted_requests
from served import assert_served_natively, worst
from tf_helpers import run_tf, tf_predict

from recserve import Processor
from recserve.convert import run_conversion
from recserve.errors import ModelLoadError
from recserve.wire.codec import encode_request

TOLERANCE = 1e-5
WEIGHTED = {"kw": ("kw_w", "sum", 4), "genre": ("genre_w", "mean", 6), "topic": ("topic_w", "sqrtn", 4),
            "shop": ("shop_w", "mean", 3)}


def test_weighted_columns_serve_within_1e5_of_tensorflow(tmp_path):
    """Ids pooled by sum (an identity column partitioned in 2), mean (hashed strings; one id
    per sample too) and sqrtn (a vocabulary with OOV buckets), each with its own weights input:
    negative weights (kept by sum, dropped with their ids by mean and sqrtn), padding ids of
    weight 0, samples without any id, unseen strings. 500 requests at batch 1, 8 and 64."""
    savedmodel = tmp_path / "weighted"
    run_tf("weighted", str(savedmodel))
    batches = weighted_requests(300, 1, 101) + weighted_requests(150, 8, 102) + weighted_requests(50, 64, 103)
    flat = {k: np.concatenate([b[k].ravel() for b in batches]) for k in ("kw", "kw_w", "genre", "shop")}
    assert (flat["kw_w"] < 0).any() and (flat["kw"] == -1).any() and (flat["shop"] == -1).any()
    assert any(str(g).startswith("unseen") for g in flat["genre"])
    assert any((b["kw"] == -1).all(axis=1).any() for b in batches if len(b["kw"]) > 1)  # samples without ids
    want = tf_predict(savedmodel, batches, tmp_path)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        bindings = {b.input: b for b in processor._model.spec.embeddings}
        assert {k: (b.combiner, b.dim) for k, b in bindings.items()} == {k: ("none", d) for k, (_, _, d) in
                                                                          WEIGHTED.items()}
        # The weights are inputs of the dense graph; the tables are not in it.
        model = onnx.load(processor._model.onnx_path)
        graph_inputs = {i.name for i in model.graph.input}
        assert {w for w, _, _ in WEIGHTED.values()} | {"x"} <= graph_inputs
        assert max(int(np.prod(t.dims)) for t in model.graph.initializer) < 30 * 3  # shop's table, the smallest
        assert worst(processor, batches, want) <= TOLERANCE
        assert_served_natively(processor, batches)
        # Weights that do not match their ids' shape are refused by name.
        bad = dict(batches[0], kw_w=np.ones((1, 3), np.float32))
        status, body = processor.process(encode_request(bad))
        assert (status, body.decode()) == (400, "input 'kw_w': shape [1, 3] does not match [?, 4] (? is any size)")
    finally:
        processor.close()
    report = run_conversion(str(savedmodel), str(tmp_path / "out"), check=200)  # `recserve convert --check 200`
    lines = report.splitlines()
    parity = next(line for line in lines if line.startswith("parity: "))
    assert parity.startswith("parity: 200 requests, max |TensorFlow - recserve| = ")
    assert float(parity.rsplit(" ", 1)[1]) <= TOLERANCE
    assert not [line for line in lines if line.startswith("warning: ")]
    for ids, (weights, combiner, dim) in WEIGHTED.items():
        assert any(line.startswith(f"lookup {ids!r} -> table ") and line.endswith(
            f"(dim {dim}, {combiner} weighted by {weights!r})") for line in lines), lines
    spec = json.loads((tmp_path / "out" / "model.json").read_text())
    assert sorted(spec["signatures"]["serving_default"]["inputs"]) == sorted([*WEIGHTED, "kw_w", "genre_w", "topic_w",
                                                                              "shop_w", "x"])


def test_a_weighted_vocabulary_that_drops_unknown_words_from_a_mean_is_refused(tmp_path):
    """A vocabulary with default_value -1 drops unknown words and their weights from a mean's
    divisor: the dense graph cannot tell a dropped word's zero row from a known one's."""
    savedmodel = tmp_path / "weighted_refused"
    run_tf("weighted", str(savedmodel), "refused")
    with pytest.raises(ModelLoadError, match=r"the weighted lookup of 'input_layer/topic_weighted_by_topic_w_embedding/"
                                             r"embedding_weights' drops unknown words \(a vocabulary with default_value "
                                             r"-1\) and pools by mean.*or pool by sum"):
        Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
