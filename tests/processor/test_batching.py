"""DynamicBatcher with a recording run function: what is merged, what is not, and that
every caller gets exactly its own rows or its own error.

Where a test needs requests merged, max_batch_size is exactly their total rows and the
batch timeout is far longer than any test: the batch closes when it is full, so what is
merged does not depend on how fast the machine starts the callers' threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from recserve.errors import InternalError, RequestError
from recserve.processor.batching import DynamicBatcher
from tests.threads import Threads


class Recorder:
    """run(): y = x * 2 + row tag, rows per call recorded; rejects negative ids."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[tuple[int, int]] = []  # (session, rows)
        self.lock = threading.Lock()
        self.gate = gate

    def __call__(self, session: int, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self.gate is not None:
            self.gate.wait()
        x = feeds["x"]
        with self.lock:
            self.calls.append((session, x.shape[0]))
        if (x < 0).any():
            raise RequestError("negative id")
        return [x * 2 for _ in names]


def _submit_all(batcher: DynamicBatcher, requests: list[np.ndarray], names: Sequence[str] = ("y",)) -> list[object]:
    results: list[object] = [None] * len(requests)

    def one(i: int) -> None:
        try:
            results[i] = batcher.submit(names, {"x": requests[i]})
        except Exception as exc:  # noqa: BLE001  # the test inspects it
            results[i] = exc

    Threads([lambda i=i: one(i) for i in range(len(requests))], "callers of submit").join(timeout=120)
    return results


NEVER_MICROS = 600_000_000  # a batch timeout no test reaches: batches close when full


def test_concurrent_requests_merge_and_each_caller_gets_its_rows() -> None:
    run = Recorder()
    requests = [np.full((1 + i % 3, 2), i, np.int64) for i in range(16)]
    total = sum(r.shape[0] for r in requests)
    batcher = DynamicBatcher(run, sessions=1, max_batch_size=total, batch_timeout_micros=NEVER_MICROS)
    results = _submit_all(batcher, requests)
    batcher.close()
    for request, result in zip(requests, results):
        assert isinstance(result, list), result
        np.testing.assert_array_equal(result[0], request * 2)
    assert run.calls == [(0, total)]  # all sixteen merged into one run


def test_batches_never_exceed_max_rows_and_big_requests_run_alone() -> None:
    run = Recorder()
    batcher = DynamicBatcher(run, sessions=2, max_batch_size=4, batch_timeout_micros=50_000)
    requests = [np.ones((3, 2), np.int64)] * 6 + [np.ones((9, 2), np.int64)]
    results = _submit_all(batcher, requests)
    batcher.close()
    assert all(isinstance(r, list) for r in results)
    assert sorted(rows for _, rows in run.calls) == [3, 3, 3, 3, 3, 3, 9]


def test_requests_with_other_shapes_or_outputs_are_not_merged() -> None:
    gate = threading.Event()
    run = Recorder(gate)
    batcher = DynamicBatcher(run, sessions=1, max_batch_size=64, batch_timeout_micros=100_000)
    requests = [np.ones((1, 2), np.int64), np.ones((1, 3), np.int64), np.ones((1, 2), np.int32)]
    gate.set()
    results = _submit_all(batcher, requests)
    batcher.close()
    assert [r[0].shape for r in results] == [(1, 2), (1, 3), (1, 2)]  # type: ignore[index]
    assert sorted(rows for _, rows in run.calls) == [1, 1, 1]


def test_a_bad_request_fails_alone_when_its_batch_is_rerun() -> None:
    run = Recorder()
    requests = [np.full((1, 2), i, np.int64) for i in range(5)] + [np.full((2, 2), -1, np.int64)]
    batcher = DynamicBatcher(run, sessions=1, max_batch_size=7, batch_timeout_micros=NEVER_MICROS)
    results = _submit_all(batcher, requests)
    batcher.close()
    # One merged run of all seven rows failed; then each request ran alone.
    assert run.calls[0] == (0, 7) and sorted(run.calls[1:]) == [(0, 1)] * 5 + [(0, 2)], run.calls
    assert isinstance(results[-1], RequestError) and str(results[-1]) == "negative id"
    for request, result in zip(requests[:-1], results[:-1]):
        assert isinstance(result, list), result
        np.testing.assert_array_equal(result[0], request * 2)


def test_an_output_without_the_batch_dimension_is_an_internal_error() -> None:
    merged: list[int] = []

    def run(session: int, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        merged.append(feeds["x"].shape[0])
        return [np.zeros(3)] if feeds["x"].shape[0] > 1 else [np.zeros(1)]

    batcher = DynamicBatcher(run, sessions=1, max_batch_size=2, batch_timeout_micros=NEVER_MICROS)
    results = _submit_all(batcher, [np.ones((1, 1))] * 2)
    batcher.close()
    assert merged == [2]
    assert all(isinstance(r, InternalError) for r in results), results
    assert "every output's first dimension must be the batch" in str(results[0])


def test_closed_batcher_refuses_new_requests() -> None:
    batcher = DynamicBatcher(Recorder(), sessions=1, max_batch_size=8, batch_timeout_micros=0)
    batcher.close()
    with pytest.raises(InternalError, match="the session group is closed"):
        batcher.submit(["y"], {"x": np.ones((1, 2))})
