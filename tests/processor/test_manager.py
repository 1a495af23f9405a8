"""ServableManager: leases keep a retired servable open until the last request ends."""

from __future__ import annotations

import threading
import time

import pytest

from recserve.errors import ModelNotReadyError
from recserve.processor.manager import ServableManager
from tests.threads import Threads


class Version:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = 0
        self.closed_on: str | None = None

    def close(self) -> None:
        self.closed += 1
        self.closed_on = threading.current_thread().name


def settle(manager: ServableManager[Version]) -> None:
    """Wait for the closer thread: closes happen off the calling thread."""
    manager.shutdown()


def test_no_version_is_503() -> None:
    manager: ServableManager[Version] = ServableManager("m")
    with pytest.raises(ModelNotReadyError, match="model 'm' has no version loaded yet") as info, manager.acquire():
        pass
    assert info.value.status == 503


def test_swap_without_leases_closes_old_at_once() -> None:
    manager: ServableManager[Version] = ServableManager("m")
    v1, v2 = Version("1"), Version("2")
    manager.swap(v1)
    manager.swap(v2)
    assert manager.current is v2
    settle(manager)
    assert v1.closed == 1 and v2.closed == 1
    assert v1.closed_on == "recserve-closer-m"


def test_leased_version_closes_when_last_lease_ends() -> None:
    manager: ServableManager[Version] = ServableManager("m")
    v1, v2 = Version("1"), Version("2")
    manager.swap(v1)
    with manager.acquire() as a:
        with manager.acquire() as b:
            manager.swap(v2)
            assert a is b is v1 and v1.closed == 0
            with manager.acquire() as c:
                assert c is v2  # new requests see the new version at once
        assert v1.closed == 0
    settle(manager)
    assert v1.closed == 1 and v1.closed_on == "recserve-closer-m"


def test_concurrent_requests_never_see_a_closed_version() -> None:
    manager: ServableManager[Version] = ServableManager("m")
    manager.swap(Version("0"))
    seen_closed = []
    stop = threading.Event()
    reading = threading.Barrier(5, timeout=60)  # swaps start once every reader holds a lease

    def reader() -> set[str]:
        seen: set[str] = set()
        with manager.acquire() as v:
            seen.add(v.name)
        reading.wait()
        while True:  # reads until stopped, and once more after: it ends on the last version
            stopped = stop.is_set()
            with manager.acquire() as v:
                if v.closed:
                    seen_closed.append(v.name)
                seen.add(v.name)
            if stopped:
                return seen

    threads = Threads([reader] * 4, "readers acquiring leases", breaks=[reading])
    versions = [Version(str(i)) for i in range(1, 2001)]
    try:
        reading.wait()
        for v in versions:
            manager.swap(v)
    finally:
        stop.set()
        seen = threads.join(timeout=60)  # a reader's failure, not the barrier's, is reported
    assert all({"0", "2000"} <= names for names in seen), [sorted(names)[:5] for names in seen]
    settle(manager)
    assert seen_closed == []
    assert all(v.closed == 1 for v in versions)


def test_swap_to_none_retires_current() -> None:
    manager: ServableManager[Version] = ServableManager("m")
    v = Version("1")
    manager.swap(v)
    manager.swap(None)
    assert manager.current is None
    settle(manager)
    assert v.closed == 1


def test_peek_leases_the_current_version_for_the_block() -> None:
    manager: ServableManager[Version] = ServableManager("m")
    with manager.peek() as nothing:
        assert nothing is None
    v1, v2 = Version("1"), Version("2")
    manager.swap(v1)
    with manager.peek() as seen:
        assert seen is v1
        manager.swap(v2)  # retired while peeked at: still open
        time.sleep(0.05)
        assert v1.closed == 0
    settle(manager)
    assert v1.closed == 1 and v2.closed == 1
