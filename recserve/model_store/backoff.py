"""How long to wait after failures, and the one place that waits.

`Backoff.compute(failures)` is pure: exponential from `base` up to `cap`. `Retry.call`
runs an action until it succeeds, asking `Backoff` how long to pause between attempts
and pausing through an injected `wait`, so tests pass a `wait` that records instead of
sleeping. The updater also paces its polls through the same `Retry.wait`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from recserve.errors import RecserveError

__all__ = ["Backoff", "Retry", "Stopped", "event_wait"]

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: `base` seconds after the first failure, doubling, at most `cap`.
    Immutable; thread-safe."""

    base: float = 1.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.cap >= self.base):
            raise ValueError(f"Backoff needs 0 <= base <= cap, got base={self.base}, cap={self.cap}")

    def compute(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failures (0 after none)."""
        if failures <= 0 or self.base == 0:
            return 0.0
        # 2**failures overflows float for huge counts; the cap is reached long before.
        return min(self.cap, self.base * 2.0 ** min(failures - 1, 64))


class Stopped(Exception):
    """Raised by `Retry.call` when its `wait` reports that the owner is shutting down."""


def event_wait(stop: threading.Event) -> Callable[[float], bool]:
    """A `wait` for `Retry`: sleeps up to `seconds`, returns False as soon as `stop` is set."""

    def wait(seconds: float) -> bool:
        return not stop.wait(seconds)

    return wait


class Retry:
    """Calls an action until it succeeds, pausing `backoff.compute(n)` after the n-th failure.

    `wait(seconds) -> bool` is the only thing that sleeps; returning False means "stop":
    `call` then raises `Stopped`. Only `RecserveError`s are retried (storage outages,
    incomplete or corrupt versions); anything else is a bug and propagates.
    Thread-safe if `wait` is (`event_wait` is)."""

    def __init__(self, backoff: Backoff, wait: Callable[[float], bool]) -> None:
        self.backoff = backoff
        self.wait = wait

    def call(self, do: Callable[[], T], on_error: Callable[[RecserveError, int], None]) -> T:
        """`do()`'s result; after each failure `on_error(exc, failures)`, then a pause."""
        failures = 0
        while True:
            try:
                return do()
            except RecserveError as exc:
                failures += 1
                on_error(exc, failures)
                if not self.wait(self.backoff.compute(failures)):
                    raise Stopped() from exc
