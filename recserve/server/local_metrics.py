"""Counters and histograms kept as plain numbers in this process and turned into
Prometheus samples only when /metrics is scraped.

prometheus_client's Counter and Histogram take a lock and several Python calls per value:
recording one answered request (count, latency, CPU, four stages, batch size) cost ~13 us
of the event loop's time, on every request, for a page read every few seconds. These keep
a float (a counter) or a list of bucket counts and a sum (a histogram) per label set, and
`LocalMetrics.collect` builds the samples prometheus_client's own metrics would have given:
the same names, labels, `_total`, `_created`, `_bucket` (cumulative, `le` as
prometheus_client writes it), `_count` and `_sum`, so /metrics reads the same.

A worker pool (PROMETHEUS_MULTIPROC_DIR) records into these too, and does not scrape them:
recserve.server.pool_flush moves what they counted (`take`) into prometheus_client's
file-backed metrics, which /metrics on any worker sums over every process.

Thread-safe: one lock per `LocalMetrics`, held for an update (a few attribute writes) and
while a scrape copies the values.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

__all__ = ["HistogramChild", "LocalCounter", "LocalHistogram", "LocalMetrics", "RequestRecorder"]


class _CounterChild:
    __slots__ = ("_lock", "created", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def add(self, amount: float) -> None:
        """`inc` for a caller holding the LocalMetrics' lock (several values of one request)."""
        self.value += amount


class HistogramChild:
    __slots__ = ("_bounds", "_lock", "counts", "created", "sum")

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        with self._lock:
            self.add(value)

    def add_counts(self, counts: Sequence[int], total: float) -> None:
        """Observations already counted into these buckets (one count per bucket, the last
        above every bound) with their sum."""
        with self._lock:
            for i, n in enumerate(counts):
                self.counts[i] += n
            self.sum += total

    def add(self, value: float) -> None:
        """`observe` for a caller holding the LocalMetrics' lock."""
        self.counts[bisect_left(self._bounds, value)] += 1  # the first bound >= value: Prometheus's `le`
        self.sum += value


class RequestRecorder:
    """Records one answered request into its (model, route)'s children at once: its count,
    latency, CPU, stage seconds and rows, under the LocalMetrics' lock taken once. One call
    with the children's updates written out, not a call per value: this runs for every
    request (on the event loop for inline ones), and the calls were half its cost."""

    __slots__ = ("_batch", "_count", "_cpu", "_latency", "_lock", "_stages")

    def __init__(self, lock: threading.Lock, count: _CounterChild, latency: HistogramChild, cpu: _CounterChild,
                 stages: Sequence[HistogramChild], batch: HistogramChild) -> None:
        self._lock = lock
        self._count = count
        self._latency = latency
        self._cpu = cpu
        self._stages = tuple(stages)
        self._batch = batch

    def __call__(self, seconds: float, cpu_seconds: float, stage_seconds: Sequence[float], rows: int) -> None:
        """`stage_seconds`: one per stage child, in their order (0.0: the stage did not run)."""
        latency, batch = self._latency, self._batch
        with self._lock:
            self._count.value += 1.0
            latency.counts[bisect_left(latency._bounds, seconds)] += 1  # as HistogramChild.add
            latency.sum += seconds
            self._cpu.value += cpu_seconds
            for spent, stage in zip(stage_seconds, self._stages):
                if spent:
                    stage.counts[bisect_left(stage._bounds, spent)] += 1
                    stage.sum += spent
            if rows:
                batch.counts[bisect_left(batch._bounds, rows)] += 1
                batch.sum += rows


    def many(self, seconds: float, cpu_per_row: float, stage_seconds: Sequence[Sequence[float]],
             rows: Sequence[int]) -> None:
        """Several requests that took the same `seconds` (a merged call's), each with its
        stage seconds and rows, and `cpu_per_row` of CPU a row (at least one row each)."""
        latency, batch, stages = self._latency, self._batch, self._stages
        n = len(rows)
        with self._lock:
            self._count.value += n
            latency.counts[bisect_left(latency._bounds, seconds)] += n
            latency.sum += seconds * n
            self._cpu.value += cpu_per_row * sum(r if r > 0 else 1 for r in rows)
            for spent_each in stage_seconds:
                for spent, stage in zip(spent_each, stages):
                    if spent:
                        stage.counts[bisect_left(stage._bounds, spent)] += 1
                        stage.sum += spent
            for count in rows:
                if count:
                    batch.counts[bisect_left(batch._bounds, count)] += 1
                    batch.sum += count


