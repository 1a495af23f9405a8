"""Across processes, a row is seen entirely old or entirely new: two worker processes serve
lookups of a table whose every row holds one value repeated, while the leader applies
100k-row deltas to the shared rows in place (DESIGN §9, native/embedding.h)."""

from __future__ import annotations

import os
import threading
import time

import httpx
import numpy as np
import pytest

from recserve.export import write_delta
from recserve.wire.codec import decode_response, encode_request
from tests.server.conftest import UNHURRIED, write_rows_model
from tests.threads import Threads

pytestmark = pytest.mark.skipif(os.environ.get("RECSERVE_PURE_PYTHON") == "1",
                                reason="worker processes share tables through the native engine")

ROWS, DIM = 100_000, 16


def test_no_torn_rows_while_deltas_land(launch, tmp_path):
    config = write_rows_model(tmp_path, ROWS, DIM)
    running = launch(config | UNHURRIED, workers=2)
    keys = np.arange(ROWS, dtype=np.int64)
    stop = threading.Event()
    torn: list[np.ndarray] = []
    values_seen: set[float] = set()

    def read() -> int:
        rng = np.random.default_rng(threading.get_ident() % 1000)
        requests = 0
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
            requests += 1
        return requests

    readers = Threads([read] * 3, "HTTP readers of the rows")
    version_dir = tmp_path / "checkpoints" / "1"
    try:
        for step in range(2, 14):  # twelve deltas of every row: value = step
            write_delta(version_dir, {"t": (keys, np.full((ROWS, DIM), float(step), np.float32))}, global_step=step)
            time.sleep(0.4)
    finally:
        stop.set()
    requests = readers.join(timeout=120)
    assert not torn, f"{sum(len(t) for t in torn)} torn rows, e.g. {torn[0][0]}"
    assert min(requests) > 0 and sum(requests) > 30, requests
    # The readers saw the rows change under them: several deltas' values, not one.
    assert len(values_seen - {0.0}) >= 3, (values_seen, running.log())


def test_workers_answer_unknown_ids_with_the_default_rows(launch, tmp_path):
    """A `{"rows": file}` default: the matrix lives with the table in the shared arena, so
    every worker process answers an unknown id with row id mod k, over fresh connections
    (spread over the workers by SO_REUSEPORT)."""
    from recserve.model_spec import DefaultSpec

    matrix = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    config = write_rows_model(tmp_path, 100, 4, DefaultSpec(kind="rows", rows_file="defaults/t.npy", matrix=matrix))
    running = launch(config | UNHURRIED, workers=2)
    ids = np.array([100, 101, 7_000_003, -6, 2**63 - 1, 5], dtype=np.int64)
    want = np.array([matrix[int(k) % 5] for k in ids[:-1]] + [np.zeros(4)], np.float32)
    for _ in range(20):
        response = httpx.post(f"{running.url}/api/predict/default", content=encode_request({"ids": ids}), timeout=30)
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(decode_response(response.content)["row"], want)
