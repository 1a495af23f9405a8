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
    """Runs each target on its own thread from construction; `join` waits for all of them."""

    def __init__(self, targets: Sequence[Callable[[], Any]], what: str) -> None:
        self.what = what
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
        except BaseException as error:  # noqa: BLE001 - re-raised by join, in the test's thread
            self._errors.append(error)

    def join(self, timeout: float) -> list[Any]:
        """Each target's return value, in order. Raises the first worker's exception, or an
        AssertionError naming `what` if a thread is still running after `timeout` seconds
        in all."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if self._errors:
            raise self._errors[0]
        assert not alive, f"still running after {timeout} s: {', '.join(alive)}"
        return self._results


def wait_for(event: threading.Event, timeout: float, what: str) -> None:
    """Waits for `event`; fails naming `what` if it is not set within `timeout` seconds."""
    assert event.wait(timeout), f"timed out after {timeout} s waiting for {what}"
