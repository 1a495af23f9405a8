"""Prometheus metrics at ``/metrics``.

Per request (recorded by the dispatcher): requests and errors by model, route and code;
latency by route, and by stage (decode / lookup / run / encode); batch sizes; the CPU time
of serving them (what a model costs, and what the server spends around it: the process's
CPU minus this is the protocols' own share). Read at
scrape time from the models (`ModelCollector`): readiness, the serving version and step,
processor loads, updates and update failures, and embedding-table sizes and hit rates
when model_info() reports them under "tables" ({table: {rows, lookups, hits}}).

The per-request ones are plain numbers (recserve.server.local_metrics: an update costs a
lock and a few writes). In one process the samples are made from them when /metrics is
read; in a worker pool recserve.server.pool_flush adds them to prometheus_client's
file-backed metrics every 0.5 s, at each scrape and at exit, and any worker's /metrics sums
every process's files. Thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from recserve.processor.trace import STAGES, RequestTrace
from recserve.server.local_metrics import LocalCounter, LocalHistogram, LocalMetrics, RequestRecorder
from recserve.server.pool_flush import PoolFlush, add_counts, add_histogram
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
        # Counters and histograms are this process's plain numbers (local_metrics). One
        # process: made into samples when scraped. Worker processes (PROMETHEUS_MULTIPROC_DIR
        # set by `recserve serve --workers`): added to prometheus_client's file-backed twins
        # (pool_flush), and /metrics reads every process's files, plus the models.
        pooled = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        local = LocalMetrics()
        to_files = PoolFlush(local) if pooled else None
        if to_files is None:
            self.registry.register(local)

        def counter(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Any:
            family = LocalCounter(local, name, documentation, labelnames)
            if to_files is not None:
                to_files.pair(family, Counter(name, documentation, labelnames, registry=None))
            return family

        def histogram(name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> Any:
            family = LocalHistogram(local, name, documentation, labelnames, buckets)
            if to_files is not None:
                to_files.pair(family, Histogram(name, documentation, labelnames, buckets=buckets, registry=None))
            return family

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
        self._ok: dict[tuple[str, str], RequestRecorder] = {}
        self._failed: dict[tuple[str, str, int], tuple[Any, ...]] = {}
        self._local = local
        self._flushes: list[Callable[[], None]] = []
        self._to_files = to_files
        self._pool_registry: CollectorRegistry | None = None
        if to_files is not None:
            self._pool_registry = CollectorRegistry()
            MultiProcessCollector(self._pool_registry)
            self._pool_registry.register(ModelCollector(models))
            self.counted_elsewhere(to_files.flush)
            to_files.start()

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
            add_counts(self.requests.labels(model, route, "504"), counts.late)
            add_counts(self.errors.labels(model, route, "504"), counts.late)
            add_histogram(self.latency.labels(model, route), [counts.late] + [0] * len(LATENCY_BUCKETS), 0.0)
        if not counts.served:
            return
        add_counts(self.requests.labels(model, route, "200"), counts.served)
        add_counts(self.cpu.labels(model, route), counts.cpu_seconds)
        add_histogram(self.latency.labels(model, route), *counts.latency)
        for stage, (buckets, total) in zip(STAGES, counts.stages):
            add_histogram(self.stage.labels(model, stage), buckets, total)
        add_histogram(self.batch.labels(model), *counts.rows)

    def _recorder(self, model: str, route: str) -> RequestRecorder:
        """What records a 200 of (model, route): local_metrics' RequestRecorder (one lock,
        the values written in one call)."""
        return RequestRecorder(self._local.lock, self.requests.labels(model, route, "200"),
                               self.latency.labels(model, route), self.cpu.labels(model, route),
                               tuple(self.stage.labels(model, stage) for stage in STAGES), self.batch.labels(model))

    def counted_elsewhere(self, flush: Callable[[], None]) -> None:
        """`flush()` brings in values counted elsewhere: called before each scrape, newest
        first, so /metrics is current in this process. Newest first: a later one may count
        into what an earlier one moves (the gRPC front end's counts, add_native, go to this
        process's numbers, which a worker pool's flush then adds to the files)."""
        self._flushes.append(flush)

    def render(self) -> bytes:
        for flush in reversed(self._flushes):
            flush()
        return generate_latest(self._pool_registry or self.registry)

    def close(self) -> None:
        """A worker pool's: the flush thread stopped and the last values added to the files,
        where the other processes read them after this one exits. Nothing in one process."""
        if self._to_files is not None:
            self._to_files.close()


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
