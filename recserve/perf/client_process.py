"""What one client process does for one point of the run: keep N connections busy, each
with one request in flight, and record every answer completed inside the measured window.

Runs in a pool process (spawned), so it imports little and returns plain data. A
connection that fails (server down) waits a little before trying again, so a dead
server costs errors, not a spinning client.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.perf.connections import OK, open_connection

__all__ = ["Job", "Samples", "init_progress", "run_job"]

RETRY_PAUSE = 0.05  # seconds a connection waits after a failed send before the next one

_progress: Any = None  # a shared array: measured answers so far, one slot per job


def init_progress(counter: Any) -> None:
    """Pool initializer: the shared progress counters (multiprocessing.RawArray). Imports
    the clients' libraries now, so a point's window never opens on a process still
    importing them (grpc.aio alone takes a good part of a second)."""
    global _progress
    _progress = counter
    import grpc.aio  # noqa: F401
    import uvloop  # noqa: F401


@dataclass(frozen=True)
class Job:
    url: str
    grpc: bool
    payloads: Sequence[tuple[bytes, str]]   # (request bytes, gRPC method or "")
    connections: int
    start_at: float      # time.time() at which the measured window opens (load starts at once)
    duration: float
    timeout: float
    slot: int            # this job's progress counter


@dataclass
class Samples:
    done: np.ndarray          # completion time of each measured answer, seconds after the window opened
    latency: np.ndarray       # its latency, seconds
    ok: np.ndarray            # whether it succeeded
    statuses: dict[str, int]  # measured answers by status ("200", "OK", "503", "timeout", ...)
    cpu_seconds: float        # this process's CPU over the window
    wall_seconds: float
    first_error: str = ""     # the first failure's text, for the report


def _loop_factory(grpc: bool) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if grpc:
        return None  # grpc.aio wants asyncio's own loop
    import uvloop
    return uvloop.new_event_loop


async def _run(job: Job) -> Samples:
    # Connections open before the window: a client process still importing grpc or
    # connecting when the window opens (a loaded machine) would otherwise count its set-up
    # as the server's time, or serve nothing at all in a short window. Its window then
    # opens when it is ready: each process still measures `duration`.
    conns = [open_connection(job.url, job.grpc) for _ in range(job.connections)]
    first_error: list[str] = []
    for failed in await asyncio.gather(*(c.connect(job.timeout) for c in conns), return_exceptions=True):
        if isinstance(failed, ConnectionError | TimeoutError) and not first_error:
            first_error.append(str(failed) or "connection timed out")
        elif isinstance(failed, BaseException):
            raise failed
    start = max(time.perf_counter() + (job.start_at - time.time()), time.perf_counter())
    end = start + job.duration
    done: list[float] = []
    latency: list[float] = []
    ok: list[bool] = []
    statuses: Counter[str] = Counter()
    counter, slot = _progress, job.slot
    n = len(job.payloads)

    async def connection(i: int) -> None:
        conn = conns[i]
        k = (i * 7919) % n  # connections start at different requests
        try:
            while (t0 := time.perf_counter()) < end:
                data, method = job.payloads[k]
                k = k + 1 if k + 1 < n else 0
                failed = False
                try:
                    status = await conn.send(data, method, job.timeout)
                except TimeoutError:
                    status, failed = "timeout", True
                except ConnectionError as exc:
                    status, failed = "connection-error", True
                    if not first_error:
                        first_error.append(str(exc))
                t1 = time.perf_counter()
                if start <= t1 <= end:
                    done.append(t1 - start)
                    latency.append(t1 - t0)
                    good = status in OK
                    ok.append(good)
                    statuses[status] += 1
                    if counter is not None:
                        counter[slot] += 1
                if failed:
                    await asyncio.sleep(RETRY_PAUSE)
        finally:
            conn.close()

    tasks = [asyncio.ensure_future(connection(i)) for i in range(job.connections)]
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*tasks)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await asyncio.sleep(0)  # let closes scheduled by the connections run
    return Samples(np.array(done), np.array(latency), np.array(ok, dtype=bool), dict(statuses), cpu, wall,
                   first_error[0] if first_error else "")


def run_job(job: Job) -> Samples:
    with asyncio.Runner(loop_factory=_loop_factory(job.grpc)) as runner:
        return runner.run(_run(job))
