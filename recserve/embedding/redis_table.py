"""`RedisTable`: one table of one version whose rows live in Redis, served from a bounded
local cache (a native `EmbeddingTable`) that `prefetch` fills before each lookup.

prefetch(ids): the request's distinct keys that are neither cached nor known to be absent
are fetched with MGET (split over the read threads when there are many), found rows go
into the cache, keys Redis lacks into a bounded "absent" set (so an unknown key costs one
round trip, not one per request; it then gets the table's default from the engine).
Beyond `cache_rows` rows, random rows not needed by a request in flight are evicted (so the
cache holds more only while the requests in flight together need more distinct keys).

Two races are closed without per-key Python work:
- An eviction must not remove a row a request has found cached before its lookup runs:
  `prefetch` registers the request's keys (under the lock, before looking at the cache)
  and returns a token; evictions skip every registered key until `release(token)`.
- A fetch that started before an update of the same keys (stream, delta) must not put its
  old rows in the cache after the update did: every update bumps a generation and logs its
  keys, and an insert skips keys updated since its fetch began (they are fresh already).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from recserve.embedding import EmbeddingTable, _inputs
from recserve.embedding.redis_connection import RedisConnection
from recserve.embedding.redis_import import write_rows
from recserve.embedding.redis_keys import decode_rows, row_keys
from recserve.errors import StorageError
from recserve.model_spec import DefaultSpec

__all__ = ["CacheInvalidation", "RedisTable", "VersionLost"]

log = logging.getLogger("recserve.embedding")

_SPLIT_KEYS = 256  # fewer keys per read thread cost more in thread hand-offs than they save
_NO_KEYS = np.zeros(0, dtype=np.int64)


class VersionLost(StorageError):
    """The version's ready key vanished from Redis (restarted without persistence,
    flushed, expired): its rows must be imported again before misses can be served."""

    status = 503


def _empty(name: str, dim: int, default: DefaultSpec = _inputs.ZEROS) -> EmbeddingTable:
    return EmbeddingTable(name, dim, _NO_KEYS, np.zeros((0, dim), np.float32), default=default)


class RedisTable:
    """A Redis-backed table with a local cache of hot rows.

    Thread-safety: prefetch, sample_keys and the cache's lookups run on any number of
    threads; every change to the cache (inserts, evictions, updates) takes one lock, so the
    engine sees one writer at a time. upsert/delete write Redis first, then the cache.
    """

    def __init__(
        self,
        name: str,
        dim: int,
        default: DefaultSpec,
        *,
        conn: RedisConnection,
        prefix: bytes,
        ready_key: str,
        sample_key: str,
        rows: int,
        cache_rows: int,
        readers: ThreadPoolExecutor,
        read_threads: int,
        on_lost: Callable[[], None],
        serve_defaults: bool = False,
    ) -> None:
        self.name = name
        self.dim = dim
        self.default = default
        self.cache = _empty(name, dim, default)
        self._conn, self._prefix, self._ready_key = conn, prefix, ready_key
        self._sample_key, self._rows, self._cache_rows = sample_key, rows, cache_rows
        self._readers, self._read_threads, self._on_lost = readers, read_threads, on_lost
        self._absent_rows = max(1024, cache_rows)
        self._absent = _empty(f"{name} (absent)", 1)
        self._lock = threading.Lock()
        self._generation = 0
        self._changes: deque[tuple[int, np.ndarray]] = deque(maxlen=64)
        self._in_use: dict[int, np.ndarray] = {}
        self._tokens = itertools.count()
        self._serve_defaults = serve_defaults
        self._rng = np.random.default_rng(0)
        self._sample: np.ndarray | None = None
        self.lost = False  # set by the owner when the version must be re-imported

    def __len__(self) -> int:
        """Rows of the version in Redis when it was imported."""
        return self._rows

    def close(self) -> None:
        """Free the cache's native memory now (the follower and this table refer to each
        other: left to the cyclic collector, every retired version's caches stayed until it
        ran). No lookup may run during or after it (the servable's last lease has ended)."""
        with self._lock:
            self.cache.close()
            self._absent.close()

    # -- serving -----------------------------------------------------------------------

    def prefetch(self, ids: np.ndarray) -> int:
        """Make every key in `ids` (any shape, -1 = padding) cached or known absent, and keep
        the cached ones from eviction until `release` of the returned token. Raises
        RequestError for bad ids; StorageError if Redis is needed and unreachable (or the
        version is lost), unless the table serves defaults then."""
        keys = np.unique(_inputs.check_ids(self.name, ids))
        keys = keys[keys != -1]
        token = next(self._tokens)
        with self._lock:
            self._in_use[token] = keys
        try:
            self._resolve(keys)
        except StorageError as exc:
            if not self._serve_defaults:
                self.release(token)
                raise
            log.debug("serving defaults for uncached keys of table %r: %s", self.name, exc.message)
        except BaseException:
            self.release(token)
            raise
        return token

    def release(self, token: int) -> None:
        with self._lock:
            self._in_use.pop(token, None)

    def _resolve(self, keys: np.ndarray) -> None:
        missing = self._unresolved(keys)
        for _ in range(3):  # a repeat happens only when updates raced the fetch
            if not missing.size:
                return
            if self.lost:
                raise VersionLost(self._lost_message())
            generation = self._generation
            found, rows = self._fetch(missing)
            with self._lock:
                fresh = self._unchanged_since(generation, missing)
                take = found & fresh
                if take.any():
                    self.cache.upsert(missing[take], rows[fresh[found]])
                absent = ~found & fresh
                if absent.any():
                    self._remember_absent(missing[absent])
                self._evict()
            missing = self._unresolved(missing[~fresh])

    def _unresolved(self, keys: np.ndarray) -> np.ndarray:
        if not keys.size:
            return keys
        keys = keys[~self.cache.contains(keys)]
        return keys[~self._absent.contains(keys)] if keys.size else keys

    def _fetch(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        names = row_keys(self._prefix, keys)
        parts = min(self._read_threads, len(names) // _SPLIT_KEYS)
        if parts <= 1:
            replies = self._read(names)
        else:
            bounds = np.linspace(0, len(names), parts + 1).astype(int)
            chunks = [names[a:b] for a, b in itertools.pairwise(bounds)]
            replies = [r for part in self._readers.map(self._read, chunks) for r in part]
        try:
            return decode_rows(replies, self.dim, f"table {self.name!r}")
        except ValueError as exc:
            raise StorageError(str(exc)) from exc

    def _read(self, names: list[bytes]) -> list[bytes | None]:
        def read(client: Any) -> list[bytes | None]:
            if self._conn.cluster:
                return list(client.mget_nonatomic(names))
            # The ready key rides along in the same round trip: rows that vanish with it
            # (a restart without persistence) must not be taken for absent keys.
            pipe = client.pipeline(transaction=False)
            pipe.exists(self._ready_key)
            pipe.execute_command("MGET", *names)
            exists, rows = pipe.execute()
            if not exists:
                raise VersionLost(self._lost_message())
            return list(rows)

        try:
            return self._conn.call(f"fetching rows of table {self.name!r}", read)
        except VersionLost:
            self._on_lost()
            raise

    def _lost_message(self) -> str:
        return (
            f"the rows of table {self.name!r} are gone from Redis at {self._conn.url} (restarted "
            "without persistence, flushed or expired?); the version is being imported again"
        )

    # -- cache bookkeeping (under self._lock) -------------------------------------------

    def _unchanged_since(self, generation: int, keys: np.ndarray) -> np.ndarray:
        if self._generation == generation:
            return np.ones(len(keys), dtype=np.bool_)
        if not self._changes or self._changes[0][0] > generation + 1:
            return np.zeros(len(keys), dtype=np.bool_)  # the log no longer reaches back
        changed = np.concatenate([k for g, k in self._changes if g > generation])
        return ~np.isin(keys, changed)

    def _remember_absent(self, keys: np.ndarray) -> None:
        if len(self._absent) + len(keys) > self._absent_rows:
            self._absent = _empty(f"{self.name} (absent)", 1)
        self._absent.upsert(keys, np.zeros((len(keys), 1), np.float32))

    def _evict(self) -> None:
        excess = len(self.cache) - self._cache_rows
        if excess <= 0:
            return
        target = excess + self._cache_rows // 10
        keep = np.concatenate([_NO_KEYS, *self._in_use.values()])
        for _ in range(3):  # sampling repeats keys; a few rounds find enough distinct ones
            sample = np.unique(self.cache.sample_keys(4 * target, self._rng))
            sample = sample[~np.isin(sample, keep)][:target]
            self.cache.delete(sample)
            if len(self.cache) <= self._cache_rows or not sample.size:
                return

    def forget_absent(self) -> None:
        """Drop the absent set: after a re-import, keys once missing may exist again."""
        with self._lock:
            self._absent = _empty(f"{self.name} (absent)", 1)

    # -- changes -----------------------------------------------------------------------

    def apply_update(self, keys: np.ndarray, values: np.ndarray, deleted: np.ndarray = _NO_KEYS) -> None:
        """Put rows already changed in Redis into the cache (stream updates, deltas)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        deleted = np.asarray(deleted, dtype=np.int64).reshape(-1)
        with self._lock:
            self._generation += 1
            self._changes.append((self._generation, np.concatenate([keys, deleted])))
            for changed in (keys, deleted):
                if changed.size:
                    self._absent.delete(changed)
            if keys.size:
                self.cache.upsert(keys, values)
            if deleted.size:
                self.cache.delete(deleted)
            self._evict()

    @property
    def invalidation(self) -> CacheInvalidation:
        """upsert/delete that only drop the keys from the cache (see CacheInvalidation)."""
        return CacheInvalidation(self)

    def upsert(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Write rows to this version in Redis, then to the cache (the updater's deltas)."""
        keys, values = _inputs.check_rows(f"table {self.name!r}", self.dim, keys, values)
        self._conn.call(
            f"writing rows of table {self.name!r}",
            lambda c: write_rows(c, self._conn.cluster, self._prefix, keys, values),
        )
        self.apply_update(keys, values)

    def delete(self, keys: np.ndarray) -> None:
        keys = _inputs.check_keys(f"table {self.name!r}", keys).reshape(-1)
        names = row_keys(self._prefix, keys)
        if names:
            self._conn.call(f"deleting rows of table {self.name!r}", lambda c: c.delete(*names))
        self.apply_update(_NO_KEYS, np.zeros((0, self.dim), np.float32), keys)

    def sample_keys(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n keys of the table (with repetition), from the sample written at import."""
        if self._sample is None:
            raw = self._conn.call("reading sample keys", lambda c: c.get(self._sample_key))
            self._sample = np.frombuffer(raw or b"", dtype="<i8").astype(np.int64)
        if not self._sample.size:
            raise ValueError(f"table {self.name!r} has no rows to sample keys from")
        return rng.choice(self._sample, size=n)


class CacheInvalidation:
    """A RedisTable's upsert/delete for a delta another replica already wrote to Redis: the
    changed keys only leave the cache, and their next lookup reads Redis, which holds the
    delta's rows or anything newer (stream updates). Thread-safe as the table."""

    def __init__(self, table: RedisTable) -> None:
        self._table = table
        self.dim = table.dim

    def upsert(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.delete(keys)

    def delete(self, keys: np.ndarray) -> None:
        keys = _inputs.check_keys(f"table {self._table.name!r}", keys).reshape(-1)
        self._table.apply_update(_NO_KEYS, np.zeros((0, self.dim), np.float32), keys)
