"""recserve.server.local_metrics against prometheus_client itself: the same updates give the
same /metrics text (every sample's name, labels and value; `_created` is a time, compared
by presence), from several threads at once without a lost update."""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from recserve.server.local_metrics import LocalCounter, LocalHistogram, LocalMetrics, RequestRecorder
from recserve.server.pool_flush import PoolFlush
from tests.server.prometheus_updates import CALLS, STAGES, observe_one_by_one
from tests.threads import Threads

BUCKETS = (0.0001, 0.001, 0.25, 1.0, 2.5)


def _families(local: LocalMetrics, registry: CollectorRegistry) -> tuple[tuple[object, ...], tuple[object, ...]]:
    ours = (LocalCounter(local, "t_requests", "Requests.", ["model", "code"]),
            LocalCounter(local, "t_refused", "Refused."),
            LocalHistogram(local, "t_seconds", "Seconds.", ["model"], BUCKETS))
    theirs = (Counter("t_requests", "Requests.", ["model", "code"], registry=registry),
              Counter("t_refused", "Refused.", registry=registry),
              Histogram("t_seconds", "Seconds.", ["model"], buckets=BUCKETS, registry=registry))
    return ours, theirs


def _request_families(counter: Any, histogram: Any) -> tuple[Any, ...]:
    """The families a request is recorded into (as ServerMetrics has them), made by
    `counter(name, help, labels)` and `histogram(name, help, labels, buckets)`."""
    return (counter("t_requests", "Requests.", ["model", "route", "code"]),
            histogram("t_seconds", "Seconds.", ["model", "route"], BUCKETS),
            counter("t_cpu", "CPU.", ["model", "route"]),
            histogram("t_stage", "Stages.", ["model", "stage"], BUCKETS),
            histogram("t_batch", "Rows.", ["model"], (1.0, 8.0, 64.0)))


def _without_created_values(text: bytes) -> str:
    return re.sub(r"(?m)^(\w+_created(?:\{[^}]*\})?) \S+$", r"\1 T", text.decode())


def test_same_text_as_prometheus_client() -> None:
    local, registry = LocalMetrics(), CollectorRegistry()
    ours_registry = CollectorRegistry()
    ours_registry.register(local)
    ours, theirs = _families(local, registry)
    # Values on bucket bounds (le is inclusive), between, beyond the last, and zero.
    values = [0.0, 0.0001, 0.00011, 0.001, 0.3, 1.0, 2.5, 2.6, 100.0]
    for family in (ours, theirs):
        requests, refused, seconds = family
        requests.labels("a", "200").inc()
        requests.labels("a", "200").inc(2.5)
        requests.labels("b", "503").inc()
        refused.inc()
        for value in values:
            seconds.labels("a").observe(value)
        seconds.labels("b").observe(0.5)
    ours_text, theirs_text = generate_latest(ours_registry), generate_latest(registry)
    assert _without_created_values(ours_text) == _without_created_values(theirs_text)
    assert 't_seconds_bucket{le="0.0001",model="a"} 2.0' in ours_text.decode()  # 0.0 and the bound itself
    assert 't_seconds_bucket{le="+Inf",model="a"} 9.0' in ours_text.decode()


def test_labels_must_match_the_family() -> None:
    local = LocalMetrics()
    requests = LocalCounter(local, "t_requests", "Requests.", ["model", "code"])
    try:
        requests.labels("a")
    except ValueError as exc:
        assert str(exc) == "t_requests takes labels ('model', 'code'), got ('a',)"
    else:
        raise AssertionError("labels() with one value of two was accepted")


def test_no_update_is_lost_across_threads() -> None:
    local = LocalMetrics()
    counter = LocalCounter(local, "t_requests", "Requests.", ["model"])
    histogram = LocalHistogram(local, "t_seconds", "Seconds.", ["model"], BUCKETS)

    def hammer() -> None:
        child, series = counter.labels("a"), histogram.labels("a")
        for _ in range(20_000):
            child.inc()
            with local.lock:  # as ServerMetrics.observe records a request's values
                series.add(0.5)

    Threads([hammer] * 4, "updating one counter and one histogram").join(timeout=60)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in local.collect() for s in m.samples}
    assert samples[("t_requests_total", (("model", "a"),))] == 80_000
    assert samples[("t_seconds_count", (("model", "a"),))] == 80_000
    assert samples[("t_seconds_sum", (("model", "a"),))] == 40_000
    assert samples[("t_seconds_bucket", (("le", "1.0"), ("model", "a")))] == 80_000
    assert samples[("t_seconds_bucket", (("le", "0.25"), ("model", "a")))] == 0


