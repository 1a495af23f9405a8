"""The serving map of one model: which servable answers requests, with leases.

A request leases the current servable (`with manager.acquire() as servable:`) and keeps
it for its whole life, so a swap never changes the version under a running request. A
retired servable is closed once its last lease ends, on the manager's closer thread:
freeing a version's tables and sessions takes tens of milliseconds, which must not land
on the request that happened to finish last. Thread-safe.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

from recserve.errors import ModelNotReadyError
from recserve.processor import heap
from recserve.processor.native_route import RouteSlot

__all__ = ["Closeable", "ServableManager"]

log = logging.getLogger("recserve.processor")


class Closeable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closeable)


class _Handle(Generic[S]):
    __slots__ = ("leases", "retired", "servable")

    def __init__(self, servable: S) -> None:
        self.servable = servable
        self.leases = 0
        self.retired = False


class _Lease(Generic[S]):
    """One request's hold on a servable (a class, not @contextmanager: it is on every request)."""

    __slots__ = ("_handle", "_manager")

    def __init__(self, manager: ServableManager[S]) -> None:
        self._manager = manager

    def __enter__(self) -> S:
        handle = self._manager._hold()
        if handle is None:
            raise ModelNotReadyError(f"model {self._manager._model_name!r} has no version loaded yet")
        self._handle = handle
        return handle.servable

    def __exit__(self, *exc: object) -> None:
        self._manager._release(self._handle)


class ServableManager(Generic[S]):
    def __init__(self, model_name: str, on_swap: Callable[[S | None], None] | None = None) -> None:
        self._model_name = model_name
        # Told of every servable swapped in, after the swap (the leader of worker processes
        # hands it to the workers, leasing it once per worker).
        self._on_swap = on_swap
        self._lock = threading.Lock()
        self._current: _Handle[S] | None = None
        # The native route's view of `_current` (DESIGN §10): a servable's native part, if it
        # has one, published by atomic pointer swap; native requests lease it there.
        self.route_slot = RouteSlot()
        self._retired: queue.SimpleQueue[S | None] = queue.SimpleQueue()
        self._closer = threading.Thread(target=self._close_retired, name=f"recserve-closer-{model_name}", daemon=True)
        self._closer.start()

    def _close_retired(self) -> None:
        while True:
            servable = self._retired.get()
            if servable is None:
                return
            try:
                servable.close()
            except Exception:  # a failed close must not stop later ones
                log.exception("model %r: closing a retired version failed", self._model_name)
            # This frame would otherwise hold the closed version (its row arrays: ~1x the
            # table bytes) until the next swap retires another one.
            del servable
            # What the version freed stays in glibc's per-thread arenas otherwise: under load,
            # with versions built on loader threads and freed on this one, a tiered server's RSS
            # grew ~90 KiB a version; trimmed after each close, +3 MiB in 100.
            heap.trim()

    def shutdown(self) -> None:
        """Retire the current servable and wait until every retired one is closed."""
        self.swap(None)
        self._retired.put(None)
        self._closer.join()

    @property
    def current(self) -> S | None:
        """The servable answering new requests, unleased: its plain attributes only. Its
        tables may be freed at any moment (a swap, then its last lease ends): reading them
        needs `peek()`."""
        handle = self._current
        return handle.servable if handle else None

    @contextmanager
    def peek(self) -> Iterator[S | None]:
        """The current servable leased for the block, or None when none serves: for
        reports that read its tables."""
        handle = self._hold()
        try:
            yield handle.servable if handle is not None else None
        finally:
            if handle is not None:
                self._release(handle)

    def acquire(self) -> _Lease[S]:
        """`with manager.acquire() as servable:` -- the current servable, leased."""
        return _Lease(self)

    def _hold(self) -> _Handle[S] | None:
        """The current handle with one more lease, or None when nothing serves."""
        with self._lock:
            handle = self._current
            if handle is not None:
                handle.leases += 1
        return handle

    def _release(self, handle: _Handle[S]) -> None:
        with self._lock:
            handle.leases -= 1
            close_now = handle.retired and handle.leases == 0
        if close_now:
            self._retired.put(handle.servable)

    def swap(self, servable: S | None) -> None:
        """Serve `servable` from now on; the previous one closes once its last lease ends."""
        new = _Handle(servable) if servable is not None else None
        with self._lock:
            old, self._current = self._current, new
            self.route_slot.publish(servable)
            if old is not None:
                old.retired = True
                close_now = old.leases == 0
        if old is not None and close_now:
            self._retired.put(old.servable)
        if self._on_swap is not None:
            self._on_swap(servable)
