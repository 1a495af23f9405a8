"""One place every protocol hands a request to: lease the model, trace, time, count.

`Dispatcher.call` runs on a worker thread (never on the event loop): it leases the
model's processor for the whole request, gives the handler a `RequestTrace`, records the
metrics, and writes a timeline when the request is one the model's timeline_* fields
chose. Errors come back as (status, message), never raised, so each protocol only maps
them to its own error form. Thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from recserve.errors import RecserveError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.server.metrics import ServerMetrics
from recserve.server.registry import ModelEntry, ModelRegistry
from recserve.server.timeline import write_timeline

__all__ = ["Dispatcher", "Outcome"]

log = logging.getLogger("recserve.server")

# (200, the handler's result) or (error status, UTF-8 error message)
Outcome = tuple[int, Any]

# Label for requests naming no configured model: keeps the metric's label set bounded.
UNKNOWN_MODEL = "_unknown"


class Dispatcher:
    def __init__(self, models: ModelRegistry, metrics: ServerMetrics) -> None:
        self.models = models
        self.metrics = metrics

    def call(
        self,
        route: str,
        find: Callable[[], ModelEntry],
        handler: Callable[[ModelEntry, Processor, RequestTrace], Outcome],
        trace: RequestTrace | None = None,
    ) -> Outcome:
        """Run `handler` on the model `find` names, recording into `trace` (a new one if
        None). The handler returns (status, result) or raises RecserveError; either way the
        caller gets (status, result or message)."""
        started, cpu = time.perf_counter(), time.thread_time()
        if trace is None:
            trace = RequestTrace()
        label = UNKNOWN_MODEL
        step = None
        entry = None
        try:
            entry = find()
            label = entry.name
            if entry.timeline is not None:
                step = entry.timeline.take()
                trace.want_ort_profile = step is not None
            with entry.lease() as processor:
                status, result = handler(entry, processor, trace)
        except RecserveError as exc:
            status, result = exc.status, exc.message
        except Exception as exc:  # a bug in a protocol layer: answer 500, keep serving
            log.exception("%s request failed", route)
            status, result = 500, f"internal error: {type(exc).__name__}: {exc}"
        if status != 200 and isinstance(result, bytes):
            result = result.decode("utf-8", "replace")
        self.metrics.observe(label, route, status, time.perf_counter() - started, trace, time.thread_time() - cpu)
        if step is not None and entry is not None and status == 200:
            self._write_timeline(entry, step, trace)
        return status, result

    def call_merged(self, route: str, entry: ModelEntry, payloads: list[bytes],
                    traces: list[RequestTrace]) -> list[Outcome]:
        """EAS PredictRequests for `entry`'s model, merged into shared runs where their
        layouts agree (`Processor.process_many`): each one's (status, bytes or message), and
        each counted on its own, with its share of the CPU (by rows) and of the time."""
        started, cpu = time.perf_counter(), time.thread_time()
        steps: list[int | None] = [None] * len(payloads)
        if entry.timeline is not None:
            steps = [entry.timeline.take() for _ in payloads]
            for trace, step in zip(traces, steps):
                trace.want_ort_profile = step is not None
        try:
            with entry.lease() as processor:
                answers = processor.process_many(payloads, traces, entry.config.max_batch_size)
        except RecserveError as exc:
            answers = [(exc.status, exc.message.encode())] * len(payloads)
        seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
        rows = sum(max(t.batch_size, 1) for t in traces)
        outcomes: list[Outcome] = []
        merged = 0
        for payload, trace, step, (status, result) in zip(payloads, traces, steps, answers):
            if status == 200 and payload:
                entry.record(payload)
            if trace.merged_with > 1:
                merged += 1
            outcomes.append((status, result if status == 200 else result.decode("utf-8", "replace")))
            if step is not None and status == 200:
                self._write_timeline(entry, step, trace)
        self.metrics.observe_merged(entry.name, route, [status for status, _ in answers], seconds, traces, cpu / rows)
        if merged:
            self.metrics.merged_requests.labels(entry.name).inc(merged)
        return outcomes

    def _write_timeline(self, entry: ModelEntry, step: int, trace: RequestTrace) -> None:
        try:
            where = write_timeline(entry.config, entry.name, step, trace)
        except RecserveError as exc:
            log.warning("model %r: timeline of step %d not written: %s", entry.name, step, exc.message)
            self.metrics.timelines.labels(entry.name, "error").inc()
            return
        finally:
            if trace.ort_profile_path:  # merged into the timeline (or not): no longer needed
                with contextlib.suppress(OSError):
                    os.remove(trace.ort_profile_path)
        log.info("model %r: timeline of step %d written to %s", entry.name, step, where)
        self.metrics.timelines.labels(entry.name, "ok").inc()