def test_request_recorder_same_text_as_prometheus_client_updates() -> None:
    """A request recorded in one call (RequestRecorder, one process) reads as the same
    requests' counter and histogram updates made one by one with prometheus_client (a worker
    pool), from several threads at once."""
    local, registry = LocalMetrics(), CollectorRegistry()
    ours_registry = CollectorRegistry()
    ours_registry.register(local)

    requests, seconds, cpu, stage, batch = _request_families(
        lambda *a: LocalCounter(local, *a), lambda *a: LocalHistogram(local, *a))
    record = RequestRecorder(local.lock, requests.labels("m", "eas", "200"), seconds.labels("m", "eas"),
                             cpu.labels("m", "eas"), [stage.labels("m", s) for s in STAGES], batch.labels("m"))
    theirs_families = _request_families(
        lambda *a: Counter(*a, registry=registry), lambda *a: Histogram(*a[:3], buckets=a[3], registry=registry))
    for name in STAGES:  # the children made in the same order (as ServerMetrics makes them up front)
        theirs_families[3].labels("m", name)

    def ours() -> None:
        for _ in range(500):
            for call in CALLS:
                record(*call)

    def theirs() -> None:
        for _ in range(500):
            observe_one_by_one(*theirs_families, CALLS)

    Threads([ours] * 4 + [theirs] * 4, "recording requests both ways").join(timeout=60)
    ours_text, theirs_text = generate_latest(ours_registry), generate_latest(registry)
    assert _without_created_values(ours_text) == _without_created_values(theirs_text)
    assert 't_requests_total{code="200",model="m",route="eas"} 8000.0' in ours_text.decode()
    assert 't_stage_count{model="m",stage="lookup"} 4000.0' in ours_text.decode()  # zeros are not observed


def _recorder(pooled: bool) -> tuple[CollectorRegistry, RequestRecorder, PoolFlush | None]:
    """A request recorder (local_metrics' values) and the registry that reads it: one
    process's (the values themselves) or a worker pool's (prometheus_client's children, which
    the PoolFlush returned adds the values to)."""
    local, registry = LocalMetrics(), CollectorRegistry()
    families = _request_families(lambda *a: LocalCounter(local, *a), lambda *a: LocalHistogram(local, *a))
    flush = None
    if pooled:
        flush = PoolFlush(local)
        files = _request_families(lambda *a: Counter(*a, registry=registry),
                                  lambda *a: Histogram(*a[:3], buckets=a[3], registry=registry))
        for family, twin in zip(families, files):
            flush.pair(family, twin)
    else:
        registry.register(local)
    requests, seconds, cpu, stage, batch = families
    children = (requests.labels("m", "eas", "200"), seconds.labels("m", "eas"), cpu.labels("m", "eas"),
                [stage.labels("m", s) for s in ("decode", "lookup", "run", "encode")], batch.labels("m"))
    return registry, RequestRecorder(local.lock, *children), flush


PER_ROW = 2 ** -16


@pytest.mark.parametrize(("pooled", "stage_seconds", "rows", "lines"), [
    (False, [(2 ** -16, 0.0, 2 ** -12, 0.25), (0.0, 2 ** -13, 2 ** -12, 2 ** -14), (1.0, 1.0, 1.0, 1.0)], [1, 0, 64],
     ['t_requests_total{code="200",model="m",route="eas"} 3.0',
      f't_cpu_total{{model="m",route="eas"}} {PER_ROW * 66}']),  # the row-less request counts one row
    (True, [(2 ** -16, 0.0, 2 ** -12, 0.25), (0.0, 2 ** -13, 2 ** -12, 2 ** -14), (1.0, 1.0, 1.0, 100.0),
            (2 ** -16, 2 ** -16, 2 ** -16, 2 ** -16)], [1, 0, 64, 100],
     ['t_stage_bucket{le="+Inf",model="m",stage="encode"} 4.0', 't_batch_bucket{le="64.0",model="m"} 2.0',
      't_batch_count{model="m"} 3.0']),
], ids=["one-process", "worker-pool"])
def test_a_merged_calls_requests_recorded_at_once_read_as_recorded_one_by_one(
        pooled: bool, stage_seconds: list[tuple[float, ...]], rows: list[int], lines: list[str]) -> None:
    """`many` (a merged call's requests: one latency, CPU shared by rows) reads as the
    recorder called for each of them, in one process and in a worker pool (the values
    flushed to prometheus_client's children)."""
    took = 2 ** -10
    at_once, recorder, flush = _recorder(pooled)
    recorder.many(took, PER_ROW, stage_seconds, rows)
    one_by_one, single, flush_single = _recorder(pooled)
    for spent, count in zip(stage_seconds, rows):
        single(took, PER_ROW * max(count, 1), spent, count)
    for each in (flush, flush_single):
        if each is not None:
            each.flush()
    text = generate_latest(at_once).decode()
    assert _without_created_values(text.encode()) == _without_created_values(generate_latest(one_by_one))
    for line in lines:
        assert line in text
