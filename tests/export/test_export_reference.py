"""The reference computation itself, on a graph that passes its embedding inputs through,
so every lookup, pooling and default rule is checked against numbers worked out by hand."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.embedding import _pure, default_vectors
from recserve.export import TableData, string_key, write_checkpoint, write_delta, write_model_dir
from recserve.export.reference import default_rows, reference_predict, splitmix64
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec
from recserve.wire.codec import decode_response, encode_request

DIM = 2
NORMAL = DefaultSpec(kind="normal", stddev=0.5, seed=3)
BINDINGS = (
    EmbeddingBinding("id", "u", DIM, "id_emb", default=NORMAL),
    EmbeddingBinding("bag_sum", "t", DIM, "sum_emb", combiner="sum"),
    EmbeddingBinding("bag_mean", "t", DIM, "mean_emb", combiner="mean"),
    EmbeddingBinding("bag_sqrtn", "t", DIM, "sqrtn_emb", combiner="sqrtn"),
    EmbeddingBinding("bag_none", "t", DIM, "none_emb"),
    EmbeddingBinding("city", "cities", DIM, "city_emb", key_dtype="string"),
)
ROWS = {10: [1.0, 2.0], 20: [3.0, 5.0], 30: [-4.0, 0.5]}


def _passthrough_model():
    nodes, inputs, outputs = [], [], []
    for b in BINDINGS:
        shape = ["b", "l", DIM] if b.input == "bag_none" else ["b", DIM]
        inputs.append(helper.make_tensor_value_info(b.graph_input, TensorProto.FLOAT, shape))
        outputs.append(helper.make_tensor_value_info(b.input, TensorProto.FLOAT, shape))
        nodes.append(helper.make_node("Identity", [b.graph_input], [b.input]))
    inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", DIM]))
    outputs.append(helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["b", DIM]))
    nodes.append(helper.make_node("Mul", ["x", "scale"], ["scaled"]))
    scale = numpy_helper.from_array(np.array([2.0, 3.0], dtype=np.float32), "scale")
    graph = helper.make_graph(nodes, "passthrough", inputs, outputs, [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.fixture
def model(tmp_path):
    write_model_dir(tmp_path / "model", _passthrough_model(), ModelSpec(embeddings=BINDINGS))
    keys = np.array(list(ROWS), dtype=np.int64)
    values = np.array(list(ROWS.values()), dtype=np.float32)
    cities = TableData(np.array([string_key("paris")], dtype=np.int64),
                       np.array([[7.0, 8.0]], dtype=np.float32))
    tables = {"t": (keys, values), "u": (keys, values), "cities": cities}
    version = write_checkpoint(tmp_path / "ckpt", tables,
                               global_step=1, dense={"scale": np.array([-1, 10], np.float32)})
    return tmp_path / "model", version


def _inputs(**overrides):
    bag = np.array([[10, 20, -1], [30, 999, -1], [-1, -1, -1]], dtype=np.int64)
    inputs = {
        "id": np.array([20, 12345, -1], dtype=np.int64),
        "bag_sum": bag, "bag_mean": bag, "bag_sqrtn": bag, "bag_none": bag,
        "city": np.array([b"paris", b"", "atlantis"], dtype=object),
        "x": np.ones((3, DIM), dtype=np.float32),
    }
    return {**inputs, **overrides}


def test_lookups_pooling_defaults_and_dense_override(model):
    model_dir, version = model
    out = reference_predict(model_dir, version.parent, _inputs())
    unknown = default_vectors(NORMAL, np.array([12345], dtype=np.int64), DIM)[0]
    np.testing.assert_array_equal(out["id"], [ROWS[20], unknown, [0, 0]])
    np.testing.assert_array_equal(out["bag_sum"], [[4, 7], [-4, 0.5], [0, 0]])
    np.testing.assert_array_equal(out["bag_mean"], [[2, 3.5], [-2, 0.25], [0, 0]])
    np.testing.assert_allclose(out["bag_sqrtn"],
                               [[4 / 2**0.5, 7 / 2**0.5], [-4 / 2**0.5, 0.5 / 2**0.5], [0, 0]],
                               rtol=1e-6)
    np.testing.assert_array_equal(
        out["bag_none"],
        [[ROWS[10], ROWS[20], [0, 0]], [ROWS[30], [0, 0], [0, 0]], [[0, 0]] * 3])
    np.testing.assert_array_equal(out["city"], [[7, 8], [0, 0], [0, 0]])
    np.testing.assert_array_equal(out["scaled"], [[-1, 10]] * 3)  # dense.safetensors wins


def test_without_a_checkpoint_the_graph_values_serve(model):
    model_dir, _ = model
    out = reference_predict(model_dir, None, _inputs())
    np.testing.assert_array_equal(out["scaled"], [[2, 3]] * 3)
    np.testing.assert_array_equal(out["bag_sum"], np.zeros((3, DIM)))


def test_deltas_upsert_and_delete_rows_in_step_order(model):
    model_dir, version = model
    write_delta(version, {"u": TableData(np.array([20, 40], np.int64),
                                         np.array([[0, 1], [9, 9]], np.float32),
                                         deleted=np.array([10], np.int64))}, global_step=2)
    write_delta(version, {"u": (np.array([20], np.int64), np.array([[6, 6]], np.float32))},
                global_step=3)
    ids = np.array([10, 20, 40], dtype=np.int64)
    out = reference_predict(model_dir, version, _inputs(id=ids))
    deleted_default = default_vectors(NORMAL, np.array([10], dtype=np.int64), DIM)[0]
    np.testing.assert_array_equal(out["id"], [deleted_default, [6, 6], [9, 9]])
    out = reference_predict(model_dir, version, _inputs(id=ids), apply_deltas=False)
    np.testing.assert_array_equal(out["id"][:2], [ROWS[10], ROWS[20]])


def test_plain_model_table_replaces_initializer_rows(tmp_path):
    weight = numpy_helper.from_array(np.zeros((4, DIM), dtype=np.float32), "emb.weight")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb.weight", "idx"], ["y"])], "plain",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["b"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", DIM])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    (tmp_path / "m").mkdir()
    onnx.save_model(model, tmp_path / "m" / "model.onnx")
    write_checkpoint(tmp_path / "ckpt", {"emb.weight": (np.array([2], np.int64),
                                                        np.array([[5, 6]], np.float32))},
                     global_step=1)
    out = reference_predict(tmp_path / "m", tmp_path / "ckpt", {"idx": np.array([2, 0])})
    np.testing.assert_array_equal(out["y"], [[5, 6], [0, 0]])


def test_default_rows_are_the_documented_algorithm_with_pinned_values():
    """The reference derives default rows from the docstring's algorithm on its own; fixed
    values pin it, so a change in the reference or in either engine shows here."""
    # SplitMix64's first outputs from state 0 (Vigna's splitmix64.c): the published sequence.
    states = np.array([0, 0x9E3779B97F4A7C15, 2 * 0x9E3779B97F4A7C15 % 2**64], dtype=np.uint64)
    assert [int(v) for v in splitmix64(states)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    keys = np.array([0, 1, -5, 2**62], dtype=np.int64)
    pinned = np.array([
        [0.80490696, 0.5854089, -0.08168331],
        [-0.6028708, -1.1352242, 0.94737375],
        [1.2279465, 0.6504571, -0.08470652],
        [-0.3704584, -1.0709041, -0.81414956],
    ], dtype=np.float32)
    spec = DefaultSpec(kind="normal", stddev=1.0, seed=7)
    np.testing.assert_array_equal(default_rows(1.0, 7, keys, 3), pinned)
    np.testing.assert_array_equal(default_vectors(spec, keys, 3), pinned)  # the engine in use
    np.testing.assert_array_equal(_pure.default_vectors(spec, keys, 3), pinned)  # its Python twin
    # The seed is taken modulo 2**64, stddev scales the doubles before the rounding.
    np.testing.assert_array_equal(default_rows(0.01, 2**64 + 7, keys[:1], 3),
                                  np.array([[0.00804907, 0.0058540893, -0.00081683305]], dtype=np.float32))
    # Many keys, odd dim: the reference and the engine agree bit for bit.
    many = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 2000)
    np.testing.assert_array_equal(default_rows(0.5, 42, many, 17),
                                  default_vectors(DefaultSpec(kind="normal", stddev=0.5, seed=42), many, 17))


def test_rows_defaults_are_row_key_mod_k_of_the_file_and_the_processor_agrees(tmp_path):
    """`{"rows": file}`: the reference reads the .npy itself; numbers worked out by hand, and
    the Processor (the engine) serves the same through the whole model."""
    from recserve import Processor

    matrix = np.array([[1, 1], [2, 2], [3, 3]], dtype=np.float32)
    rows = DefaultSpec(kind="rows", rows_file="defaults/t.npy", matrix=matrix)
    bindings = tuple(EmbeddingBinding(b.input, b.table, DIM, b.graph_input, combiner=b.combiner, key_dtype=b.key_dtype,
                                      default=rows if b.table == "t" else b.default) for b in BINDINGS)
    model_dir = write_model_dir(tmp_path / "model", _passthrough_model(), ModelSpec(embeddings=bindings))
    keys = np.array(list(ROWS), dtype=np.int64)
    values = np.array(list(ROWS.values()), dtype=np.float32)
    cities = TableData(np.array([string_key("paris")], dtype=np.int64), np.array([[7.0, 8.0]], dtype=np.float32))
    version = write_checkpoint(tmp_path / "ckpt", {"t": (keys, values), "u": (keys, values), "cities": cities},
                               global_step=1)
    bag = np.array([[10, 4, -1], [-5, 999, -1], [-1, -1, -1]], dtype=np.int64)  # 4 % 3 = 1, -5 % 3 = 1, 999 % 3 = 0
    inputs = _inputs(bag_sum=bag, bag_mean=bag, bag_sqrtn=bag, bag_none=bag)
    out = reference_predict(model_dir, version.parent, inputs)
    np.testing.assert_array_equal(out["bag_none"], [[[1, 2], [2, 2], [0, 0]], [[2, 2], [1, 1], [0, 0]],
                                                    [[0, 0], [0, 0], [0, 0]]])
    np.testing.assert_array_equal(out["bag_sum"], [[3, 4], [3, 3], [0, 0]])
    np.testing.assert_array_equal(out["bag_mean"], [[1.5, 2], [1.5, 1.5], [0, 0]])
    processor = Processor({"savedmodel_dir": str(model_dir), "checkpoint_dir": str(version.parent)})
    try:
        served = processor.predict(inputs)
        for name in ("bag_none", "bag_sum", "bag_mean", "bag_sqrtn", "id", "city"):
            np.testing.assert_array_equal(served[name], out[name])
    finally:
        processor.close()


def test_integer_vocabulary_keys_by_hand_and_the_processor_agrees(tmp_path):
    """`"key_dtype": "int64"` with a vocabulary: an id's key is its index (+ start), others the
    default; -1 padding; the Processor (IntegerKeys: the native route after a layout's first request)
    serves the same."""
    from recserve import Processor

    vocabulary = (7_000_000_000, None, 5)  # keys 10, 11 (no id), 12
    bindings = tuple(EmbeddingBinding(b.input, b.table, DIM, b.graph_input, combiner=b.combiner, key_dtype=b.key_dtype,
                                      default=b.default, vocabulary=vocabulary if b.table == "t" else (),
                                      vocabulary_start=10 if b.table == "t" else 0,
                                      default_id=30 if b.table == "t" else -1) for b in BINDINGS)
    model_dir = write_model_dir(tmp_path / "model", _passthrough_model(), ModelSpec(embeddings=bindings))
    keys = np.array([10, 12, 30], dtype=np.int64)
    values = np.array([[1.0, 2.0], [3.0, 5.0], [-4.0, 0.5]], dtype=np.float32)
    version = write_checkpoint(tmp_path / "ckpt", {"t": (keys, values), "u": (keys, values), "cities": (
        np.array([1], np.int64), np.ones((1, DIM), np.float32))}, global_step=1)
    bag = np.array([[7_000_000_000, 5, -1], [4, 10, -1], [-1, -1, -1]], dtype=np.int64)  # 4, 10: unknown -> key 30
    inputs = _inputs(bag_sum=bag, bag_mean=bag, bag_sqrtn=bag, bag_none=bag)
    out = reference_predict(model_dir, version.parent, inputs)
    np.testing.assert_array_equal(out["bag_none"], [[[1, 2], [3, 5], [0, 0]], [[-4, 0.5], [-4, 0.5], [0, 0]],
                                                    [[0, 0], [0, 0], [0, 0]]])
    np.testing.assert_array_equal(out["bag_sum"], [[4, 7], [-8, 1], [0, 0]])
    processor = Processor({"savedmodel_dir": str(model_dir), "checkpoint_dir": str(version.parent)})
    try:
        for _ in range(3):  # by predict, and by bytes: the first request of a layout, then its route
            status, body = processor.process(encode_request(inputs))
            assert status == 200, body
            for served in (processor.predict(inputs), decode_response(body)):
                for name in ("bag_none", "bag_sum", "bag_mean", "bag_sqrtn", "id"):
                    np.testing.assert_array_equal(served[name], out[name])
        native = processor.model_info()["native_route"]
        assert native["served"] >= 2 and native["fallbacks"]["not_native"] == 0, native
    finally:
        processor.close()
