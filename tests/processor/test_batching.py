"""DynamicBatcher with a recording run function: what is merged, what is not, and that
every caller gets exactly its own rows or its own error."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from recserve.errors import InternalError, RequestError
from recserve.processor.batching import DynamicBatcher


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

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_requests_merge_and_each_caller_gets_its_rows() -> None:
    gate = threading.Event()
    run = Recorder(gate)
    batcher = DynamicBatcher(run, sessions=1, max_batch_size=64, batch_timeout_micros=200_000)
    requests = [np.full((1 + i % 3, 2), i, np.int64) for i in range(16)]
    opener = threading.Thread(target=lambda: (threading.Event().wait(0.3), gate.set()))
    opener.start()
    results = _submit_all(batcher, requests)
    opener.join()
    batcher.close()
    for request, result in zip(requests, results):
        assert isinstance(result, list)
        np.testing.assert_array_equal(result[0], request * 2)
    assert sum(rows for _, rows in run.calls) == sum(r.shape[0] for r in requests)
    assert len(run.calls) < len(requests)  # merged


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
    gate = threading.Event()
    run = Recorder(gate)
    batcher = DynamicBatcher(run, sessions=1, max_batch_size=64, batch_timeout_micros=200_000)
    requests = [np.full((1, 2), i, np.int64) for i in range(5)] + [np.full((2, 2), -1, np.int64)]
    opener = threading.Thread(target=lambda: (threading.Event().wait(0.3), gate.set()))
    opener.start()
    results = _submit_all(batcher, requests)
    opener.join()
    batcher.close()
    assert isinstance(results[-1], RequestError) and str(results[-1]) == "negative id"
    for request, result in zip(requests[:-1], results[:-1]):
        np.testing.assert_array_equal(result[0], request * 2)  # type: ignore[index]


def test_an_output_without_the_batch_dimension_is_an_internal_error() -> None:
    gate = threading.Event()

    def run(session: int, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        gate.wait()
        return [np.zeros(3)] if feeds["x"].shape[0] > 1 else [np.zeros(1)]

    batcher = DynamicBatcher(run, sessions=1, max_batch_size=8, batch_timeout_micros=200_000)
    opener = threading.Thread(target=lambda: (threading.Event().wait(0.3), gate.set()))
    opener.start()
    results = _submit_all(batcher, [np.ones((1, 1))] * 2)
    opener.join()
    batcher.close()
    errors = [r for r in results if isinstance(r, InternalError)]
    assert errors and "every output's first dimension must be the batch" in str(errors[0])


def test_closed_batcher_refuses_new_requests() -> None:
    batcher = DynamicBatcher(Recorder(), sessions=1, max_batch_size=8, batch_timeout_micros=0)
    batcher.close()
    with pytest.raises(InternalError, match="the session group is closed"):
        batcher.submit(["y"], {"x": np.ones((1, 2))})
