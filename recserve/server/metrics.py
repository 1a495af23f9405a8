"""Prometheus metrics at ``/metrics``.

Per request (recorded by the dispatcher): requests and errors by model, route and code;
latency by route, and by stage (decode / lookup / run / encode); batch sizes; the CPU time
of serving them (what a model costs, and what the server spends around it: the process's
CPU minus this is the protocols' own share). Read at
scrape time from the models (`ModelCollector`): readiness, the serving version and step,
processor loads, updates and update failures, and embedding-table sizes and hit rates
when model_info() reports them under "tables" ({table: {rows, lookups, hits}}).

The per-request ones are plain numbers in one process (recserve.server.local_metrics: an
update costs a lock and a few writes, the samples are made when /metrics is read), and
prometheus_client's file-backed metrics in a worker pool, so any worker's /metrics sums
every process. Thread-safe.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from recserve.processor.trace import STAGES, RequestTrace
from recserve.server.local_metrics import HistogramChild, LocalCounter, LocalHistogram, LocalMetrics, RequestRecorder
from recserve.server.registry import ModelRegistry

__all__ = ["BATCH_BUCKETS", "CONTENT_TYPE", "LATENCY_BUCKETS", "NativeCounts", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = tuple(float(1 << i) for i in range(13))  # 1 .. 4096


@dataclass
class NativeCounts:
    """Requests answered outside Python (the gRPC front end), added up since the last
    look: histograms as (bucket counts, the last above every bound; sum), in the
    buckets above; stages in STAGES' order."""

    served: int
    cpu_seconds: float
    late: int   # dropped: their deadline had passed (504)
    latency: tuple[Sequence[int], float]
    stages: Sequence[tuple[Sequence[int], float]]
    rows: tuple[Sequence[int], float]


