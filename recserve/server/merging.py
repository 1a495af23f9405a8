"""Request merging on the event loop: EAS predictions for one model that wait at the same
moment run as one batch of rows (`Dispatcher.call_merged`, `Processor.process_many`).

A request joins its model's queue when its body is whole. The queue is run by a callback
the loop calls once it has handled the I/O it is handling now (`call_soon`): every request
that arrived in that pass of the loop runs in the same call, with no timer when the server
is idle. While a merged call runs on a worker thread, requests arriving meanwhile wait in
the queue and run together when it ends ("queued behind a running batch"). With the
model's `batch_timeout_micros` above 0 the queue instead waits up to that long after its
first request (at most half the model's max_queue_ms), unless `max_batch_size` requests
are already there.

Per request, as unmerged: a place in the model's admission from arrival to its turn (a
full wait refuses it at once; one that waited past max_queue_ms or its deadline is
answered 503 when its turn comes, not run), its own status and error, metrics and trace.

Event loop only (the merged call itself may run on a worker thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

from recserve.processor.trace import RequestTrace
from recserve.server.admission import OverloadedError
from recserve.server.dispatch import Outcome
from recserve.server.inline_policy import InlinePolicy
from recserve.server.metrics import ServerMetrics
from recserve.server.registry import ModelEntry

__all__ = ["RequestMerger"]

log = logging.getLogger("recserve.server")

# Called on the loop with the request's outcome and its trace (None: it never ran).
Answer = Callable[[Outcome, RequestTrace | None], None]
CallMerged = Callable[[str, ModelEntry, list[bytes], list[RequestTrace]], list[Outcome]]


class _Waiting:
    __slots__ = ("answer", "arrived", "body", "deadline")

    def __init__(self, body: bytes, arrived: float, deadline: float | None, answer: Answer) -> None:
        self.body = body
        self.arrived = arrived
        self.deadline = deadline
        self.answer = answer


class _Queue:
    __slots__ = ("entry", "handle", "items", "running")

    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry
        self.items: list[_Waiting] = []
        self.handle: asyncio.Handle | None = None  # the flush to come, if one is scheduled
        self.running = 0  # merged calls on worker threads now


class RequestMerger:
    def __init__(self, call_merged: CallMerged, metrics: ServerMetrics, inline: InlinePolicy,
                 executor: Executor) -> None:
        self._call_merged = call_merged
        self._metrics = metrics
        self._inline = inline
        self._executor = executor
        self._queues: dict[str, _Queue] = {}

    @staticmethod
    def merges(entry: ModelEntry) -> bool:
        """Whether `entry`'s model merges requests (max_batch_size > 0)."""
        return entry.config.max_batch_size > 0

    def add(self, entry: ModelEntry, body: bytes, arrived: float, deadline: float | None, answer: Answer) -> None:
        """Queue an EAS request for `entry` (body non-empty, whole); `answer(outcome)` is
        called on the loop once it is answered, or at once when the model's wait is full."""
        try:
            arrived = entry.admission.arrive(arrived)
        except OverloadedError as exc:
            self._metrics.observe(entry.name, "eas", exc.status, 0.0, RequestTrace())
            answer((exc.status, exc.message), None)
            return
        queue = self._queues.get(entry.name)
        if queue is None or queue.entry is not entry:
            queue = self._queues[entry.name] = _Queue(entry)
        queue.items.append(_Waiting(body, arrived, deadline, answer))
        if queue.running:
            return  # the running call's end schedules the next
        if queue.handle is None:
            self._schedule(queue)
        elif len(queue.items) >= entry.config.max_batch_size and isinstance(queue.handle, asyncio.TimerHandle):
            queue.handle.cancel()  # enough for a full run: no more waiting for company
            self._schedule(queue)

    def _schedule(self, queue: _Queue) -> None:
        loop = asyncio.get_running_loop()
        config = queue.entry.config
        # Waiting for company never costs a request its turn: at most half its max_queue_ms.
        wait = min(config.batch_timeout_micros / 1e6, queue.entry.admission.max_queue_seconds / 2)
        if wait <= 0 or len(queue.items) >= config.max_batch_size:
            queue.handle = loop.call_soon(self._flush, queue)
        else:
            left = queue.items[0].arrived + wait - time.monotonic()
            queue.handle = loop.call_later(max(left, 0.0), self._flush, queue)

    def _flush(self, queue: _Queue) -> None:
        queue.handle = None
        entry = queue.entry
        take = entry.config.max_batch_size  # each request has at least one row
        items, queue.items = queue.items[:take], queue.items[take:]
        admitted: list[_Waiting] = []
        for item in items:
            try:
                entry.admission.start(item.arrived, item.deadline)
            except OverloadedError as exc:
                self._metrics.observe(entry.name, "eas", exc.status, 0.0, RequestTrace())
                item.answer((exc.status, exc.message), None)
                continue
            admitted.append(item)
        if admitted:
            payloads = [item.body for item in admitted]
            traces = [RequestTrace() for _ in admitted]
            if self._inline.inline(entry.name, max(len(p) for p in payloads)):
                started = time.perf_counter()
                try:
                    outcomes = self._call_merged("eas", entry, payloads, traces)
                except Exception as exc:  # a bug: every caller is answered 500, the loop goes on
                    log.exception("model %r: a merged call failed", entry.name)
                    outcomes = [(500, f"internal error: {type(exc).__name__}: {exc}")] * len(admitted)
                self._inline.record(entry.name, (time.perf_counter() - started) / len(admitted),
                                    _released(traces) / len(admitted))
                self._deliver(admitted, outcomes, traces)
            else:
                queue.running += 1
                future = asyncio.get_running_loop().run_in_executor(
                    self._executor, _timed, self._call_merged, entry, payloads, traces)
                future.add_done_callback(lambda done: self._finished(queue, admitted, traces, done))
        if queue.items and queue.handle is None and queue.running == 0:
            self._schedule(queue)

    def _finished(self, queue: _Queue, items: list[_Waiting], traces: list[RequestTrace],
                  done: asyncio.Future[tuple[list[Outcome], float]]) -> None:
        queue.running -= 1
        try:
            outcomes, cpu = done.result()
        except Exception as exc:  # a bug: every caller of the batch is answered 500
            log.exception("model %r: a merged call failed", queue.entry.name)
            outcomes = [(500, f"internal error: {type(exc).__name__}: {exc}")] * len(items)
        else:
            self._inline.record(queue.entry.name, cpu / len(items), _released(traces) / len(items))
        self._deliver(items, outcomes, traces)
        if queue.items and queue.handle is None:
            self._schedule(queue)

    @staticmethod
    def _deliver(items: list[_Waiting], outcomes: list[Outcome], traces: list[RequestTrace]) -> None:
        for item, outcome, trace in zip(items, outcomes, traces):
            item.answer(outcome, trace)


def _released(traces: list[RequestTrace]) -> float:
    # A merged run's C call is shared: each trace holds the whole call's time.
    return max((t.released_ns for t in traces), default=0) / 1e9


def _timed(call_merged: Callable[..., list[Outcome]], entry: ModelEntry, payloads: list[bytes],
           traces: list[RequestTrace]) -> tuple[list[Outcome], float]:
    # On a worker thread the clock is its CPU time (see http_common._timed_call: the wall
    # time counts waits for the GIL and would keep a short model off the loop for good).
    started = time.thread_time()
    outcomes = call_merged("eas", entry, payloads, traces)
    return outcomes, time.thread_time() - started
