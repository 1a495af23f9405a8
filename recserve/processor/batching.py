"""Dynamic batching: concurrent small requests merged into one run, outputs split back.

One worker thread per session. Workers take turns collecting (leader/follower): the
collector takes the oldest waiting request, then every waiting request that can be
merged with it (same outputs asked for, same inputs with the same dtypes and the same
shape after the batch dimension) until the batch holds `max_batch_size` rows or
`batch_timeout_micros` have passed since that oldest request arrived; it hands over the
collecting role and runs the batch on its own session while the next worker collects.
Inputs are concatenated along axis 0 (nothing is padded); each caller gets exactly its
own rows of every output. A request of `max_batch_size` rows or more runs alone. If a
merged run fails because of the inputs, each request is run alone so that only the
faulty one gets the error. Thread-safe: `submit` may be called from any number of
threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recserve.errors import InternalError, RequestError
from recserve.processor.merged_runs import concat_rows, split_rows

__all__ = ["DynamicBatcher", "RunOnSession"]

# run(session index, output names, feeds) -> outputs
RunOnSession = Callable[[int, Sequence[str], Mapping[str, np.ndarray]], list[np.ndarray]]


@dataclass(eq=False)
class _Request:
    output_names: tuple[str, ...]
    feeds: Mapping[str, np.ndarray]
    rows: int
    key: tuple[Any, ...]
    arrived: float
    done: threading.Event = field(default_factory=threading.Event)
    result: list[np.ndarray] | None = None
    error: BaseException | None = None

    def finish(self, result: list[np.ndarray] | None = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


def _merge_key(output_names: tuple[str, ...], feeds: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
    return (output_names, tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in feeds.items())))


class DynamicBatcher:
    def __init__(
        self,
        run: RunOnSession,
        *,
        sessions: int,
        max_batch_size: int,
        batch_timeout_micros: int,
        on_worker_start: Callable[[int], None] | None = None,
    ) -> None:
        self._run = run
        self._max_rows = max_batch_size
        self._timeout = batch_timeout_micros / 1e6
        self._on_worker_start = on_worker_start
        self._pending: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._collecting = threading.Lock()
        self._closed = False
        self._workers = [
            threading.Thread(target=self._work, args=(i,), name=f"recserve-batch-{i}", daemon=True)
            for i in range(sessions)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs for exactly this request's rows; raises what the run raised."""
        names = tuple(output_names)
        rows = next((a.shape[0] for a in feeds.values() if a.ndim), 1)
        request = _Request(names, feeds, rows, _merge_key(names, feeds), time.monotonic())
        with self._cond:
            if self._closed:
                raise InternalError("the session group is closed")
            self._pending.append(request)
            self._cond.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def close(self) -> None:
        """Stop the workers once the requests already submitted are answered."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.join()

    # -- workers -------------------------------------------------------------------------

    def _work(self, session: int) -> None:
        if self._on_worker_start is not None:
            self._on_worker_start(session)
        while True:
            with self._collecting:
                batch = self._collect()
            if batch is None:
                return
            self._execute(session, batch)

    def _collect(self) -> list[_Request] | None:
        with self._cond:
            while not self._pending:
                if self._closed:
                    return None
                self._cond.wait()
            first = self._pending.popleft()
            batch, rows = [first], first.rows
            deadline = first.arrived + self._timeout
            while rows < self._max_rows:
                kept: deque[_Request] = deque()
                for request in self._pending:
                    if request.key == first.key and rows + request.rows <= self._max_rows:
                        batch.append(request)
                        rows += request.rows
                    else:
                        kept.append(request)
                self._pending = kept
                remaining = deadline - time.monotonic()
                if rows >= self._max_rows or remaining <= 0 or self._closed:
                    break
                self._cond.wait(remaining)
            return batch

    def _execute(self, session: int, batch: list[_Request]) -> None:
        first = batch[0]
        if len(batch) == 1:
            self._run_alone(session, first)
            return
        try:
            outputs = self._run(session, first.output_names, concat_rows([r.feeds for r in batch]))
        except RequestError:
            for request in batch:
                self._run_alone(session, request)
            return
        except BaseException as exc:  # noqa: BLE001  # every caller of the batch is answered with it
            for request in batch:
                request.finish(error=exc)
            return
        parts = split_rows(outputs, [r.rows for r in batch])
        if parts is None:
            total = sum(r.rows for r in batch)
            shapes = ", ".join(f"{name!r} {list(out.shape)}" for name, out in zip(first.output_names, outputs))
            error = InternalError(
                f"dynamic batching merged {total} rows but the outputs have shapes {shapes}; "
                "every output's first dimension must be the batch (set max_batch_size to 0)"
            )
            for request in batch:
                request.finish(error=error)
            return
        for request, part in zip(batch, parts):
            request.finish(result=part)

    def _run_alone(self, session: int, request: _Request) -> None:
        try:
            request.finish(result=self._run(session, request.output_names, request.feeds))
        except BaseException as exc:  # noqa: BLE001  # answered, never lost: the caller re-raises it
            request.finish(error=exc)