class _Family:
    """A metric's name, help, label names and children (one per label values, made on first use)."""

    def __init__(self, owner: LocalMetrics, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lock = owner.lock
        self._children: dict[tuple[str, ...], object] = {}
        owner.add(self)

    def _child(self, values: tuple[str, ...]) -> object:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            with self._lock:
                child = self._children.get(values)
                if child is None:
                    child = self._children[values] = self._new_child()
        return child

    def _new_child(self) -> object:
        raise NotImplementedError

    def snapshot(self) -> list[tuple[dict[str, str], object]]:
        with self._lock:
            return [(dict(zip(self.labelnames, map(str, values))), self._copy(child))
                    for values, child in self._children.items()]

    def _copy(self, child: object) -> object:
        raise NotImplementedError

    def take(self) -> list[tuple[tuple[str, ...], object]]:
        """Each child's label values and what it counted since the last take, its values
        then zeroed (the caller holds the LocalMetrics' lock): a counter's amount, a
        histogram's (bucket counts, sum)."""
        return [(values, self._take(child)) for values, child in self._children.items()]

    def _take(self, child: object) -> object:
        raise NotImplementedError

    def metric(self) -> Metric:
        raise NotImplementedError


class LocalCounter(_Family):
    """prometheus_client.Counter's interface (labels(), inc()); a counter without labels has
    its one child (value 0) from the start, as prometheus_client's does."""

    def __init__(self, owner: LocalMetrics, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(owner, name, documentation, labelnames)
        if not self.labelnames:
            self._child(())

    def _new_child(self) -> _CounterChild:
        return _CounterChild(self._lock)

    def labels(self, *values: str) -> _CounterChild:
        return self._child(values)  # type: ignore[return-value]

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def _copy(self, child: object) -> tuple[float, float]:
        assert isinstance(child, _CounterChild)
        return child.value, child.created

    def _take(self, child: object) -> float:
        assert isinstance(child, _CounterChild)
        amount, child.value = child.value, 0.0
        return amount

    def metric(self) -> Metric:
        metric = Metric(self.name, self.documentation, "counter")
        for labels, (value, created) in self.snapshot():  # type: ignore[misc]
            metric.samples.append(Sample(f"{self.name}_total", labels, value))
            metric.samples.append(Sample(f"{self.name}_created", labels, created))
        return metric


class LocalHistogram(_Family):
    """prometheus_client.Histogram's interface (labels(), observe()) with fixed `buckets`
    (upper bounds, ascending; +Inf is added)."""

    def __init__(self, owner: LocalMetrics, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float]) -> None:
        self._bounds = tuple(float(b) for b in buckets)
        self._les = [*(floatToGoString(b) for b in self._bounds), "+Inf"]
        super().__init__(owner, name, documentation, labelnames)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._lock, self._bounds)

    def labels(self, *values: str) -> HistogramChild:
        return self._child(values)  # type: ignore[return-value]

    def _copy(self, child: object) -> tuple[list[int], float, float]:
        assert isinstance(child, HistogramChild)
        return list(child.counts), child.sum, child.created

    def _take(self, child: object) -> tuple[list[int], float]:
        assert isinstance(child, HistogramChild)
        # In place: RequestRecorders hold the child and write its list.
        counts, total = list(child.counts), child.sum
        child.counts[:] = [0] * len(counts)
        child.sum = 0.0
        return counts, total

    def metric(self) -> Metric:
        metric = Metric(self.name, self.documentation, "histogram")
        samples = metric.samples
        for labels, (counts, total, created) in self.snapshot():  # type: ignore[misc]
            running = 0
            for le, count in zip(self._les, counts):
                running += count
                samples.append(Sample(f"{self.name}_bucket", {**labels, "le": le}, float(running)))
            samples.append(Sample(f"{self.name}_count", labels, float(running)))
            samples.append(Sample(f"{self.name}_sum", labels, total))
            samples.append(Sample(f"{self.name}_created", labels, created))
        return metric


class LocalMetrics(Collector):
    """The families made with it, collected in the order they were made."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._families: list[_Family] = []

    def add(self, family: _Family) -> None:
        self._families.append(family)

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family.metric()
