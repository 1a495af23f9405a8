"""Getting one version's rows into Redis exactly once, however many replicas want it.

`ensure_version` returns the version's metadata once its ready key exists. If it does not,
the caller tries to take the version's import lock (``SET NX PX``): the one that gets it
writes the rows, with `writers` threads, renewing the lock every third of its lifetime,
then the sample keys, and the ready key LAST; the others poll for the ready key with
backoff and take over the import if the lock expires without one (the importer died).
Waiting is bounded by `wait_seconds`. `write_once` does the same for smaller writes (a
delta), with one key as both the lock and the mark that the write is done.

After an import, the importer retires old versions: every version but the newest
`KEEP_VERSIONS` (by global_step) gets an expiry of `grace_seconds` on its ready key first,
then on its rows, so replicas still serving it have that long to switch; a replica that
sees the ready key may rely on the rows. Thread-safe (state lives in Redis).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from recserve.embedding.redis_connection import RedisConnection
from recserve.embedding.redis_keys import KeySpace, encode_rows, row_keys
from recserve.errors import ModelLoadError, VersionNotReadyError
from recserve.model_store.backoff import Backoff
from recserve.model_store.checkpoint import TableData

__all__ = ["KEEP_VERSIONS", "TableInfo", "VersionInfo", "ensure_version", "mark_written", "write_once", "write_rows"]

log = logging.getLogger("recserve.embedding")

T = TypeVar("T")

KEEP_VERSIONS = 2
SAMPLE_KEYS = 4096
_CHUNK_ROWS = 2048
_WAIT_BACKOFF = Backoff(base=0.02, cap=0.5)
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
_WRITTEN = b"1"  # write_once's mark; a claim holds a token instead
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
)


@dataclass(frozen=True)
class TableInfo:
    dim: int
    rows: int  # at import; deltas and stream updates may change it since


@dataclass(frozen=True)
class VersionInfo:
    """What a version's ready key says."""

    version: str
    global_step: int
    tables: Mapping[str, TableInfo]
    # The global steps of the deltas the importer wrote with the rows (a re-import after
    # Redis lost them carries the deltas its importer had applied): a replica ahead of it
    # writes only the others again.
    deltas: tuple[int, ...] = ()

    def to_json(self) -> str:
        tables = {name: {"dim": t.dim, "rows": t.rows} for name, t in self.tables.items()}
        return json.dumps({"version": self.version, "global_step": self.global_step, "tables": tables,
                           "deltas": list(self.deltas)})

    @classmethod
    def from_json(cls, raw: bytes | str) -> VersionInfo:
        doc = json.loads(raw)
        tables = {name: TableInfo(int(t["dim"]), int(t["rows"])) for name, t in doc["tables"].items()}
        return cls(str(doc["version"]), int(doc["global_step"]), tables, tuple(int(s) for s in doc.get("deltas", ())))


def write_rows(client: Any, cluster: bool, prefix: bytes, keys: np.ndarray, values: np.ndarray) -> None:
    """SET every (key, row) under `prefix`: one MSET per chunk, so no Python loop per row."""
    for start in range(0, len(keys), _CHUNK_ROWS):
        names = row_keys(prefix, keys[start : start + _CHUNK_ROWS])
        rows = encode_rows(values[start : start + _CHUNK_ROWS])
        if cluster:
            client.mset_nonatomic(dict(zip(names, rows)))
        else:
            pairs: list[bytes] = [b""] * (2 * len(names))
            pairs[0::2], pairs[1::2] = names, rows
            client.execute_command("MSET", *pairs)


def _release(conn: RedisConnection, key: str, token: str) -> None:
    """Deletes lock `key` if it still holds this caller's `token`; a failure only logs (the
    lock lapses by itself)."""
    try:
        conn.call(f"releasing {key}", lambda c: c.eval(_RELEASE, 1, key, token))
    except Exception:  # noqa: BLE001 - the lock lapses by itself
        log.warning("Redis: could not release %s; it lapses", key)


