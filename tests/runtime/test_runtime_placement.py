"""Device placement rewrite: tables leave the graph, ids are computed on the CPU, and the
dense graph fed with numpy-gathered rows gives the original model's outputs.

The fixtures are torch exports committed with the script that made them
(tests/fixtures/torch/make_fixtures.py); torch itself is not needed here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.runtime.placed_inputs import PlacedInputs
from recserve.runtime.placement import TableLookup, place_embeddings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "torch"


TABLES: dict[str, set[str]] = {
    "embedding_torchscript.onnx": {"user.weight", "item.weight"},
    "embedding_dynamo.onnx": {"user.weight", "item.weight"},
    "embedding_bag_torchscript.onnx": {"tags.weight", "cats.weight"},
    "embedding_bag_dynamo.onnx": {"tags.weight", "cats.weight"},
    "float_input_ctr.onnx": {"shared.weight", "other.weight"},
}


def _session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("fixture", sorted(TABLES))
def test_placed_model_equals_the_original(fixture: str, tmp_path: Path, torch_requests) -> None:
    request, tables = torch_requests[fixture], TABLES[fixture]
    placed = place_embeddings(str(FIXTURES / fixture), str(tmp_path))
    assert set(placed.tables) == tables and placed.kept == {}
    original = onnx.load(str(FIXTURES / fixture))
    weights = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    for name, rows in placed.tables.items():
        np.testing.assert_array_equal(rows, weights[name])
    dense = onnx.load(placed.dense_model_path)
    assert not {t.name for t in dense.graph.initializer} & tables
    reference, rewritten, inputs = _session(str(FIXTURES / fixture)), _session(placed.dense_model_path), PlacedInputs(placed)
    rng = np.random.default_rng(7)
    for batch in (1, 3, 64):
        feeds = request(rng, batch)
        expected = reference.run(None, feeds)
        got = rewritten.run(None, inputs.dense_feeds(feeds, lambda table, ids: np.take(placed.tables[table], ids, axis=0)))
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert a.shape == b.shape and float(np.abs(a - b).max()) <= 1e-6


def test_plain_ids_need_no_cpu_graph_and_leave_the_ids_out_of_the_dense_graph(tmp_path: Path) -> None:
    placed = place_embeddings(str(FIXTURES / "embedding_torchscript.onnx"), str(tmp_path))
    assert placed.ids_model_path is None
    assert placed.request_inputs == ("user_id", "item_id", "dense")
    assert placed.request_input_types == (
        ("user_id", np.dtype(np.int64), (None,)),
        ("item_id", np.dtype(np.int64), (None,)),
        ("dense", np.dtype(np.float32), (None, 3)),
    )
    assert placed.dense_request_inputs == ("dense",)
    assert sorted(placed.lookups, key=lambda item: item.table) == [
        TableLookup("/item/Gather_output_0", "item.weight", "item_id"),
        TableLookup("/user/Gather_output_0", "user.weight", "user_id"),
    ]


def test_ids_cast_from_a_float_input_are_computed_on_the_cpu_first(tmp_path: Path) -> None:
    placed = place_embeddings(str(FIXTURES / "float_input_ctr.onnx"), str(tmp_path))
    assert placed.ids_model_path is not None and placed.ids_inputs == ("x",)
    ids = PlacedInputs(placed).ids({"x": np.array([[0.5, 0.1, 0.2, 7.0, 3.0, 9.0]], np.float32)})
    shared = sorted(int(ids[i.ids].ravel()[0]) for i in placed.lookups if i.table == "shared.weight")
    other = [int(ids[i.ids].ravel()[0]) for i in placed.lookups if i.table == "other.weight"]
    assert (shared, other) == ([3, 7], [9])  # two features share one table: one lookup each


def test_a_table_also_used_outside_a_gather_stays_in_the_graph(tmp_path: Path) -> None:
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["rows"]),
            helper.make_node("MatMul", ["rows", "table_t"], ["scores"]),
            helper.make_node("Transpose", ["table"], ["table_t"]),
        ],
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(table, "table")],
    )
    graph.node.sort(key=lambda n: n.op_type != "Transpose")
    path = tmp_path / "tied.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    placed = place_embeddings(str(path), str(tmp_path / "out"))
    assert placed.tables == {} and placed.lookups == ()
    assert placed.kept == {"table": "Transpose node '' uses it as input 0, not as a Gather's data"}
    ids = np.array([3, 0])
    np.testing.assert_array_equal(
        _session(placed.dense_model_path).run(None, {"ids": ids})[0], _session(str(path)).run(None, {"ids": ids})[0]
    )
