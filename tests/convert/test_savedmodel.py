"""A TensorFlow SavedModel in savedmodel_dir, served as it is (DESIGN §4c): a TF1
feature-column model written by real TensorFlow (tf_model.py: hashed strings, an identity
column partitioned in 2, ''-padded multi-valued strings pooled by sqrtn, two numerics, a
DNN; trainer checkpoints with Adagrad slots), against TensorFlow's own session.run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from model_requests import CITY_FILE_WORDS, COLORS, requests, vocab_oov_requests, vocab_requests
from served import assert_served_natively, worst
from tf_helpers import run_tf, tf_predict

from recserve import Processor
from recserve.convert import converted_model_dir
from recserve.errors import ModelLoadError
from recserve.model_store import LocalStorage, load_model_dir
from recserve.server.cli import main as cli_main
from recserve.wire.codec import decode_response, encode_request

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5
TABLES = {"input_layer/city_embedding/embedding_weights": (1000, 8),
          "input_layer/tags_embedding/embedding_weights": (500, 8),
          "item_scope/input_layer/item_embedding/embedding_weights": (5000, 16)}


def _batches(seed: int) -> list[dict[str, np.ndarray]]:
    """202 requests at batch 1, 8 and 64, with unseen strings, '' and -1 ids."""
    return requests(150, 1, seed) + requests(40, 8, seed + 1) + requests(12, 64, seed + 2)


def _config(tf_model: Path, **fields: object) -> dict[str, object]:
    return {"savedmodel_dir": str(tf_model / "savedmodel"), "model_store_type": "local", **fields}


def test_savedmodel_serves_within_1e5_of_tensorflow(tf_model, tmp_path):
    batches = _batches(11)
    assert any(str(w).startswith("w") for b in batches for w in b["city"])  # strings TF never saw in training
    want = tf_predict(tf_model / "savedmodel", batches, tmp_path)
    # Other test modules of this process may have imported TensorFlow already (then only
    # test_recserve_convert_checks_parity_and_its_output_serves_without_tensorflow shows it).
    had_tensorflow = "tensorflow" in sys.modules
    processor = Processor(_config(tf_model))
    try:
        assert worst(processor, batches, want) <= TOLERANCE
        assert_served_natively(processor, batches)
        # By tensor name, with an output filter by tensor name, as DeepRec's processor accepts.
        named = {f"{k}:0": v for k, v in batches[0].items()}
        status, body = processor.process(encode_request(named, output_filter=["prob:0"]))
        assert status == 200, body
        np.testing.assert_allclose(decode_response(body)["prob:0"], want[0], atol=TOLERANCE, rtol=0)
        # The signature probe describes the SavedModel's signature.
        status, body = processor.process(b"")
        probe = json.loads(body)
        assert sorted(probe["inputs"]) == ["age", "city", "item", "price", "tags"]
        assert probe["outputs"]["prob"]["dtype"] == "float32"
        # The lookups run in recserve's engine: no table is left in the served ONNX graph.
        model = onnx.load(processor._model.onnx_path)
        largest = max(int(np.prod(t.dims)) for t in model.graph.initializer)
        assert largest < min(rows * dim for rows, dim in TABLES.values())
        assert {t.name: t.dim for t in processor._manager.current.tables.values()} == {
            name: dim for name, (_, dim) in TABLES.items()}
    finally:
        processor.close()
    assert had_tensorflow or "tensorflow" not in sys.modules  # converted in a subprocess; served without it


def _copy_version(source: Path, target: Path) -> None:
    """A checkpoint version arriving as a trainer writes it: bundles first, the state file last."""
    target.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name != "checkpoint":
            shutil.copy(path, target / path.name)
    shutil.copy(source / "checkpoint", target / "checkpoint")


def _wait(processor: Processor, key: str, value: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while processor.model_info()[key] != value:
        assert time.monotonic() < deadline, processor.model_info()
        time.sleep(0.1)


def test_checkpoint_versions_and_an_incremental_one_serve_without_converting_again(tf_model, tmp_path):
    """DeepRec's config: checkpoint_dir = the trainer's checkpoint parent, read by the graph's
    own variable names (sliced partitioned variables and Adagrad slots included)."""
    batches = requests(30, 4, 21)
    ckpt = tf_model / "ckpt"
    first = tf_predict(tf_model / "savedmodel", batches, tmp_path, str(ckpt / "1" / "model.ckpt-3"))
    second = tf_predict(tf_model / "savedmodel", batches, tmp_path, str(ckpt / "2" / "model.ckpt-6"))
    incremental = tf_predict(tf_model / "savedmodel", batches, tmp_path, str(ckpt / "2" / "model.ckpt-6"),
                             tf_model / "incr.npz")
    assert max(float(np.abs(a - b).max()) for a, b in zip(first, second)) > 1e-3  # the versions differ
    parent = tmp_path / "checkpoints"
    _copy_version(ckpt / "1", parent / "1")
    processor = Processor(_config(tf_model, checkpoint_dir=str(parent), model_update_interval_seconds=0.2))
    try:
        assert processor.model_info()["version"] == "1"
        assert worst(processor, batches, first) <= TOLERANCE
        onnx_path = processor._model.onnx_path
        _copy_version(ckpt / "2", parent / "2")
        _wait(processor, "version", "2")
        assert worst(processor, batches, second) <= TOLERANCE
        shutil.copytree(ckpt / "2" / ".incremental_checkpoint", parent / "2" / ".incremental_checkpoint")
        _wait(processor, "delta_step", 11)
        assert worst(processor, batches, incremental) <= TOLERANCE
        assert processor._model.onnx_path == onnx_path  # the same conversion throughout
    finally:
        processor.close()


def test_a_dir_with_both_a_savedmodel_and_a_recserve_model_is_refused(tf_model, tmp_path):
    both = tmp_path / "both"
    shutil.copytree(tf_model / "savedmodel", both)
    (both / "model.onnx").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"holds both a TensorFlow SavedModel \(saved_model.pb\) and a recserve "
                                             r"model \(model.onnx\)"):
        load_model_dir(LocalStorage(), str(both))


def _hide_tensorflow(directory: Path) -> str:
    """A PYTHONPATH entry under which `import tensorflow` fails as on a host without it."""
    package = directory / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'tensorflow'\")\n")
    return str(directory)


def test_without_tensorflow_the_load_fails_naming_both_ways(tf_model, tmp_path, monkeypatch):
    monkeypatch.setenv("RECSERVE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PYTHONPATH", _hide_tensorflow(tmp_path / "no-tf"))
    with pytest.raises(ModelLoadError) as err:
        load_model_dir(LocalStorage(), str(tf_model / "savedmodel"))
    message = err.value.message
    assert "\n" not in message
    assert "pip install 'recserve[tensorflow]'" in message
    assert f"recserve convert {tf_model / 'savedmodel'} OUT_DIR" in message


def test_recserve_convert_checks_parity_and_its_output_serves_without_tensorflow(tf_model, tmp_path, capsys):
    out = tmp_path / "converted"
    assert cli_main(["convert", str(tf_model / "savedmodel"), str(out), "--check", "60"]) == 0
    report = capsys.readouterr().out
    line = next(s for s in report.splitlines() if s.startswith("parity: 60 requests"))
    assert float(line.rsplit("= ", 1)[1]) <= TOLERANCE, report
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.onnx", "variables"]
    # An existing OUT_DIR is refused and left as it was.
    assert cli_main(["convert", str(tf_model / "savedmodel"), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.onnx", "variables"]
    batches = requests(5, 3, 31)
    want = tf_predict(tf_model / "savedmodel", batches, tmp_path)
    np.savez(tmp_path / "req.npz", **{f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()})
    child = (
        "import sys, json, numpy as np\n"
        "from recserve import Processor\n"
        "p = Processor({'savedmodel_dir': sys.argv[1], 'model_store_type': 'local'})\n"
        "data = np.load(sys.argv[2], allow_pickle=True)\n"
        f"out = [p.predict({{k: data[f'{{i}}/{{k}}'] for k in ('city', 'item', 'tags', 'age', 'price')}})['prob']"
        f".tolist() for i in range({len(batches)})]\n"
        "assert 'tensorflow' not in sys.modules or sys.modules['tensorflow'] is None\n"
        "print(json.dumps(out))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), _hide_tensorflow(tmp_path / "no-tf")]))
    done = subprocess.run([sys.executable, "-c", child, str(out), str(tmp_path / "req.npz")], capture_output=True,
                          text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(float(np.abs(np.array(g) - w).max()) for g, w in zip(got, want)) <= TOLERANCE


def test_a_conversion_off_by_more_than_1e5_is_refused_naming_the_worst_input(tf_model, tmp_path):
    out = tmp_path / "converted"
    shutil.copytree(converted_model_dir(str(tf_model / "savedmodel")), out)  # the session's cached conversion
    spec = json.loads((out / "model.json").read_text())
    spec["embeddings"][0]["buckets"] += 1  # a wrong hash: every string in another bucket
    (out / "model.json").write_text(json.dumps(spec))
    child = ("import sys\nfrom recserve.convert.parity import check_parity\nfrom recserve.errors import ModelLoadError\n"
             "try:\n    check_parity(sys.argv[1], sys.argv[2], 'serving_default', 20)\n"
             "except ModelLoadError as exc:\n    print(exc.message)\n")
    done = subprocess.run([sys.executable, "-c", child, str(tf_model / "savedmodel"), str(out)], capture_output=True,
                          text=True, timeout=300, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the conversion differs from TensorFlow by" in done.stdout
    assert "worst request: {'age'" in done.stdout or "worst request: {" in done.stdout


def test_a_deeprec_embedding_variable_graph_is_converted_and_served(tf_model, tmp_path):
    """DeepRec cannot be installed here: tf_model.rewrite_to_ev writes DeepRec's EV ops into the
    GraphDef by hand (KvVarHandleOp + InitializeKvVariableOp + KvResourceGather with the attrs
    of DeepRec's op registry; `city` an EV, `item` an EV partitioned in 2) and saves the EVs as
    DeepRec does (-keys/-values, city's even ids only). city's default matrix is a seeded
    N(0, 1) initializer subgraph [4, 8]: an odd (never stored) id gets its row id % 4, as
    DeepRec's gather answers. TensorFlow cannot run that graph; the reference is the original
    graph with those ids' rows set to D[id % 4] (D as TensorFlow computes the initializer)."""
    ev_dir = tmp_path / "ev"
    run_tf("evgraph", str(tf_model / "savedmodel"), str(ev_dir))
    batches = requests(40, 8, 41)
    want = tf_predict(tf_model / "savedmodel", batches, tmp_path, rows=Path(f"{ev_dir}.missing.npz"))
    processor = Processor({"savedmodel_dir": str(ev_dir), "model_store_type": "local"})
    try:
        tables = processor._manager.current.tables
        assert {name: t.dim for name, t in tables.items()} == {name: dim for name, (_, dim) in TABLES.items()}
        city = tables["input_layer/city_embedding/embedding_weights"]
        assert len(city) == 500  # the EV's even ids
        defaults = {b.table: b.default for b in processor._model.spec.embeddings}
        city_default = defaults["input_layer/city_embedding/embedding_weights"]
        matrix = np.load(f"{ev_dir}.default.npy")
        assert matrix.shape == (4, 8) and matrix.any()
        assert city_default.kind == "rows"
        np.testing.assert_array_equal(np.load(Path(processor._model.root, city_default.rows_file)), matrix)
        assert defaults["item_scope/input_layer/item_embedding/embedding_weights"].kind == "zeros"  # a zeros matrix
        odd = np.array([1, 3, 6, 7, 998, 999], dtype=np.int64)  # 6, 998: stored
        want_rows = np.where((odd % 2 == 1)[:, None], matrix[odd % 4], 0)
        got = city.lookup(odd)
        np.testing.assert_array_equal(got[odd % 2 == 1], want_rows[odd % 2 == 1])
        assert worst(processor, batches, want) <= TOLERANCE
    finally:
        processor.close()
    from recserve.convert import run_conversion

    report = run_conversion(str(ev_dir), str(tmp_path / "out"))  # `recserve convert`'s own report
    assert "warning: Embedding Variable" not in report
    assert ("lookup 'city' -> table 'input_layer/city_embedding/embedding_weights' (dim 8, mean; missing ids: row "
            "id mod 4 of defaults/input_layer_city_embedding_embedding_weights.npy)") in report.splitlines()


def test_ev_defaults_recserve_cannot_reproduce_are_warned_about_and_stay_zeros(tf_model, tmp_path):
    """city's default matrix needs a feed; item's gathers read their default by the id's
    position in the batch (ev_init_value): the conversion keeps "zeros" and says why, per EV."""
    from recserve.convert import run_conversion

    ev_dir = tmp_path / "ev"
    run_tf("evgraph", str(tf_model / "savedmodel"), str(ev_dir), "unservable")
    report = run_conversion(str(ev_dir), str(tmp_path / "out"))
    warnings = sorted(line for line in report.splitlines() if line.startswith("warning: Embedding Variable"))
    city, item = "input_layer/city_embedding/embedding_weights", "item_scope/input_layer/item_embedding/embedding_weights"
    assert warnings == [
        (f"warning: Embedding Variable '{city}': DeepRec answers an id it never stored with a default row; recserve "
         f"answers zeros: its default matrix '{city}/ev_default/mul:0' cannot be computed without serving: it reads "
         f"Placeholder '{city}/ev_default/scale'"),
        (f"warning: Embedding Variable '{item}': DeepRec answers an id it never stored with a default row; recserve "
         f"answers zeros: its gather 'item_scope/input_layer/item_embedding/item_embedding_weights/"
         "embedding_lookup_sparse/embedding_lookup/Gather' reads default_value "
         f"'{item}/part_0/gather_default_value' by the id's position in the batch (is_use_default_value_tensor, "
         "ev_init_value), not by id"),
    ]
    spec = json.loads((tmp_path / "out" / "model.json").read_text())
    assert {b["table"]: b["default"] for b in spec["embeddings"]}[city] == "zeros"
    assert {b["table"]: b["default"] for b in spec["embeddings"]}[item] == "zeros"
    assert not (tmp_path / "out" / "defaults").exists()


def test_vocabulary_list_columns_are_converted(tmp_path):
    """categorical_column_with_vocabulary_list (HashTableV2 + LookupTableFindV2): a string's id
    is its index; unknown strings are dropped like '' (TF prunes their -1), so a mean over
    [known, unknown] is the known row alone. Beside them, a plain tf.nn.embedding_lookup
    whose [batch, 2, dim] rows the graph sums over the slots: the engine pools that sum
    itself (combiner sum, cut after the reduce_sum)."""
    savedmodel = tmp_path / "vocab"
    run_tf("vocab", str(savedmodel))
    batches = vocab_requests(100, 1, 61) + vocab_requests(60, 8, 62)
    want = tf_predict(savedmodel, batches, tmp_path)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        bindings = {b.input: b for b in processor._model.spec.embeddings}
        assert {k: len(b.vocabulary) for k, b in bindings.items()} == {"color": 4, "words": 50, "slot": 0}
        assert (bindings["slot"].table, bindings["slot"].combiner) == ("slot_emb", "sum")
        assert worst(processor, batches, want) <= TOLERANCE
    finally:
        processor.close()


def test_vocabulary_columns_with_oov_buckets_default_values_and_files_are_converted(tmp_path):
    """categorical_column_with_vocabulary_list with num_oov_buckets (an unknown string's id is
    len(vocabulary) + Fingerprint64 mod k) and with default_value (unknown strings get that
    id and count in the mean; '' stays padding), and _with_vocabulary_file with
    num_oov_buckets, its file read from the SavedModel's assets/ (the trainer's copy is gone)."""
    savedmodel = tmp_path / "vocab_oov"
    run_tf("vocab_oov", str(savedmodel))
    assert not Path(f"{savedmodel}.cities.txt").exists() and (savedmodel / "assets" / "vocab_oov.cities.txt").is_file()
    batches = vocab_oov_requests(120, 1, 81) + vocab_oov_requests(60, 8, 82) + vocab_oov_requests(20, 64, 83)
    want = tf_predict(savedmodel, batches, tmp_path)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        bindings = {b.input: b for b in processor._model.spec.embeddings}
        color, words, city = bindings["color"], bindings["words"], bindings["city"]
        assert (list(color.vocabulary), color.oov_buckets, color.oov_start) == (COLORS, 3, len(COLORS))
        assert (len(words.vocabulary), words.default_id, words.oov_buckets) == (50, 7, 0)
        assert (list(city.vocabulary), city.oov_buckets, city.oov_start) == (CITY_FILE_WORDS, 2, 5)
        assert all(b.empty_is_padding for b in bindings.values())  # feature columns drop ''
        assert worst(processor, batches, want) <= TOLERANCE
    finally:
        processor.close()


def test_shared_embedding_columns_read_one_table_from_two_inputs(tmp_path):
    """shared_embedding_columns: two lookups (two inputs, -1 padded, mean) of one variable
    become two bindings of one engine table."""
    savedmodel = tmp_path / "shared"
    run_tf("shared", str(savedmodel))
    rng = np.random.default_rng(91)
    batches = [{"clicked": rng.integers(-1, 100, (n, 3)).astype(np.int64),
                "bought": rng.integers(-1, 100, (n, 3)).astype(np.int64),
                "x": rng.normal(0, 1, n).astype(np.float32)} for n in [1] * 120 + [8] * 60 + [64] * 20]
    want = tf_predict(savedmodel, batches, tmp_path)
    processor = Processor({"savedmodel_dir": str(savedmodel), "model_store_type": "local"})
    try:
        tables = {b.input: b.table for b in processor._model.spec.embeddings}
        assert tables == dict.fromkeys(["clicked", "bought"], "input_layer/bought_clicked_shared_embedding/embedding_weights")
        assert list(processor._manager.current.tables) == [tables["clicked"]]
        assert worst(processor, batches, want) <= TOLERANCE
        assert_served_natively(processor, batches)
    finally:
        processor.close()
