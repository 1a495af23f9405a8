"""Across processes, a row is seen entirely old or entirely new: two worker processes serve
lookups of a table whose every row holds one value repeated, while the leader applies
100k-row deltas to the shared rows in place (DESIGN §9, native/embedding.h)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from recserve.export import write_checkpoint, write_delta, write_model_dir
from recserve.model_spec import EmbeddingBinding, ModelSpec
from recserve.wire.codec import decode_response, encode_request

pytestmark = pytest.mark.skipif(os.environ.get("RECSERVE_PURE_PYTHON") == "1",
                                reason="worker processes share tables through the native engine")

ROWS, DIM = 100_000, 16


def rows_model(root: Path) -> dict[str, object]:
    """A model that answers the looked-up rows themselves (Identity on the embedding)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["emb"], ["row"])], "rows",
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", DIM])],
        [helper.make_tensor_value_info("row", TensorProto.FLOAT, ["batch", DIM])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    spec = ModelSpec(embeddings=(EmbeddingBinding(input="ids", table="t", dim=DIM, graph_input="emb"),))
    model_dir = write_model_dir(root / "model", model, spec)
    keys = np.arange(ROWS, dtype=np.int64)
    write_checkpoint(root / "checkpoints", {"t": (keys, np.zeros((ROWS, DIM), np.float32))}, global_step=1)
    return {"model_store_type": "local", "savedmodel_dir": str(model_dir),
            "checkpoint_dir": str(root / "checkpoints"), "model_update_interval_seconds": 0.1,
            "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}


def test_no_torn_rows_while_deltas_land(launch, tmp_path):
    config = rows_model(tmp_path)
    running = launch(config, workers=2)
    keys = np.arange(ROWS, dtype=np.int64)
    stop = threading.Event()
    torn: list[np.ndarray] = []
    values_seen: set[float] = set()
    requests = [0]

    def read() -> None:
        rng = np.random.default_rng(threading.get_ident() % 1000)
        while not stop.is_set():
            ids = rng.integers(0, ROWS, 512).astype(np.int64)
            body = encode_request({"ids": ids})
            response = httpx.post(f"{running.url}/api/predict/default", content=body, timeout=30)  # fresh connection
            assert response.status_code == 200, response.text
            rows = decode_response(response.content)["row"]
            mixed = rows.min(axis=1) != rows.max(axis=1)
            if mixed.any():
                torn.append(rows[mixed])
            values_seen.update(np.unique(rows[:, 0]).tolist())
            requests[0] += 1

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    version_dir = tmp_path / "checkpoints" / "1"
    for step in range(2, 14):  # twelve deltas of every row: value = step
        write_delta(version_dir, {"t": (keys, np.full((ROWS, DIM), float(step), np.float32))}, global_step=step)
        time.sleep(0.4)
    stop.set()
    for reader in readers:
        reader.join()
    assert not torn, f"{sum(len(t) for t in torn)} torn rows, e.g. {torn[0][0]}"
    assert requests[0] > 30
    # The readers saw the rows change under them: several deltas' values, not one.
    assert len(values_seen - {0.0}) >= 3, (values_seen, running.log())
