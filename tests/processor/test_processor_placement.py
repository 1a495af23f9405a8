"""Plain ONNX models (torch exports) served with enable_device_placement_optimization:
the tables move into the embedding engine and predictions equal a direct onnxruntime run
of the original model; a checkpoint's rows replace the graph's (DESIGN §4)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve import Processor
from recserve.export import TableData, write_checkpoint, write_delta
from recserve.export.reference import Reference
from recserve.wire import codec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "torch"


def _model_dir(tmp_path: Path, fixture: str) -> Path:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.onnx").write_bytes((FIXTURES / fixture).read_bytes())
    return model_dir


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.onnx")))
def test_placed_model_serves_the_original_predictions(fixture: str, tmp_path: Path, torch_requests) -> None:
    model_dir = _model_dir(tmp_path, fixture)
    processor = Processor({"savedmodel_dir": str(model_dir), "enable_device_placement_optimization": True})
    original = ort.InferenceSession(str(FIXTURES / fixture), providers=["CPUExecutionProvider"])
    names = [o.name for o in original.get_outputs()]
    try:
        # Tables left the graph: the engine holds them.
        assert processor._manager.current.tables  # type: ignore[union-attr]
        rng = np.random.default_rng(1)
        for batch in (1, 4, 33):
            request = torch_requests[fixture](rng, batch)
            got = processor.predict(request)
            want = dict(zip(names, original.run(None, request)))
            assert set(got) == set(want)
            for name, value in want.items():
                assert got[name].shape == value.shape
                assert float(np.abs(got[name] - value).max()) <= 1e-6
    finally:
        processor.close()


def test_checkpoint_rows_replace_the_graph_rows(tmp_path: Path) -> None:
    fixture = "embedding_dynamo.onnx"
    model_dir = _model_dir(tmp_path, fixture)
    rng = np.random.default_rng(2)
    rows = np.array([0, 7, 49], dtype=np.int64)
    write_checkpoint(
        tmp_path / "ckpt",
        {"user.weight": (rows, rng.standard_normal((3, 8)).astype(np.float32) * 10)},
        global_step=5,
    )
    processor = Processor({
        "savedmodel_dir": str(model_dir), "checkpoint_dir": str(tmp_path / "ckpt"),
        "enable_device_placement_optimization": True,
    })
    try:
        reference = Reference(model_dir, tmp_path / "ckpt")
        graph_only = ort.InferenceSession(str(FIXTURES / fixture), providers=["CPUExecutionProvider"])
        request = {"user_id": np.array([0, 7, 3, 49]), "item_id": np.array([1, 2, 3, 4]),
                   "dense": rng.standard_normal((4, 3)).astype(np.float32)}
        got = processor.predict(request)
        want = reference.predict(request)
        stale = graph_only.run(None, request)[0]
        name = next(iter(got))
        assert float(np.abs(got[name] - want[name]).max()) <= 1e-6
        assert float(np.abs(got[name] - stale).max()) > 1e-3  # the new rows are served
    finally:
        processor.close()


def test_imported_tables_take_incremental_updates(tmp_path: Path) -> None:
    """A delta naming a moved initializer updates its rows in place, like any other table."""
    fixture = "embedding_dynamo.onnx"
    model_dir = _model_dir(tmp_path, fixture)
    rng = np.random.default_rng(3)
    version = write_checkpoint(
        tmp_path / "ckpt", {"user.weight": (np.array([1], np.int64), np.ones((1, 8), np.float32))}, global_step=5
    )
    processor = Processor({
        "savedmodel_dir": str(model_dir), "checkpoint_dir": str(tmp_path / "ckpt"),
        "enable_device_placement_optimization": True, "model_update_interval_seconds": 0.05,
    })
    try:
        request = {"user_id": np.array([1, 3, 4]), "item_id": np.array([0, 1, 2]),
                   "dense": rng.standard_normal((3, 3)).astype(np.float32)}
        before = processor.predict(request)
        write_delta(version, {"user.weight": TableData(np.array([3], np.int64), np.full((1, 8), -2.0, np.float32))},
                    global_step=6)
        deadline = time.monotonic() + 10
        while processor.model_info()["delta_step"] != 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processor.model_info()["delta_step"] == 6
        after = processor.predict(request)
        want = Reference(model_dir, tmp_path / "ckpt").predict(request)  # applies the delta
        name = next(iter(after))
        assert float(np.abs(after[name] - want[name]).max()) <= 1e-6
        assert float(np.abs(after[name][1] - before[name][1]).max()) > 1e-3  # row 3 changed
        np.testing.assert_array_equal(after[name][[0, 2]], before[name][[0, 2]])  # others did not
    finally:
        processor.close()


def _plain_dlrm(path: Path, *, n_sparse: int = 4, rows: int = 50, dim: int = 8, n_dense: int = 3) -> None:
    """An exporter-style DLRM: Gathers on [rows, dim] initializers, one Concat with the dense
    features, an MLP."""
    rng = np.random.default_rng(3)
    inputs = [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", n_dense])]
    inputs += [helper.make_tensor_value_info(f"C{t}", TensorProto.INT64, ["batch"]) for t in range(n_sparse)]
    nodes = [helper.make_node("Gather", [f"table{t}", f"C{t}"], [f"emb{t}"], axis=0) for t in range(n_sparse)]
    inits = [numpy_helper.from_array(rng.standard_normal((rows, dim)).astype(np.float32), f"table{t}")
             for t in range(n_sparse)]
    width = n_dense + n_sparse * dim
    nodes.append(helper.make_node("Concat", ["dense"] + [f"emb{t}" for t in range(n_sparse)], ["features"], axis=1))
    inits.append(numpy_helper.from_array(rng.standard_normal((width, 5)).astype(np.float32), "W"))
    nodes += [helper.make_node("MatMul", ["features", "W"], ["h"]), helper.make_node("Sigmoid", ["h"], ["prob"])]
    graph = helper.make_graph(nodes, "plain_dlrm", inputs,
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))


@pytest.mark.skipif(codec._native is None, reason="routes need the native parser (RECSERVE_PURE_PYTHON=1)")
def test_a_plain_model_takes_the_request_route_with_its_concat_folded(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    _plain_dlrm(model_dir / "model.onnx")
    original = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    processor = Processor({"savedmodel_dir": str(model_dir), "enable_device_placement_optimization": True})
    try:
        servable = processor._manager.current
        assert servable is not None and servable.placed is None  # served like a model.json model
        assert servable.sessions.concat is not None and len(servable.sessions.concat.parts) == 5
        rng = np.random.default_rng(4)
        for batch in (1, 7, 64, 7):
            request = {"dense": rng.standard_normal((batch, 3)).astype(np.float32)}
            request |= {f"C{t}": rng.integers(0, 50, batch) for t in range(4)}
            want = original.run(["prob"], request)[0]
            status, body = processor.process(codec.encode_request(request))
            assert status == 200, body
            got = codec.decode_response(body)["prob"]
            assert got.shape == want.shape and float(np.abs(got - want).max()) <= 1e-6
            # predict takes routes too (native_predict): same answer.
            assert float(np.abs(processor.predict(request)["prob"] - want).max()) <= 1e-6
        routes = list(servable.routes.values())
        # Per batch size one route for process (its requests name serving_default) and one
        # for predict (no signature name: another layout).
        assert len(routes) == 6 and all(route._folded is not None for route in routes)
        # An id outside the table is an unknown key: zeros, as on the placed path.
        request = {"dense": np.zeros((1, 3), np.float32)} | {f"C{t}": np.array([50 + t]) for t in range(4)}
        status, body = processor.process(codec.encode_request(request))
        assert status == 200
        features = np.zeros((1, 35), np.float32)  # dense zeros, every row a zero default
        expected = 1 / (1 + np.exp(-(features @ _initializer(model_dir / "model.onnx", "W"))))
        assert np.allclose(codec.decode_response(body)["prob"], expected, atol=1e-6)
    finally:
        processor.close()


def _initializer(path: Path, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer if t.name == name)
