"""Partitioned variables looked up with partition_strategy='mod' (id i at row i // P of part
i % P), written by real TensorFlow (tf_model.py write_mod), served against TensorFlow's own
session.run (DESIGN §4c): the engine table is keyed by id, its rows read in partition order
(the SavedModel's variables and a trainer checkpoint's slices alike) and re-keyed at load
(model.json's `mod_partitions`)."""

from __future__ import annotations

import json
import re
import shutil
import time

import numpy as np
import pytest
from model_requests import MOD_IDS, mod_requests
from served import assert_served_natively, worst
from tf_helpers import run_tf, tf_predict

from recserve import Processor
from recserve.errors import CorruptVersionError, ModelLoadError
from recserve.model_spec import parse_model_spec
from recserve.model_store.table_data import TableData, mod_partition_ids

TOLERANCE = 1e-5


def test_mod_partitioned_lookups_serve_within_1e5_of_tensorflow(tmp_path):
    """A pooled lookup (safe_embedding_lookup_sparse, mean, -1 padding) and an unpooled one
    (embedding_lookup), both 'mod': from the SavedModel's variables, then from a trainer
    checkpoint holding other values (the parts as slices of one tensor), then with that
    version's incremental bundle (rows by row index). 400 requests each time."""
    run_tf("mod", str(tmp_path / "m"))
    savedmodel = tmp_path / "m" / "savedmodel"
    batches = mod_requests(250, 1, 111) + mod_requests(100, 8, 112) + mod_requests(50, 64, 113)
    want = tf_predict(savedmodel, batches, tmp_path)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        bindings = {b.input: b for b in processor._model.spec.embeddings}
        assert {k: (b.table, b.combiner, b.mod_partitions) for k, b in bindings.items()} == {
            "ids": ("mod_emb", "mean", (334, 334, 333)), "pos": ("pos_emb", "none", (4, 3, 3))}
        assert len(processor._manager.current.tables["mod_emb"]) == MOD_IDS
        assert worst(processor, batches, want) <= TOLERANCE
        assert_served_natively(processor, batches)
    finally:
        processor.close()
    prefix = str(tmp_path / "m" / "ckpt" / "1" / "model.ckpt-7")
    trained = tf_predict(savedmodel, batches, tmp_path, prefix)
    updated = tf_predict(savedmodel, batches, tmp_path, prefix, tmp_path / "m" / "incr.npz")
    assert max(float(np.abs(a - b).max()) for a, b in zip(want, trained)) > 0.01  # other values indeed
    assert max(float(np.abs(a - b).max()) for a, b in zip(trained, updated)) > 0.01
    parent = tmp_path / "checkpoints"
    shutil.copytree(tmp_path / "m" / "ckpt" / "1", parent / "1", ignore=shutil.ignore_patterns(".incremental*"))
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local",
                           "checkpoint_dir": str(parent), "model_update_interval_seconds": 0.2})
    try:
        assert processor.model_info()["global_step"] == 7
        assert worst(processor, batches, trained) <= TOLERANCE
        # Its incremental bundle's rows (row indices of the concatenated parts) land on their ids.
        shutil.copytree(tmp_path / "m" / "ckpt" / "1" / ".incremental_checkpoint",
                        parent / "1" / ".incremental_checkpoint")
        deadline = time.monotonic() + 60
        while processor.model_info()["delta_step"] != 9:
            assert time.monotonic() < deadline, processor.model_info()
            time.sleep(0.1)
        assert worst(processor, batches, updated) <= TOLERANCE
    finally:
        processor.close()


def test_mod_partition_ids_rekey_rows_in_partition_order():
    """Rows 0..6 of a variable in parts of 3, 2, 2 rows hold ids 0, 3, 6 | 1, 4 | 2, 5."""
    data = TableData(np.arange(7, dtype=np.int64), np.arange(14, dtype=np.float32).reshape(7, 2),
                     deleted=np.array([6], dtype=np.int64))
    rekeyed = mod_partition_ids(data, (3, 2, 2), "ckpt: table 't'")
    assert rekeyed.keys.tolist() == [0, 3, 6, 1, 4, 2, 5]
    assert rekeyed.deleted.tolist() == [5]
    np.testing.assert_array_equal(rekeyed.values, data.values)
    with pytest.raises(CorruptVersionError, match=re.escape("ckpt: table 't': row 7 is outside the 7 rows of its "
                                                            "partitions [3, 2, 2]")):
        mod_partition_ids(TableData(np.array([7], np.int64), np.zeros((1, 2), np.float32)), (3, 2, 2), "ckpt: table 't'")


def _spec(**binding: object) -> str:
    return json.dumps({"embeddings": [{"input": "ids", "table": "t", "dim": 4, **binding}]})


def test_mod_partitions_in_model_json_round_trip_and_bad_values_are_named():
    spec = parse_model_spec(_spec(mod_partitions=[334, 334, 333]))
    assert spec.embeddings[0].mod_partitions == (334, 334, 333)
    assert parse_model_spec(spec.dumps()) == spec
    assert "mod_partitions" not in parse_model_spec(_spec()).to_json()["embeddings"][0]
    for bad in ([5], [3, 0], "3,3", [2, True]):
        with pytest.raises(ModelLoadError, match=re.escape(f"'mod_partitions' is {bad!r}; it lists the row counts")):
            parse_model_spec(_spec(mod_partitions=bad))
    shared = {"embeddings": [{"input": "a", "table": "t", "dim": 4, "mod_partitions": [2, 2]},
                             {"input": "b", "table": "t", "dim": 4}]}
    with pytest.raises(ModelLoadError, match="different 'dim', 'default' or 'mod_partitions'"):
        parse_model_spec(json.dumps(shared))
