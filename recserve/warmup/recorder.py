"""Recording a warmup file from live traffic: a uniform sample of the requests served."""

from __future__ import annotations

import os
import random
import threading

from recserve.warmup.warmup_file import write_warmup_file

__all__ = ["WarmupRecorder"]


class WarmupRecorder:
    """Keeps a uniform random sample (reservoir) of up to `limit` request payloads.

    Feed it the bytes of requests that were answered with 200, so the file replays
    traffic the model accepts. Thread-safe: `record` may be called from request threads
    (it holds a lock for a few list operations, never for I/O)."""

    def __init__(self, limit: int = 64, *, seed: int | None = None) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._limit = limit
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._kept: list[bytes] = []
        self._seen = 0

    def record(self, payload: bytes) -> None:
        with self._lock:
            self._seen += 1
            if len(self._kept) < self._limit:
                self._kept.append(bytes(payload))
                return
            slot = self._rng.randrange(self._seen)
            if slot < self._limit:
                self._kept[slot] = bytes(payload)

    @property
    def seen(self) -> int:
        return self._seen

    def requests(self) -> list[bytes]:
        with self._lock:
            return list(self._kept)

    def write(self, path: str | os.PathLike[str]) -> int:
        """Write the sample as a warmup file; returns how many requests it holds."""
        kept = self.requests()
        write_warmup_file(path, kept)
        return len(kept)
