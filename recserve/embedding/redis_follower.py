"""`VersionFollower`: the one background thread of a Redis-backed servable version.

Each round it (1) re-imports the version if its rows were lost, (2) checks that the
version's ready key still exists (a Redis restarted without persistence loses it; then
misses fail with 503 instead of serving defaults for keys that do exist), and (3) waits up
to `block_seconds` on the model's update stream (XREAD BLOCK) and applies the entries for
its version to the tables' caches. An update is therefore visible on every replica within
one round trip after XADD, and at most `block_seconds` plus backoff after an outage.
Failures never end the thread: they are logged and retried with backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from recserve.embedding.redis_connection import RECONNECT_BACKOFF, RedisConnection
from recserve.embedding.redis_keys import KeySpace
from recserve.embedding.redis_table import RedisTable
from recserve.embedding.redis_updates import RowUpdate
from recserve.errors import ModelLoadError, RecserveError, VersionNotReadyError
from recserve.model_store.backoff import Backoff

__all__ = ["VersionFollower"]

log = logging.getLogger("recserve.embedding")


class VersionFollower:
    """Keeps one version's caches in step with Redis. Thread-safe: `mark_lost` and `stop`
    may be called from any thread; the rest runs on the follower's own thread."""

    def __init__(
        self,
        conn: RedisConnection,
        space: KeySpace,
        version: str,
        tables: Mapping[str, RedisTable],
        reimport: Callable[[], None],
        *,
        follow_stream: bool,
        block_seconds: float = 0.25,
        backoff: Backoff = RECONNECT_BACKOFF,
    ) -> None:
        self._conn, self._space, self._version = conn, space, version
        self._tables, self._reimport = tables, reimport
        self._follow, self._block_ms = follow_stream, int(block_seconds * 1000)
        self._backoff = backoff
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._blocking = conn.blocking_client(block_seconds)
        self._last_id = self._stream_end() if follow_stream else "0-0"
        self.applied = 0  # stream entries applied, for tests and metrics
        # Why the lost version cannot be imported again (its files gone or unreadable), or
        # None: the updater then serves the newest version it can read instead.
        self.unrecoverable: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"redis-follower {version}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _stream_end(self) -> str:
        """The id of the newest entry now: the caches start empty, so what came before is
        already in Redis and only later entries matter."""
        newest = self._conn.call(
            "reading the update stream", lambda c: c.xrevrange(self._space.updates, count=1)
        )
        return newest[0][0].decode() if newest else "0-0"

    def mark_lost(self) -> None:
        if not self._lost.is_set():
            log.warning("Redis: rows of version %s are gone; importing it again", self._version)
        for table in self._tables.values():
            table.lost = True
        self._lost.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._round()
                failures = 0
            except RecserveError as exc:
                failures += 1
                log.warning("Redis follower of version %s: %s", self._version, exc.message)
                self._stop.wait(self._backoff.compute(failures))
            except Exception:
                failures += 1
                log.exception("Redis follower of version %s failed", self._version)
                self._stop.wait(self._backoff.compute(failures))

    def _round(self) -> None:
        if self._lost.is_set():
            try:
                self._reimport()
            except VersionNotReadyError:
                raise  # another replica imports it
            except ModelLoadError as exc:
                self.unrecoverable = exc.message
                raise
            self.unrecoverable = None
            for table in self._tables.values():
                table.forget_absent()  # keys found absent while rows were gone may exist
                table.lost = False
            self._lost.clear()
        ready = self._conn.call("checking the version", lambda c: c.exists(self._space.ready(self._version)))
        if not ready:
            self.mark_lost()
            return
        if not self._follow:
            self._stop.wait(self._block_ms / 1000)
            return
        try:
            replies = self._conn.call(
                "reading the update stream",
                lambda c: c.xread({self._space.updates: self._last_id}, count=256, block=self._block_ms),
                client=self._blocking,
            )
        except RecserveError:
            # A cluster's blocking client may keep the dead master's address; the next one
            # starts from the node map the lookups' client has refreshed meanwhile.
            if self._conn.cluster:
                self._blocking.close()
                self._blocking = self._conn.blocking_client(self._block_ms / 1000)
            raise
        for _, entries in replies or ():
            for entry_id, fields in entries:
                self._apply(fields)
                self._last_id = entry_id.decode()

    def _apply(self, fields: dict[bytes, Any]) -> None:
        if fields.get(b"version", b"").decode() != self._version:
            return
        table = self._tables.get(fields.get(b"table", b"").decode())
        if table is None:
            return
        try:
            update = RowUpdate.from_fields(fields, table.dim)
        except RecserveError as exc:
            log.warning("Redis follower of version %s: skipping an entry: %s", self._version, exc.message)
            return
        table.apply_update(update.keys, update.values, update.deleted)
        self.applied += 1

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._block_ms / 1000 + 2 * self._conn.timeout + 1)
        self._blocking.close()