class _LockKeeper:
    """Renews a lock on its own thread until stopped; `lost` says it failed to."""

    def __init__(self, conn: RedisConnection, key: str, token: str, ttl_ms: int) -> None:
        self.lost = False
        self._stop = threading.Event()
        self._args = (conn, key, token, ttl_ms)
        self._thread = threading.Thread(target=self._run, name=f"redis-lock {key}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn, key, token, ttl_ms = self._args
        while not self._stop.wait(ttl_ms / 3000):
            try:
                renewed = conn.call(f"renewing the lock {key}", lambda c: c.eval(_RENEW, 1, key, token, ttl_ms))
            except Exception as exc:  # noqa: BLE001 - a missed renewal is retried; expiry is the backstop
                log.debug("Redis: renewing the lock %s failed: %s", key, exc)
                continue
            if not renewed:
                self.lost = True
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _import(
    conn: RedisConnection,
    space: KeySpace,
    info: VersionInfo,
    tables: Mapping[str, TableData],
    writers: int,
    keeper: _LockKeeper,
) -> None:
    jobs = [
        (space.row_prefix(info.version, name), data.keys[i : i + 16 * _CHUNK_ROWS], data.values[i : i + 16 * _CHUNK_ROWS])
        for name, data in tables.items()
        for i in range(0, len(data.keys), 16 * _CHUNK_ROWS)
    ]

    def write(job: tuple[bytes, np.ndarray, np.ndarray]) -> None:
        if keeper.lost:
            raise ModelLoadError(f"lost the Redis import lock of version {info.version!r} while writing it")
        conn.call(f"importing version {info.version!r}", lambda c: write_rows(c, conn.cluster, *job))

    with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="redis-import") as pool:
        list(pool.map(write, jobs))
    rng = np.random.default_rng(info.global_step)
    samples = {
        space.sample(info.version, name): rng.choice(
            data.keys, size=min(SAMPLE_KEYS, len(data.keys)), replace=False
        ).astype("<i8").tobytes()
        for name, data in tables.items()
    }
    if samples:  # one slot (the model's hash tag), so one MSET even on a cluster
        conn.call("writing sample keys", lambda c: c.mset(samples))
    if keeper.lost:
        raise ModelLoadError(f"lost the Redis import lock of version {info.version!r} while writing it")

    def publish(c: Any) -> None:
        c.zadd(space.versions, {info.version: info.global_step})
        c.set(space.ready(info.version), info.to_json())

    conn.call(f"publishing version {info.version!r}", publish)


def _versions_to_retire(conn: RedisConnection, space: KeySpace, imported: str) -> list[str]:
    """All but the newest KEEP_VERSIONS, never the one just imported (a pinned rollback
    imports an old version; it must stay)."""
    names = conn.call("listing versions", lambda c: c.zrange(space.versions, 0, -1, desc=True))
    return [n.decode() for n in names[KEEP_VERSIONS:] if n.decode() != imported]


def _retire(conn: RedisConnection, space: KeySpace, version: str, grace_ms: int) -> None:
    def expire(c: Any) -> None:
        c.pexpire(space.ready(version), grace_ms)  # before the rows: ready implies rows
        c.zrem(space.versions, version)
        for pattern in (space.version_pattern(version), space.sample_pattern(version), space.delta_pattern(version)):
            pipe = c.pipeline(transaction=False)
            for i, key in enumerate(c.scan_iter(match=pattern, count=1000), 1):
                pipe.pexpire(key, grace_ms)
                if i % 1000 == 0:
                    pipe.execute()
            pipe.execute()

    conn.call(f"retiring version {version!r}", expire)
    log.info("Redis: version %s of model %s expires in %.0f s", version, space.model, grace_ms / 1000)