class ServerMetrics:
    """The server's metric registry. Thread-safe."""

    def __init__(self, models: ModelRegistry) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Worker processes (PROMETHEUS_MULTIPROC_DIR set by `recserve serve --workers`): the
        # counters and histograms of every process, read from their files, plus the models.
        # One process: plain numbers, made into samples when scraped (local_metrics).
        pooled = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        local = None if pooled else LocalMetrics()
        if local is not None:
            self.registry.register(local)

        def counter(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Any:
            if local is None:
                return Counter(name, documentation, labelnames, registry=self.registry)
            return LocalCounter(local, name, documentation, labelnames)

        def histogram(name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> Any:
            if local is None:
                return Histogram(name, documentation, labelnames, buckets=buckets, registry=self.registry)
            return LocalHistogram(local, name, documentation, labelnames, buckets)

        self.requests = counter("recserve_requests", "Requests answered, by model, route and status code.",
                                ["model", "route", "code"])
        self.errors = counter("recserve_request_errors", "Requests answered with a status other than 200.",
                              ["model", "route", "code"])
        self.latency = histogram("recserve_request_seconds", "Time from request received to response ready.",
                                 ["model", "route"], LATENCY_BUCKETS)
        self.stage = histogram("recserve_stage_seconds",
                               "Time per request in each stage: decode, lookup, run, encode.",
                               ["model", "stage"], LATENCY_BUCKETS)
        self.batch = histogram("recserve_batch_size", "Rows (samples) per request.", ["model"], BATCH_BUCKETS)
        self.cpu = counter("recserve_request_cpu_seconds",
                           "CPU time of the thread serving each request from its model's lease to its answer "
                           "(decode, lookup, run, encode; not reading the request or writing the answer, and "
                           "not ONNX Runtime's own intra-op threads).", ["model", "route"])
        self.merged_requests = counter("recserve_merged_requests",
                                       "Requests that ran in one ONNX Runtime run with others (request merging).",
                                       ["model"])
        self.grpc_front_calls = counter(
            "recserve_grpc_front_calls", "Calls on the gRPC port's C++ front end, by path: native (EAS Predict "
            "answered there), forwarded (to the Python servicers), refused (the server had its maximum in flight).",
            ["path"])
        self.timelines = counter("recserve_timelines_written", "Timelines written, by model and result.",
                                 ["model", "result"])
        self.http_timeouts = counter("recserve_http_timeouts", "HTTP connections closed because a request's headers "
                                     "or body did not arrive in time, by phase.", ["phase"])
        self.connections_refused = counter("recserve_http_connections_refused",
                                           "HTTP connections closed at once: the server had its maximum open.")
        self.client_disconnects = counter("recserve_client_disconnects",
                                          "Requests whose client went away before the answer.", ["route"])
        self.registry.register(ModelCollector(models))
        self._ok: dict[tuple[str, str], RequestRecorder | PooledRecorder] = {}
        self._failed: dict[tuple[str, str, int], tuple[Any, ...]] = {}
        self._local = local
        self._flushes: list[Callable[[], None]] = []
        self._pool_registry: CollectorRegistry | None = None
        if pooled:
            self._pool_registry = CollectorRegistry()
            MultiProcessCollector(self._pool_registry)
            self._pool_registry.register(ModelCollector(models))

    def observe(self, model: str, route: str, status: int, seconds: float, trace: RequestTrace,
                cpu_seconds: float = 0.0) -> None:
        if status != 200:
            # Refusals come in floods (admission control): their children are cached too.
            failed = self._failed.get((model, route, status))
            if failed is None:
                code = str(status)
                failed = self._failed[(model, route, status)] = (
                    self.requests.labels(model, route, code), self.latency.labels(model, route),
                    self.errors.labels(model, route, code), self.cpu.labels(model, route))
            failed[0].inc()
            failed[1].observe(seconds)
            failed[2].inc()
            if cpu_seconds:
                failed[3].inc(cpu_seconds)
            return
        # labels() costs a lock and a dict lookup per metric (~15 us a request for all of
        # them): a 200's children are looked up once per (model, route), as the calls that
        # record into them. Labels are bounded (configured models, known routes), so the
        # cache is too.
        record = self._ok.get((model, route))
        if record is None:
            record = self._ok[(model, route)] = self._recorder(model, route)
        record(seconds, cpu_seconds, _stage_seconds(trace), trace.batch_size)

    def observe_merged(self, model: str, route: str, statuses: Sequence[int], seconds: float,
                       traces: Sequence[RequestTrace], cpu_per_row: float) -> None:
        """`observe` for the requests of one merged call: each with the call's `seconds` and
        `cpu_per_row` times its rows of CPU; the 200s recorded in one go (one lock, the
        shared latency's bucket found once: a merged call's requests are many, and their
        metrics had become a tenth of a merged request's CPU)."""
        answered = []
        for status, trace in zip(statuses, traces):
            if status == 200:
                answered.append(trace)
            else:
                self.observe(model, route, status, seconds, trace, cpu_per_row * max(trace.batch_size, 1))
        if not answered:
            return
        record = self._ok.get((model, route))
        if record is None:
            record = self._ok[(model, route)] = self._recorder(model, route)
        record.many(seconds, cpu_per_row, [_stage_seconds(t) for t in answered], [t.batch_size for t in answered])

    def add_native(self, model: str, route: str, counts: NativeCounts) -> None:
        """Requests served outside Python, counted there (recserve.server.grpc_front): the
        same series as `observe`'s, added in one go."""
        if counts.late:  # refused at once: latency 0, as `observe` records them
            _add_counts(self.requests.labels(model, route, "504"), counts.late)
            _add_counts(self.errors.labels(model, route, "504"), counts.late)
            _add_histogram(self.latency.labels(model, route), [counts.late] + [0] * len(LATENCY_BUCKETS), 0.0)
        if not counts.served:
            return
        _add_counts(self.requests.labels(model, route, "200"), counts.served)
        _add_counts(self.cpu.labels(model, route), counts.cpu_seconds)
        _add_histogram(self.latency.labels(model, route), *counts.latency)
        for stage, (buckets, total) in zip(STAGES, counts.stages):
            _add_histogram(self.stage.labels(model, stage), buckets, total)
        _add_histogram(self.batch.labels(model), *counts.rows)

    def _recorder(self, model: str, route: str) -> RequestRecorder | PooledRecorder:
        """What records a 200 of (model, route): in one process local_metrics' RequestRecorder
        (one lock, the values written in one call); in a worker pool a PooledRecorder
        (prometheus_client's multiprocess values)."""
        count, latency, batch, cpu = (self.requests.labels(model, route, "200"), self.latency.labels(model, route),
                                      self.batch.labels(model), self.cpu.labels(model, route))
        stages = tuple(self.stage.labels(model, stage) for stage in STAGES)
        if self._local is not None:
            return RequestRecorder(self._local.lock, count, latency, cpu, stages, batch)
        return PooledRecorder(count, latency, cpu, stages, batch)

    def counted_elsewhere(self, flush: Callable[[], None]) -> None:
        """`flush()` adds requests counted outside Python (add_native): called before each
        scrape, so /metrics is current in this process."""
        self._flushes.append(flush)

    def render(self) -> bytes:
        for flush in self._flushes:
            flush()
        return generate_latest(self._pool_registry or self.registry)


class PooledRecorder:
    """Records answered requests into prometheus_client's children in a worker pool, where
    every value is a multiprocess file entry (each update: a lock, an os.getpid() call and
    an mmap write; perf put them at ~12% of a worker's loop with merging on). One request:
    the children's own inc() and observe(). A merged call's requests (`many`): the updates
    added up first, so a histogram gets one add per bucket hit and one to its sum, not one of
    each per request."""

    __slots__ = ("_batch", "_count", "_cpu", "_latency", "_stages")

    def __init__(self, count: Any, latency: Any, cpu: Any, stages: Sequence[Any], batch: Any) -> None:
        self._count = count
        self._latency = latency
        self._cpu = cpu
        self._stages = tuple(stages)
        self._batch = batch

    def __call__(self, seconds: float, cpu_seconds: float, stage_seconds: Sequence[float], rows: int) -> None:
        self._count.inc()
        self._latency.observe(seconds)
        self._cpu.inc(cpu_seconds)
        for spent, stage in zip(stage_seconds, self._stages):
            if spent:
                stage.observe(spent)
        if rows:
            self._batch.observe(rows)

    def many(self, seconds: float, cpu_per_row: float, stage_seconds: Sequence[Sequence[float]],
             rows: Sequence[int]) -> None:
        """As RequestRecorder.many."""
        self._count.inc(len(rows))
        _observe_all(self._latency, [seconds] * len(rows))
        self._cpu.inc(cpu_per_row * sum(r if r > 0 else 1 for r in rows))
        for i, stage in enumerate(self._stages):
            _observe_all(stage, [spent[i] for spent in stage_seconds if spent[i]])
        _observe_all(self._batch, [r for r in rows if r])


def _observe_all(histogram: Any, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for each of `values`, as one add per bucket hit and one to the
    sum (through the child's bucket values, as its observe() adds to them); one observe() at
    a time if the child does not have them (another prometheus_client)."""
    buckets, total, bounds = getattr(histogram, "_buckets", None), getattr(histogram, "_sum", None), \
        getattr(histogram, "_upper_bounds", None)
    if buckets is None or total is None or bounds is None:
        for value in values:
            histogram.observe(value)
        return
    if not values:
        return
    hits: dict[int, int] = {}
    for value in values:
        at = bisect_left(bounds, value)  # observe(): the first bound >= the value
        hits[at] = hits.get(at, 0) + 1
    for at, n in hits.items():
        buckets[at].inc(n)
    total.inc(sum(values))


def _add_counts(counter: Any, amount: float) -> None:
    counter.inc(amount)


def _add_histogram(histogram: Any, buckets: Sequence[int], total: float) -> None:
    """Observations already put in `histogram`'s buckets (the same bounds) added to it: a
    local one's counts, or a prometheus_client child's bucket values."""
    if isinstance(histogram, HistogramChild):
        histogram.add_counts(buckets, total)
        return
    values = getattr(histogram, "_buckets", None)
    if values is None or len(values) != len(buckets):
        raise TypeError(f"cannot add bucket counts to {type(histogram).__name__}: this prometheus_client "
                        "keeps a histogram's buckets otherwise")
    for value, n in zip(values, buckets):
        if n:
            value.inc(n)
    histogram._sum.inc(total)


def _stage_seconds(trace: RequestTrace) -> Sequence[float]:
    """Seconds in each of STAGES (0.0: none)."""
    spans = trace.spans
    if len(spans) == 4:
        (decode, start0, end0), (lookup, start1, end1), (run, start2, end2), (encode, start3, end3) = spans
        if (decode, lookup, run, encode) == STAGES:  # the usual trace: one span per stage, in order
            return ((end0 - start0) / 1e9, (end1 - start1) / 1e9, (end2 - start2) / 1e9, (end3 - start3) / 1e9)
    return [trace.seconds(stage) for stage in STAGES]


class ModelCollector(Collector):
    """Model state, read from the registry at each scrape."""

    def __init__(self, models: ModelRegistry) -> None:
        self._models = models

    def collect(self) -> Iterator[Metric]:
        ready = GaugeMetricFamily("recserve_model_ready", "1 when the model is loaded and warmed up.",
                                  labels=["model"])
        version = GaugeMetricFamily("recserve_serving_version",
                                    "1 for the version each model serves (label version).",
                                    labels=["model", "version"])
        step = GaugeMetricFamily("recserve_serving_global_step",
                                 "global_step of the version being served.", labels=["model"])
        loads = CounterMetricFamily("recserve_model_loads", "Processor loads (startup, pins) by result.",
                                    labels=["model", "result"])
        updates = CounterMetricFamily("recserve_model_updates",
                                      "Updates applied by the model's updater, by kind (full, delta).",
                                      labels=["model", "kind"])
        failures = CounterMetricFamily("recserve_model_update_failures",
                                       "Update problems by reason (storage, not_ready, corrupt, wrong_base, "
                                       "load, memory, internal); the old version kept serving.",
                                       labels=["model", "reason"])
        rows = GaugeMetricFamily("recserve_embedding_rows", "Rows in each embedding table.",
                                 labels=["model", "table"])
        hit_rate = GaugeMetricFamily("recserve_embedding_hit_rate",
                                     "Fraction of looked-up ids found in the table (others get the default).",
                                     labels=["model", "table"])
        waiting = GaugeMetricFamily("recserve_requests_waiting",
                                    "Requests that arrived and wait for their turn (admission; at most "
                                    "max_queued_requests).", labels=["model"])
        native = CounterMetricFamily("recserve_native_route_requests",
                                     "Requests answered by the native route (C, the GIL released; DESIGN §10).",
                                     labels=["model"])
        fallbacks = CounterMetricFamily("recserve_native_route_fallbacks",
                                        "Requests that took the Python route instead, by reason: no_servable (the "
                                        "version needs Python: Redis tables, a placed ids graph), parse, "
                                        "route_miss (a new layout, or one with no native form), lookup, run, "
                                        "output, memory, empty, trace.", labels=["model", "reason"])
        progress = GaugeMetricFamily("recserve_model_load_progress",
                                     "Fraction done of the version loading now (checksums, then tables); 1 when "
                                     "nothing loads.", labels=["model"])
        for name, entry in self._models.entries.items():
            ready.add_metric([name], 1.0 if entry.ready else 0.0)
            waiting.add_metric([name], float(entry.admission.waiting))
            progress.add_metric([name], entry.progress.fraction)
            loads.add_metric([name, "ok"], entry.load_counts["ok"])
            loads.add_metric([name, "error"], entry.load_counts["error"])
            processor = entry.processor
            if processor is None:
                continue
            info: dict[str, Any] = processor.model_info()
            if info.get("version") is not None:
                version.add_metric([name, str(info["version"])], 1.0)
            if info.get("global_step") is not None:
                step.add_metric([name], float(info["global_step"]))
            updates.add_metric([name, "full"], float(info.get("full_updates", 0)))
            updates.add_metric([name, "delta"], float(info.get("delta_updates", 0)))
            for reason, count in info.get("update_failures", {}).items():
                failures.add_metric([name, reason], float(count))
            route = info.get("native_route") or {}
            native.add_metric([name], float(route.get("served", 0)))
            for reason, count in (route.get("fallbacks") or {}).items():
                fallbacks.add_metric([name, reason], float(count))
            for table, stats in info.get("tables", {}).items():
                rows.add_metric([name, table], float(stats["rows"]))
                if stats.get("lookups"):
                    hit_rate.add_metric([name, table], stats["hits"] / stats["lookups"])
        yield from (ready, waiting, progress, version, step, loads, updates, failures, rows, hit_rate, native,
                    fallbacks)
