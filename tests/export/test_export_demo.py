import json
import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from recserve.export import string_keys
from recserve.export.demo import (
    CITIES,
    DEMO_SPEC,
    DemoModel,
    demo_dense,
    demo_graph,
    demo_tables,
    write_demo,
)
from recserve.export.reference import reference_predict
from recserve.model_store import (
    LocalStorage,
    load_checkpoint,
    load_model_dir,
    newest_complete_version,
)
from recserve.proto import predict_pb2

STORAGE = LocalStorage()
REQUEST_INPUTS = ["age", "city", "clicked_items", "hour", "item_category", "item_id", "price",
                  "query_category", "user_id"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("demo"))


def test_layout_and_config(demo):
    assert sorted(p.name for p in demo.root.iterdir()) == [
        "checkpoints", "config.json", "model", "warm_up.bin"]
    config = json.loads(demo.config_path.read_text())
    assert config == {
        "model_store_type": "local",
        "checkpoint_dir": str(demo.root / "checkpoints"),
        "savedmodel_dir": str(demo.root / "model"),
        "warmup_file_name": str(demo.root / "warm_up.bin"),
        "signature_name": "serving_default",
        "session_num": 1,
        "select_session_policy": "MOD",
        "feature_store_type": "memory",
        "omp_num_threads": 1,
        "inter_op_parallelism_threads": 1,
        "intra_op_parallelism_threads": 1,
    }
    assert demo.root.is_absolute()


def test_model_dir_and_checkpoint_load(demo, caplog):
    model_dir = load_model_dir(STORAGE, str(demo.model_dir))
    assert model_dir.spec == DEMO_SPEC
    session = ort.InferenceSession(model_dir.onnx_path, providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in session.get_inputs()) == sorted(
        [b.graph_input for b in DEMO_SPEC.embeddings] + ["age", "price", "hour"])
    assert [o.name for o in session.get_outputs()] == ["prob", "logit"]

    log = logging.getLogger("test.demo")
    ref, manifest = newest_complete_version(STORAGE, str(demo.checkpoint_dir), log=log)
    assert (ref.name, ref.global_step) == ("1", 1)
    ckpt = load_checkpoint(STORAGE, ref, manifest)
    assert {name: len(t.keys) for name, t in ckpt.tables.items()} == {
        "category": 60, "city": 43, "item": 4000, "item_history": 2500, "user": 3000}
    assert all(t.dim == 8 for t in ckpt.tables.values())
    user_keys = np.sort(ckpt.tables["user"].keys)
    assert np.any(np.diff(user_keys) > 1)  # non-contiguous
    graph_w3 = numpy_helper.to_array(
        next(t for t in demo_graph().graph.initializer if t.name == "deep_w3"))
    assert ckpt.dense["deep_w3"].shape == graph_w3.shape
    assert not np.allclose(ckpt.dense["deep_w3"], graph_w3)
    assert [b.default.kind for b in DEMO_SPEC.embeddings] == ["normal"] + ["zeros"] * 5


def test_demo_is_deterministic(demo, tmp_path):
    again = write_demo(tmp_path / "again")
    for rel in ("model/model.onnx", "model/model.json", "checkpoints/1/MANIFEST.json",
                "warm_up.bin"):
        assert (again.root / rel).read_bytes() == (demo.root / rel).read_bytes(), rel


def test_sample_inputs_cover_unknown_keys_padding_and_strings(demo):
    inputs = demo.sample_inputs(64, np.random.default_rng(5))
    assert sorted(inputs) == REQUEST_INPUTS
    assert inputs["clicked_items"].shape == (64, 5) and inputs["clicked_items"].dtype == np.int64
    assert inputs["age"].shape == (64, 1) and inputs["age"].dtype == np.float32
    tables = demo_tables()
    for name, table in [("user_id", "user"), ("item_id", "item"), ("item_category", "category")]:
        known = np.isin(inputs[name], tables[table].keys)
        assert known.any() and not known.all(), name
    clicks = inputs["clicked_items"]
    assert (clicks == -1).any() and (clicks == -1).all(axis=1).any()
    assert not np.isin(clicks[clicks != -1], tables["item_history"].keys).all()
    cities = set(inputs["city"].tolist())
    assert b"" in cities and b"atlantis" in cities and cities & {c.encode() for c in CITIES}


def _numpy_forward(inputs, tables, weights):
    """The demo graph computed again in numpy: gathers by dict, MLP by matmul."""
    def gather(name, ids):
        rows = dict(zip(tables[name].keys.tolist(), tables[name].values))
        zeros = np.zeros(8, np.float32)
        found = [rows.get(k, zeros) for k in ids.reshape(-1).tolist()]  # -1 is never a key
        return np.array(found, dtype=np.float32).reshape(*ids.shape, 8)

    clicks = inputs["clicked_items"]
    count = (clicks != -1).sum(axis=1, keepdims=True)
    clicked = gather("item_history", clicks).sum(axis=1) / np.maximum(count, 1)
    dense = np.concatenate([inputs["age"], inputs["price"], inputs["hour"]], axis=1)
    features = np.concatenate([
        gather("user", inputs["user_id"]), gather("item", inputs["item_id"]), clicked,
        gather("city", string_keys(inputs["city"].tolist())),
        gather("category", inputs["query_category"]), gather("category", inputs["item_category"]),
        (dense - weights["dense_mean"]) / weights["dense_std"]], axis=1)
    h = np.maximum(features @ weights["deep_w1"] + weights["deep_b1"], 0)
    h = np.maximum(h @ weights["deep_w2"] + weights["deep_b2"], 0)
    wide = features @ weights["wide_w"] + weights["wide_b"]
    logit = h @ weights["deep_w3"] + weights["deep_b3"] + wide
    return 1 / (1 + np.exp(-logit)), logit


def test_reference_matches_a_numpy_forward_pass_with_the_dense_override(demo):
    inputs = demo.sample_inputs(32, np.random.default_rng(11))
    known_users = np.isin(inputs["user_id"], demo_tables()["user"].keys)
    out = reference_predict(demo.root, demo.checkpoint_dir, inputs)
    assert sorted(out) == ["logits", "probabilities"]
    assert out["probabilities"].shape == (32, 1) and out["probabilities"].dtype == np.float32
    graph_weights = {t.name: numpy_helper.to_array(t) for t in demo_graph().graph.initializer}
    # Unknown users get the normal default in serving; compare the rows with known users.
    prob, logit = _numpy_forward(inputs, demo_tables(), {**graph_weights, **demo_dense()})
    np.testing.assert_allclose(out["logits"][known_users], logit[known_users],
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["probabilities"][known_users], prob[known_users], atol=1e-6)
    graph_only, _ = _numpy_forward(inputs, demo_tables(), graph_weights)
    assert not np.allclose(graph_only[known_users], prob[known_users], atol=1e-3)
    prob = out["probabilities"]
    assert prob.std() > 0.05 and np.all((prob > 0) & (prob < 1))


def test_warmup_file_is_one_predict_request(demo):
    request = predict_pb2.PredictRequest.FromString(demo.warmup_path.read_bytes())
    assert sorted(request.inputs) == REQUEST_INPUTS
    assert list(request.inputs["clicked_items"].array_shape.dim) == [8, 5]
    assert request.inputs["city"].dtype == predict_pb2.DT_STRING
    expected = DemoModel(demo.root).sample_inputs(8, np.random.default_rng(20240604))
    assert list(request.inputs["user_id"].int64_val) == expected["user_id"].tolist()
