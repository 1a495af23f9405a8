"""How far the load of a version has got, for people watching a load of many gigabytes.

A full version's work is counted in bytes of its files, twice: once as their checksums are
verified, once as its tables are built. While a load runs, the thread doing the work logs a
line every `log_every` seconds (bytes done / total, rate, ETA), and `snapshot()` gives the
same for `model_info()`, `/models`, `GET /v1/models/{name}` and the
`recserve_model_load_progress` gauge. Thread-safe: the load threads advance it together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LoadProgress"]

log = logging.getLogger("recserve.model_store")


class LoadProgress:
    def __init__(self, model: str, *, log_every: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._model = model
        self._log_every = log_every
        self._clock = clock
        self._lock = threading.Lock()
        self._what: str | None = None
        self._total = self._done = 0
        self._started = self._logged = 0.0

    def begin(self, what: str, total: int) -> None:
        """A load of `what` (e.g. "version 12") starts: `total` units (bytes) of work."""
        with self._lock:
            self._what, self._total, self._done = what, max(1, total), 0
            self._started = self._logged = self._clock()

    def advance(self, done: int) -> None:
        with self._lock:
            if self._what is None:
                return
            self._done = min(self._total, self._done + done)
            now = self._clock()
            if now - self._logged < self._log_every:
                return
            self._logged = now
            line = self._describe(now)
        log.info("model %r: loading %s", self._model, line)

    def end(self) -> None:
        with self._lock:
            self._what = None

    @property
    def fraction(self) -> float:
        """0..1 of the load running now; 1.0 when nothing loads."""
        with self._lock:
            return 1.0 if self._what is None else self._done / self._total

    def snapshot(self) -> dict[str, Any] | None:
        """The load running now, or None."""
        with self._lock:
            if self._what is None:
                return None
            rate, eta = self._rate_eta(self._clock())
            return {"loading": self._what, "percent": round(100 * self._done / self._total, 1),
                    "bytes_done": self._done, "bytes_total": self._total,
                    "rate_mib_s": round(rate / 2**20, 1), "eta_seconds": None if eta is None else round(eta, 1)}

    def _rate_eta(self, now: float) -> tuple[float, float | None]:
        elapsed = max(now - self._started, 1e-9)
        rate = self._done / elapsed
        return rate, ((self._total - self._done) / rate if rate > 0 else None)

    def _describe(self, now: float) -> str:
        rate, eta = self._rate_eta(now)
        eta_text = "unknown" if eta is None else f"{eta:.0f} s"
        return (f"{self._what}: {100 * self._done / self._total:.0f}% ({self._done / 2**30:.2f} of "
                f"{self._total / 2**30:.2f} GiB of checksums and tables), {rate / 2**20:.0f} MiB/s, ETA {eta_text}")
