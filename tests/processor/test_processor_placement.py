"""Plain ONNX models (torch exports) served with enable_device_placement_optimization:
the tables move into the embedding engine and predictions equal a direct onnxruntime run
of the original model; a checkpoint's rows replace the graph's (DESIGN §4)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from recserve import Processor
from recserve.export import TableData, write_checkpoint, write_delta
from recserve.export.reference import Reference

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
