"""A worker pool's per-request metrics, moved in bulk into prometheus_client's files.

In a pool (`recserve serve --workers`) each value of prometheus_client's metrics is a
multiprocess file entry: an update costs a lock, an os.getpid() call and an mmap write,
and an answered request made ~14 of them (perf put them at ~12% of a worker's loop at
batch 1). So a worker records its requests as one process does, into its own plain numbers
(recserve.server.local_metrics: one lock, a few additions), and `PoolFlush.flush` adds
what they counted since the last flush to the files: every FLUSH_SECONDS on a daemon
thread, before each /metrics scrape in this process, and at close (the worker's exit), so
the last requests reach the files the other processes read. /metrics on one worker may
therefore lag the others' requests by up to FLUSH_SECONDS.

Also here: the bulk adds (a count, a histogram's bucket counts and sum) into either kind of
child, which the gRPC front end's counts use as well (ServerMetrics.add_native).

Thread-safe: one flush at a time (a scrape's flush waits for the thread's, so the page it
renders has them).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from recserve.server.local_metrics import HistogramChild, LocalCounter, LocalHistogram, LocalMetrics

__all__ = ["FLUSH_SECONDS", "PoolFlush", "add_counts", "add_histogram"]

FLUSH_SECONDS = 0.5


def add_counts(counter: Any, amount: float) -> None:
    counter.inc(amount)


def add_histogram(histogram: Any, buckets: Sequence[int], total: float) -> None:
    """Observations already put in `histogram`'s buckets (the same bounds; the last above
    every bound) added to it: a local one's counts, or a prometheus_client child's bucket
    values (one add per bucket hit, one to the sum)."""
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


class PoolFlush:
    """Adds what `local`'s families counted to their prometheus_client twins (`pair`)."""

    def __init__(self, local: LocalMetrics) -> None:
        self._local = local
        self._pairs: list[tuple[LocalCounter | LocalHistogram, Any]] = []
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # (pair, label values) -> files' child
        self._lock = threading.Lock()   # one flush at a time
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def pair(self, family: LocalCounter | LocalHistogram, files: Any) -> None:
        """`files`: the prometheus_client Counter or Histogram (same name, labels and
        buckets) that `family`'s values go to."""
        self._pairs.append((family, files))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="recserve-metrics-flush", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.wait(FLUSH_SECONDS):
            self.flush()

    def flush(self) -> None:
        """Add each series' counts since the last flush to the files, exactly once."""
        with self._lock:
            with self._local.lock:  # every family at once: a request's values move together
                taken = [family.take() for family, _ in self._pairs]
            for at, ((family, files), series) in enumerate(zip(self._pairs, taken)):
                histogram = isinstance(family, LocalHistogram)
                for values, counted in series:
                    child = self._children.get((at, values))
                    if child is None:  # made at first sight, as the series appears at once in one process
                        child = self._children[at, values] = files.labels(*values) if values else files
                    if histogram:
                        buckets, total = counted
                        if any(buckets):
                            add_histogram(child, buckets, total)
                    elif counted:
                        add_counts(child, counted)

    def close(self) -> None:
        """Stop the thread and flush what is left (the process is about to exit)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()
