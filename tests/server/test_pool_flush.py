"""recserve.server.pool_flush: a worker pool's per-request values, recorded as one process
records them and added in bulk to prometheus_client's metrics, read as prometheus_client's
own updates one by one would; each value added exactly once, none lost to a flush racing
requests from several threads, and at close the last ones in the multiprocess files that
the other workers read (a real PROMETHEUS_MULTIPROC_DIR, in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from recserve.server.local_metrics import LocalCounter, LocalHistogram, LocalMetrics, RequestRecorder
from recserve.server.pool_flush import PoolFlush
from tests.server.conftest import ROOT
from tests.server.prometheus_updates import CALLS, STAGES, observe_one_by_one
from tests.threads import Threads

BUCKETS = (0.0001, 0.001, 0.25, 1.0, 2.5)


def _families(counter: Any, histogram: Any) -> tuple[Any, ...]:
    """A request's families as ServerMetrics has them, and a failure counter with no labels."""
    return (counter("t_requests", "Requests.", ["model", "route", "code"]),
            histogram("t_seconds", "Seconds.", ["model", "route"], BUCKETS),
            counter("t_cpu", "CPU.", ["model", "route"]),
            histogram("t_stage", "Stages.", ["model", "stage"], BUCKETS),
            histogram("t_batch", "Rows.", ["model"], (1.0, 8.0, 64.0)),
            counter("t_refused", "Refused."))


class _Pool:
    """A worker's families: local values, flushed to prometheus_client twins in `registry`."""

    def __init__(self) -> None:
        self.local, self.registry = LocalMetrics(), CollectorRegistry()
        self.families = _families(lambda *a: LocalCounter(self.local, *a),
                                  lambda *a: LocalHistogram(self.local, *a))
        files = _families(lambda *a: Counter(*a, registry=self.registry),
                          lambda *a: Histogram(*a[:3], buckets=a[3], registry=self.registry))
        self.flush = PoolFlush(self.local)
        for family, twin in zip(self.families, files):
            self.flush.pair(family, twin)
        requests, seconds, cpu, stage, batch, self.refused = self.families
        self.record = RequestRecorder(self.local.lock, requests.labels("m", "eas", "200"), seconds.labels("m", "eas"),
                                      cpu.labels("m", "eas"), [stage.labels("m", s) for s in STAGES],
                                      batch.labels("m"))

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def _one_by_one(repeat: int) -> str:
    """CALLS `repeat` times as prometheus_client's own updates (what a pool recorded before)."""
    registry = CollectorRegistry()
    requests, seconds, cpu, stage, batch, refused = _families(
        lambda *a: Counter(*a, registry=registry), lambda *a: Histogram(*a[:3], buckets=a[3], registry=registry))
    for name in STAGES:  # made in the same order as the pool's
        stage.labels("m", name)
    for _ in range(repeat):
        observe_one_by_one(requests, seconds, cpu, stage, batch, CALLS)
        refused.inc()
    return generate_latest(registry).decode()


def _without_created(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "_created" not in line)


def test_a_flush_adds_what_was_recorded_since_the_last_exactly_once() -> None:
    pool = _Pool()
    empty = pool.text()
    for _ in range(3):
        for call in CALLS:
            pool.record(*call)
        pool.refused.inc()
    assert pool.text() == empty  # recorded, not yet flushed
    pool.flush.flush()
    flushed = pool.text()
    assert _without_created(flushed) == _without_created(_one_by_one(3))
    assert 't_requests_total{code="200",model="m",route="eas"} 12.0' in flushed
    assert "t_refused_total 3.0" in flushed
    pool.flush.flush()   # nothing recorded since: nothing added
    pool.flush.flush()
    assert pool.text() == flushed
    for call in CALLS:   # then only what came after
        pool.record(*call)
    pool.refused.inc()
    pool.flush.flush()
    assert _without_created(pool.text()) == _without_created(_one_by_one(4))


