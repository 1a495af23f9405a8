"""The serving map of one model: which servable answers requests, with leases.

A request leases the current servable (`with manager.acquire() as servable:`) and keeps
it for its whole life, so a swap never changes the version under a running request. A
retired servable is closed by whoever drops its last lease, outside the lock.
Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

from recserve.errors import ModelNotReadyError

__all__ = ["Closeable", "ServableManager"]


class Closeable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closeable)


class _Handle(Generic[S]):
    __slots__ = ("servable", "leases", "retired")

    def __init__(self, servable: S) -> None:
        self.servable = servable
        self.leases = 0
        self.retired = False


class ServableManager(Generic[S]):
    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self._lock = threading.Lock()
        self._current: _Handle[S] | None = None

    @property
    def current(self) -> S | None:
        """The servable answering new requests (no lease: for reporting only)."""
        handle = self._current
        return handle.servable if handle else None

    @contextmanager
    def acquire(self) -> Iterator[S]:
        with self._lock:
            handle = self._current
            if handle is None:
                raise ModelNotReadyError(f"model {self._model_name!r} has no version loaded yet")
            handle.leases += 1
        try:
            yield handle.servable
        finally:
            with self._lock:
                handle.leases -= 1
                close_now = handle.retired and handle.leases == 0
            if close_now:
                handle.servable.close()

    def swap(self, servable: S | None) -> None:
        """Serve `servable` from now on; the previous one closes once its last lease ends."""
        new = _Handle(servable) if servable is not None else None
        with self._lock:
            old, self._current = self._current, new
            if old is not None:
                old.retired = True
                close_now = old.leases == 0
        if old is not None and close_now:
            old.servable.close()
