"""The threads a version loads on: checksums and tables of many files at once.

Loading is a sequence of per-file steps that release the GIL (sha256 over 8 MiB chunks,
reading, numpy copies into the engine's row layout, the native index build), so files
processed side by side use every core: one thread reaches ~0.3 GiB/s on this project's
2-core machine, bound by whichever step runs, not by the disk. Results come back in the
input's order, and the first failure in that order is the one raised, so a corrupt version
is reported the same way however the threads interleaved. Thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["load_threads", "map_in_threads"]

T = TypeVar("T")
R = TypeVar("R")

# More threads than cores only add contention; past a few, the disk or memory bandwidth binds.
_MAX_THREADS = 8


def load_threads() -> int:
    return max(1, min(_MAX_THREADS, os.cpu_count() or 1))


def map_in_threads(fn: Callable[[T], R], items: Iterable[T], threads: int | None = None) -> list[R]:
    """[fn(item) for item in items], on up to `threads` threads (default load_threads())."""
    work = list(items)
    count = min(len(work), threads or load_threads())
    if count <= 1:
        return [fn(item) for item in work]
    with ThreadPoolExecutor(count, thread_name_prefix="recserve-load") as pool:
        futures = [pool.submit(fn, item) for item in work]
        return [future.result() for future in futures]  # the first failure, in input order
