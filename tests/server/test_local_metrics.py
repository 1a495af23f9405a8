"""recserve.server.local_metrics against prometheus_client itself: the same updates give the
same /metrics text (every sample's name, labels and value; `_created` is a time, compared
by presence), from several threads at once without a lost update."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from recserve.server.local_metrics import LocalCounter, LocalHistogram, LocalMetrics
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
