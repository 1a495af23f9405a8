"""Worker threads for tests: each target's exception is re-raised in the test, and a thread
still running after its timeout fails the test naming what it was doing, instead of hanging
CI or passing with a dead worker (pyproject's filterwarnings also turns any other thread's
unhandled exception into a failure)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


class Threads:
    """Runs each target on its own thread from construction; `join` waits for all of them.

    `breaks`: barriers the test's own thread waits on with the workers; a worker's failure
    aborts them, so the test stops waiting at once instead of at the barrier's timeout."""

    def __init__(self, targets: Sequence[Callable[[], Any]], what: str,
                 *, breaks: Sequence[threading.Barrier] = ()) -> None:
        self.what = what
        self._breaks = list(breaks)
        self._results: list[Any] = [None] * len(targets)
        self._errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, args=(i, target), name=f"{what} #{i}", daemon=True)
            for i, target in enumerate(targets)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int, target: Callable[[], Any]) -> None:
        try:
            self._results[index] = target()
        except BaseException as error:  # noqa: BLE001 - re-raised by join/check, in the test's thread
            self._errors.append(error)
            for barrier in self._breaks:
                barrier.abort()

    def check(self) -> None:
        """Raises the first worker's exception, if one has failed by now."""
        if self._errors:
            raise self._errors[0]

    def join(self, timeout: float) -> list[Any]:
        """Each target's return value, in order. Raises the first worker's exception, or an
        AssertionError naming `what` if a thread is still running after `timeout` seconds
        in all."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self.check()
        assert not alive, f"still running after {timeout} s: {', '.join(alive)}"
        return self._results


def wait_for(event: threading.Event, timeout: float, what: str, workers: Threads | None = None) -> None:
    """Waits for `event`; fails naming `what` if it is not set within `timeout` seconds, or
    at once with a worker's exception if one of `workers` failed meanwhile."""
    deadline = time.monotonic() + timeout
    while not event.wait(0.02):
        if workers is not None:
            workers.check()
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