def ensure_version(
    conn: RedisConnection,
    space: KeySpace,
    version: str,
    global_step: int,
    load_tables: Callable[[], Mapping[str, TableData]] | None,
    *,
    writers: int,
    lock_seconds: float,
    wait_seconds: float,
    grace_seconds: float,
    deltas: Sequence[int] = (),
    backoff: Backoff = _WAIT_BACKOFF,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[VersionInfo, bool]:
    """(the version's metadata, whether this call imported it), once it is ready in Redis.

    `load_tables` is called only by the importer; it may raise ModelLoadError before any
    row is written. None: this replica cannot read the version's rows (a worker process,
    whose leader imports), so it only waits for the version to be ready. `deltas`: the
    global steps of the deltas `load_tables` applies to the rows (recorded in the ready
    key). Raises
    VersionNotReadyError after `wait_seconds` without the version becoming ready,
    StorageError if Redis is unreachable."""
    deadline = clock() + wait_seconds
    ready_key, lock_key = space.ready(version), space.lock(version)
    lock_ms = max(1, int(lock_seconds * 1000))
    attempt = 0
    while True:
        attempt += 1
        raw = conn.call(f"reading version {version!r}", lambda c: c.get(ready_key))
        if raw is not None:
            return VersionInfo.from_json(raw), False
        token = uuid.uuid4().hex
        if load_tables is not None and conn.call(
                "taking the import lock", lambda c: c.set(lock_key, token, nx=True, px=lock_ms)):  # noqa: B023
            try:
                tables = load_tables()
                info = VersionInfo(
                    version,
                    global_step,
                    {n: TableInfo(int(d.values.shape[1]), len(d.keys)) for n, d in tables.items()},
                    tuple(deltas),
                )
                keeper = _LockKeeper(conn, lock_key, token, lock_ms)
                try:
                    _import(conn, space, info, tables, writers, keeper)
                finally:
                    keeper.stop()
            finally:
                _release(conn, lock_key, token)
            log.info("Redis: imported version %s of model %s", version, space.model)
            for old in _versions_to_retire(conn, space, version):
                _retire(conn, space, old, int(grace_seconds * 1000))
            return info, True
        if clock() >= deadline:
            if load_tables is None:
                raise VersionNotReadyError(
                    f"version {version!r} of model {space.model!r} is not ready in Redis; a replica that "
                    "reads its files (the leader of worker processes) imports it")
            raise VersionNotReadyError(
                f"version {version!r} of model {space.model!r} is being imported into Redis by "
                f"another replica and was not ready after {wait_seconds:g} s (lock_timeout)"
            )
        sleep(backoff.compute(attempt))


def mark_written(conn: RedisConnection, marker: str) -> None:
    """Sets `marker` to write_once's written value: replicas calling write_once on it skip."""
    conn.call(f"marking {marker} written", lambda c: c.set(marker, _WRITTEN))


def write_once(
    conn: RedisConnection,
    marker: str,
    write: Callable[[], T],
    *,
    lock_seconds: float,
    wait_seconds: float,
    backoff: Backoff = _WAIT_BACKOFF,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """`write()`'s result if this call ran it; None once another replica's run of it is done.

    The replica that claims `marker` (``SET NX PX`` with a token, renewed while it writes)
    runs `write` and then sets the marker to its written value, which lasts; the others
    poll until they see that value. A claim that lapses (its writer died) or is released
    (its write raised) is taken over. A writer still holding the claim after
    `wait_seconds` is assumed stuck: the caller writes too, which repeats the same rows
    rather than leaving this replica's Redis rows unwritten. Raises StorageError if
    Redis is unreachable, and what `write` raises."""
    deadline = clock() + wait_seconds
    lock_ms = max(1, int(lock_seconds * 1000))
    attempt = 0
    while True:
        attempt += 1
        token = uuid.uuid4().hex
        if conn.call(f"claiming {marker}", lambda c: c.set(marker, token, nx=True, px=lock_ms)):  # noqa: B023
            keeper = _LockKeeper(conn, marker, token, lock_ms)
            try:
                result = write()
            except BaseException:
                keeper.stop()
                _release(conn, marker, token)
                raise
            keeper.stop()
            mark_written(conn, marker)
            return result
        state = conn.call(f"reading {marker}", lambda c: c.get(marker))
        if state == _WRITTEN:
            return None
        if state is None:
            continue  # released or lapsed between the two calls: claim it again at once
        if clock() >= deadline:
            log.warning("Redis: %s has been claimed for over %g s without being written; writing it here too",
                        marker, wait_seconds)
            result = write()
            mark_written(conn, marker)
            return result
        sleep(backoff.compute(attempt))
