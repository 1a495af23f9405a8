"""The client processes that generate the load, kept for the whole run (spawning one
costs about a second), and the split of a point's connections among them.

One Python process sends some thousands of requests per second before its own CPU is
the limit; several processes keep the client from being the bottleneck at the rates
recserve reaches. Each job reports its CPU use, so the run can say when it was.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

from recserve.perf.client_process import Job, Samples, init_progress, run_job

__all__ = ["ClientPool", "default_processes", "split"]

START_MARGIN = 0.3  # seconds between handing out the jobs and the load starting


def default_processes(max_concurrency: int) -> int:
    return max(1, min(os.cpu_count() or 1, max_concurrency))


def split(connections: int, processes: int) -> list[int]:
    """`connections` spread over at most `processes` processes, none empty."""
    used = min(connections, processes)
    return [connections // used + (1 if i < connections % used else 0) for i in range(used)]


class ClientPool:
    """A pool of spawned client processes. Not thread-safe: one point at a time."""

    def __init__(self, processes: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.processes = processes
        self._counter = ctx.RawArray("q", processes)
        self._pool = ctx.Pool(processes, initializer=init_progress, initargs=(self._counter,))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()

    def run(self, url: str, grpc: bool, payloads: Sequence[tuple[bytes, str]], concurrency: int,
            duration: float, warmup: float, timeout: float,
            progress: Callable[[float, int], None] | None = None, start_at: float | None = None) -> list[Samples]:
        """Load at `concurrency` requests in flight: `warmup` seconds unmeasured, then
        `duration` measured from `start_at` (a time.time(); default: as soon as the
        warmup allows). `progress(seconds into the window, answers so far)` is called a
        few times a second."""
        shares = split(concurrency, self.processes)
        for i in range(self.processes):
            self._counter[i] = 0
        if start_at is None:
            start_at = time.time() + START_MARGIN + warmup
        jobs = [Job(url, grpc, payloads, n, start_at, duration, timeout, slot) for slot, n in enumerate(shares)]
        result = self._pool.map_async(run_job, jobs, chunksize=1)
        while not result.ready():
            result.wait(0.25)
            if progress is not None:
                progress(max(0.0, min(duration, time.time() - start_at)), sum(self._counter))
        return result.get()
