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
    results: dict[str, Any] = {}
    start = threading.Barrier(4)

    def replica(name: str) -> None:
        def write() -> int:
            writes.append(name)
            time.sleep(0.3)  # long enough for every other replica to find the claim
            written.append(time.monotonic())
            return 7

        start.wait()
        results[name] = write_once(conn, MARKER, write, lock_seconds=5, wait_seconds=30)
        done_at[name] = time.monotonic()

    threads = [threading.Thread(target=replica, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
    """A write longer than the claim's lifetime renews it, so nobody takes it over."""
    seen: list[bytes | None] = []

    def slow() -> int:
        time.sleep(0.9)  # three lifetimes of the 0.3 s claim
        seen.append(redis_server.client().get(MARKER))
        return 1

    other: list[Any] = []
    t = threading.Thread(target=lambda: (time.sleep(0.5), other.append(
        write_once(conn, MARKER, lambda: pytest.fail("claim taken over"), lock_seconds=0.3, wait_seconds=30))))
    t.start()
    assert write_once(conn, MARKER, slow, lock_seconds=0.3, wait_seconds=30) == 1
    t.join()
    assert seen[0] not in (None, b"1")  # still this writer's token
    assert other == [None]


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
