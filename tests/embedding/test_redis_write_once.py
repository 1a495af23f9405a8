"""write_once against a real redis-server: one writer per marker among concurrent replicas,
others waiting for the write to be done, and take-over when the writer dies or fails."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from recserve.embedding.redis_connection import RedisConnection
from recserve.embedding.redis_import import mark_written, write_once
from tests.threads import Threads, wait_for

MARKER = "{m}:delta:1:2"


@pytest.fixture
def conn(redis_server: Any) -> Any:
    redis_server.client().flushall()
    c = RedisConnection(redis_server.url)
    yield c
    c.close()


def test_concurrent_replicas_write_once_and_the_others_wait_for_it(conn: Any, redis_server: Any) -> None:
    writes: list[str] = []
    done_at: dict[str, float] = {}
    written: list[float] = []
    start = threading.Barrier(4, timeout=60)
    waiting = threading.Semaphore(0)  # released once by each replica that found the claim

    def replica(name: str) -> Any:
        def write() -> int:
            writes.append(name)
            for n in range(3):  # the other three have found the claim and wait for the write
                assert waiting.acquire(timeout=60), f"{n} of 3 other replicas found the claim in 60 s"
            written.append(time.monotonic())
            return 7

        found: list[float] = []

        def sleep(seconds: float) -> None:
            if not found:
                waiting.release()
            found.append(seconds)
            time.sleep(seconds)

        start.wait()
        result = write_once(conn, MARKER, write, lock_seconds=5, wait_seconds=30, sleep=sleep)
        done_at[name] = time.monotonic()
        return result

    names = [f"r{i}" for i in range(4)]
    results = dict(zip(names, Threads([lambda n=n: replica(n) for n in names], "replicas").join(timeout=120)))
    assert len(writes) == 1
    writer = writes[0]
    assert results[writer] == 7
    assert all(results[n] is None for n in results if n != writer)
    assert min(done_at.values()) > written[0]  # nobody went on (to re-read the rows) before they were written
    assert redis_server.client().get(MARKER) == b"1"
    assert redis_server.client().pttl(MARKER) == -1  # the written mark lasts (until the version retires)


def test_a_written_marker_skips_the_write(conn: Any) -> None:
    mark_written(conn, MARKER)
    assert write_once(conn, MARKER, lambda: pytest.fail("written twice"), lock_seconds=5, wait_seconds=1) is None


def test_a_failed_write_releases_its_claim_for_another_replica(conn: Any, redis_server: Any) -> None:
    def failing() -> int:
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        write_once(conn, MARKER, failing, lock_seconds=5, wait_seconds=30)
    assert redis_server.client().get(MARKER) is None
    assert write_once(conn, MARKER, lambda: 3, lock_seconds=5, wait_seconds=30) == 3


def test_a_dead_writers_claim_lapses_and_another_replica_writes(conn: Any, redis_server: Any) -> None:
    redis_server.client().set(MARKER, "crashed-replica", px=300)  # claimed, never renewed
    started = time.monotonic()
    assert write_once(conn, MARKER, lambda: 5, lock_seconds=5, wait_seconds=30) == 5
    assert time.monotonic() - started < 5
    assert redis_server.client().get(MARKER) == b"1"


def test_a_long_write_keeps_its_claim(conn: Any, redis_server: Any) -> None:
    """A write longer than the claim's lifetime renews it, so a replica that finds the claim
    meanwhile waits for the write instead of taking it over."""
    lifetime = 1.0
    other_waits = threading.Event()
    seen: list[bytes | None] = []

    def other_sleep(seconds: float) -> None:
        other_waits.set()
        time.sleep(seconds)

    def other_replica() -> Any:
        return write_once(conn, MARKER, lambda: pytest.fail("claim taken over"), lock_seconds=lifetime,
                          wait_seconds=60, sleep=other_sleep)

    def slow() -> int:
        started = time.monotonic()
        other.append(Threads([other_replica], "the other replica"))
        wait_for(other_waits, 60, "the other replica to find the claim", other[0])
        time.sleep(max(0.0, started + 3 * lifetime - time.monotonic()))  # three lifetimes of the claim
        seen.append(redis_server.client().get(MARKER))
        return 1

    other: list[Threads] = []
    assert write_once(conn, MARKER, slow, lock_seconds=lifetime, wait_seconds=60) == 1
    assert other[0].join(timeout=60) == [None]
    assert seen[0] not in (None, b"1")  # still this writer's token


def test_a_claim_held_past_the_wait_is_written_here_too(conn: Any, redis_server: Any,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    redis_server.client().set(MARKER, "stuck-replica", px=60_000)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += max(seconds, 0.1)

    with caplog.at_level(logging.WARNING, "recserve.embedding"):
        assert write_once(conn, MARKER, lambda: 9, lock_seconds=5, wait_seconds=2,
                          clock=lambda: now[0], sleep=sleep) == 9
    assert now[0] >= 2
    assert f"Redis: {MARKER} has been claimed for over 2 s without being written; writing it here too" in caplog.text
    assert redis_server.client().get(MARKER) == b"1"