def test_a_flush_racing_requests_loses_none() -> None:
    pool = _Pool()
    recorders_done = threading.Event()
    flushes = [0]

    def record() -> None:
        for _ in range(2_000):
            for call in CALLS:
                pool.record(*call)
            pool.refused.inc()

    def flush_until_done() -> None:
        while not recorders_done.is_set():
            pool.flush.flush()
            flushes[0] += 1

    flusher = Threads([flush_until_done], "flushing")
    try:
        Threads([record] * 4, "recording requests").join(timeout=120)
    finally:
        recorders_done.set()
        flusher.join(timeout=60)
    assert flushes[0] > 1
    pool.flush.flush()
    assert _without_created(pool.text()) == _without_created(_one_by_one(8_000))


# A pool worker's ServerMetrics with the real multiprocess files: requests recorded, read
# back from the files while it runs (its flush thread) and after it exits as a worker does
# (close() in run_server's finally, then os._exit: no atexit, no other flush).
_WORKER = """
import json, os, sys, time
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from recserve.processor.trace import RequestTrace, Span
from recserve.server.metrics import ServerMetrics
from recserve.server.registry import ModelRegistry

def answered():
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return sum(s.value for m in registry.collect() for s in m.samples
               if s.name == "recserve_requests_total" and s.labels["code"] == "200")

metrics = ServerMetrics(ModelRegistry([]))
ticks = []
elsewhere = metrics.counted_elsewhere(lambda: ticks.append(1))  # as the gRPC front end's flush
def request(rows):
    trace = RequestTrace([Span(stage, 0, 2 ** 20) for stage in ("decode", "lookup", "run", "encode")], rows)
    metrics.observe("m", "eas", 200, 2 ** -10, trace, 2 ** -12)

for _ in range(5):
    request(3)
deadline = time.monotonic() + 10
while answered() != 5 and time.monotonic() < deadline:  # the flush thread, no scrape
    time.sleep(0.01)
seen = answered()
for _ in range(4):
    request(2)
metrics.observe("m", "eas", 503, 0.0, RequestTrace())
metrics.close()
print(json.dumps({"seen": seen, "elsewhere": elsewhere, "ticked": len(ticks) > 0}), flush=True)
os._exit(0)
"""


def test_a_workers_last_requests_reach_the_files_at_close(tmp_path: Path) -> None:
    files = tmp_path / "metrics"
    files.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(files)}
    done = subprocess.run([sys.executable, "-c", _WORKER], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    # The flush thread also ran the other flush hooks (no thread of their own needed).
    assert json.loads(done.stdout) == {"seen": 5, "elsewhere": True, "ticked": True}
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(files))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples}
    eas = (("model", "m"), ("route", "eas"))
    assert samples[("recserve_requests_total", (("code", "200"), *eas))] == 9
    assert samples[("recserve_requests_total", (("code", "503"), *eas))] == 1
    assert samples[("recserve_request_errors_total", (("code", "503"), *eas))] == 1
    assert samples[("recserve_request_seconds_count", eas)] == 10
    assert samples[("recserve_request_seconds_sum", eas)] == 9 * 2 ** -10
    assert samples[("recserve_request_cpu_seconds_total", eas)] == 9 * 2 ** -12
    assert samples[("recserve_batch_size_sum", (("model", "m"),))] == 5 * 3 + 4 * 2
    assert samples[("recserve_stage_seconds_count", (("model", "m"), ("stage", "run")))] == 9
    # 2**20 ns is not a binary fraction of a second: its sums round.
    assert samples[("recserve_stage_seconds_sum", (("model", "m"), ("stage", "run")))] == pytest.approx(
        9 * 2 ** 20 / 1e9, rel=1e-12)


def test_one_process_keeps_its_numbers_and_starts_no_flush_thread() -> None:
    from recserve.processor.trace import RequestTrace
    from recserve.server.metrics import ServerMetrics
    from recserve.server.registry import ModelRegistry

    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    metrics = ServerMetrics(ModelRegistry([]))
    metrics.observe("m", "eas", 200, 0.5, RequestTrace(batch_size=2), 0.25)
    assert 'recserve_requests_total{code="200",model="m",route="eas"} 1.0' in metrics.render().decode()
    assert not [t for t in threading.enumerate() if t.name == "recserve-metrics-flush"]
    assert metrics.counted_elsewhere(lambda: None) is False  # its caller keeps its own thread
    metrics.close()
