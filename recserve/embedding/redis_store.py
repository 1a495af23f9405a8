"""Redis as the shared parameter store of a fleet of replicas (``feature_store_type: redis``).

    store = open_redis_tables(bindings, checkpoint, config, model_name)
    plan = store.lookup_plan([("user", "none"), ("item", "mean")])
    user_emb, item_emb = plan.run([user_ids, item_ids])   # like LookupPlan.run
    store.tables["user"].upsert(keys, values)              # a delta: Redis, then the cache
    store.close()

`open_redis_tables` makes sure the checkpoint's version is in Redis (exactly one replica
imports it; see redis_import), then serves each bound table from a bounded local cache of
hot rows that `RedisLookupPlan.run` fills before its one native lookup call (see
redis_table). A servable reads only its own version's namespace (redis_keys), so swapping
servables switches versions atomically per request. A `VersionFollower` thread applies
real-time row updates from the model's Redis stream and re-imports the version if Redis
loses it.

When Redis is unreachable, a request whose rows are all cached is served; one that needs
Redis fails at once with StorageError (503) naming the server — or, with
``redis_serve_defaults_when_down``, its uncached keys get the table defaults. The
connection retries with backoff (redis_connection); nothing waits longer than
``redis_timeout_seconds`` per round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from recserve.config import ProcessorConfig
from recserve.embedding import EmbeddingTable, LookupPlan
from recserve.embedding._inputs import check_count, check_ids
from recserve.embedding.redis_connection import RedisConnection
from recserve.embedding.redis_follower import VersionFollower
from recserve.embedding.redis_import import VersionInfo, ensure_version, mark_written, write_once
from recserve.embedding.redis_keys import KeySpace
from recserve.embedding.redis_table import RedisTable
from recserve.errors import ModelLoadError
from recserve.model_spec import EmbeddingBinding
from recserve.model_store.checkpoint import Checkpoint, TableData, bound_table_rows, with_deltas

__all__ = ["RedisLookupPlan", "RedisTableSet", "connect", "open_redis_tables"]

log = logging.getLogger("recserve.embedding")

IMPORT_LOCK_SECONDS = 30.0  # renewed every 10 s while importing; a dead importer's lock lapses


class RedisLookupPlan:
    """LookupPlan.run over Redis-backed tables: prefetch each table's keys (which keeps them
    cached until the lookup is done), then one native call on the caches.

    Thread-safety: run() may be called from any number of threads concurrently."""

    def __init__(self, bindings: Sequence[tuple[RedisTable, str]]) -> None:
        self._plan = LookupPlan([(table.cache, combiner) for table, combiner in bindings])
        self._count = len(bindings)
        self._tables: list[RedisTable] = []
        self._positions: list[list[int]] = []  # per distinct table: its bindings' positions
        for i, (table, _) in enumerate(bindings):
            if table not in self._tables:
                self._tables.append(table)
                self._positions.append([])
            self._positions[self._tables.index(table)].append(i)

    def run(
        self, ids_list: Sequence[np.ndarray], outs: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        check_count(ids_list, outs, self._count)
        held: list[tuple[RedisTable, int]] = []
        try:
            for table, positions in zip(self._tables, self._positions):
                ids = [ids_list[i] for i in positions]
                held.append((table, table.prefetch(ids[0] if len(ids) == 1 else _flat(table.name, ids))))
            return self._plan.run(ids_list, outs)
        finally:
            for table, token in held:
                table.release(token)


# A delta as a replica applied it: (global_step, a reader of its rows, the apply function).
AppliedDelta = tuple[int, Callable[[], Checkpoint], Callable[[Mapping[str, object], Checkpoint], int]]


def _flat(table: str, id_arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([check_ids(table, a).reshape(-1) for a in id_arrays])


class RedisTableSet:
    """The Redis-backed tables of one servable version, its reader threads and follower.

    Thread-safety: lookup_plan, the tables and close may be used from any thread; close()
    once, after the last request (the servable's close)."""

    def __init__(
        self,
        info: VersionInfo,
        imported: bool,
        tables: Mapping[str, RedisTable],
        conn: RedisConnection,
        readers: ThreadPoolExecutor,
        follower: VersionFollower,
        space: KeySpace,
        deltas: list[AppliedDelta],
        wait_seconds: float,
    ) -> None:
        self.info = info
        self.imported = imported  # whether this replica wrote the version into Redis
        self.tables = tables
        self._conn, self._readers, self._follower, self._space = conn, readers, follower, space
        self._deltas = deltas  # the applied deltas, re-read to re-import the version
        self._wait_seconds = wait_seconds  # for another replica's write of a delta (lock_timeout)

    @property
    def version(self) -> str:
        return self.info.version

    @property
    def caches(self) -> dict[str, EmbeddingTable]:
        return {name: table.cache for name, table in self.tables.items()}

    @property
    def follower(self) -> VersionFollower:
        return self._follower

    def apply_delta(self, delta: Checkpoint, apply: Callable[[Mapping[str, object], Checkpoint], int]) -> int:
        """A delta's rows, by `apply` (the updater's apply_delta): written to Redis (and its
        cache) by exactly one replica (redis_import.write_once); the others wait until it
        is written, then drop the changed keys from their caches and read them from Redis
        again. The delta's marker lives as long as the version, so a replica applying the
        delta later (one that starts, or lags) never writes older rows over newer stream
        updates."""
        marker = self._space.delta(self.version, delta.ref.global_step)
        changed = write_once(self._conn, marker, lambda: apply(self.tables, delta),
                             lock_seconds=IMPORT_LOCK_SECONDS, wait_seconds=self._wait_seconds)
        if changed is None:
            changed = apply({name: table.invalidation for name, table in self.tables.items()}, delta)
        # Kept as a way to read it again, not as rows: a re-import needs them only if Redis
        # loses the version (one TF-format delta has no reader and is kept whole).
        self._deltas.append((delta.ref.global_step, delta.with_tables or (lambda: delta), apply))
        return changed

    def lookup_plan(self, bindings: Sequence[tuple[str, str]]) -> RedisLookupPlan:
        """A plan over (table name, combiner) pairs, in the order of the request's id arrays."""
        return RedisLookupPlan([(self.tables[name], combiner) for name, combiner in bindings])

    def close(self) -> None:
        self._follower.stop()
        self._readers.shutdown(wait=True)
        self._conn.close()
        if not self._follower.running:  # one that outlived its join may still write to the caches
            for table in self.tables.values():
                table.close()


def connect(config: ProcessorConfig) -> RedisConnection:
    if config.redis_url is None:
        raise ModelLoadError("feature_store_type 'redis' needs redis_url")
    password = config.redis_password.reveal() if config.redis_password is not None else None
    return RedisConnection(
        config.redis_url,
        password=password,
        cluster=config.redis_cluster,
        timeout=config.redis_timeout_seconds,
    )


def _bound_tables(bindings: Sequence[EmbeddingBinding]) -> dict[str, EmbeddingBinding]:
    first: dict[str, EmbeddingBinding] = {}
    for b in bindings:
        first.setdefault(b.table, b)
    return first


def _checked_rows(bindings: Sequence[EmbeddingBinding], checkpoint: Checkpoint,
                  names: Callable[[str], str] = str) -> dict[str, TableData]:
    """The checkpoint's rows of the bound tables, checked before any is written to Redis."""
    return {name: data for name, (_, data) in bound_table_rows(bindings, checkpoint, names).items()}


def open_redis_tables(
    bindings: Sequence[EmbeddingBinding],
    checkpoint: Checkpoint,
    config: ProcessorConfig,
    model_name: str,
    *,
    reload: Callable[[], Checkpoint] | None = None,
    names: Callable[[str], str] = str,
) -> RedisTableSet:
    """The bound tables of `checkpoint`'s version, served from Redis (importing it first if
    no replica has). Only `checkpoint.ref` and `.manifest` are read unless this replica
    imports; pass `reload` (returning the version with its rows) so the set does not keep
    `checkpoint` alive for a re-import after Redis loses the data.

    Raises ModelLoadError (tables or dims do not match the bindings), VersionNotReadyError
    (another replica's import did not finish within lock_timeout), StorageError (Redis
    unreachable)."""
    bound = _bound_tables(bindings)
    version, step = checkpoint.ref.name, checkpoint.manifest.global_step
    source = reload if reload is not None else (lambda: checkpoint)
    space = KeySpace(model_name)
    conn = connect(config)
    readers: ThreadPoolExecutor | None = None
    deltas: list[AppliedDelta] = []  # as applied, in order
    # A replica given neither rows nor a way to read them (a worker process) never imports.
    can_import = reload is not None or bool(checkpoint.tables)
    try:
        def import_version(applied: Sequence[AppliedDelta] = (),
                           wait: float = float(config.lock_timeout)) -> tuple[VersionInfo, bool]:
            return ensure_version(
                conn, space, version, step,
                (lambda: _checked_rows(bindings, with_deltas(source(), [read() for _, read, _ in applied]), names))
                if can_import else None,
                writers=config.update_thread_num,
                lock_seconds=IMPORT_LOCK_SECONDS,
                wait_seconds=wait,
                grace_seconds=config.redis_version_grace_seconds,
                deltas=[delta_step for delta_step, _, _ in applied],
            )

        started = time.monotonic()
        info, imported = import_version()
        log.info(
            "Redis: version %s of model %s %s in %.1f s", version, model_name,
            "imported" if imported else "found ready", time.monotonic() - started,
        )
        for name, b in bound.items():
            have = info.tables.get(name)
            if have is None or have.dim != b.dim:
                raise ModelLoadError(
                    f"version {version!r} in Redis at {conn.url} has "
                    f"{'no table ' + repr(name) if have is None else f'table {name!r} of dim {have.dim}'}"
                    f", but model.json binds {name!r} with dim {b.dim}; its tables: "
                    f"{ {n: t.dim for n, t in info.tables.items()} }"
                )
        readers = ThreadPoolExecutor(config.read_thread_num, thread_name_prefix="redis-read")
        follower: VersionFollower | None = None
        tables = {
            name: RedisTable(
                name, b.dim, b.default, conn=conn,
                prefix=space.row_prefix(version, name), ready_key=space.ready(version),
                sample_key=space.sample(version, name), rows=info.tables[name].rows,
                cache_rows=config.redis_cache_rows, readers=readers,
                read_threads=config.read_thread_num,
                serve_defaults=config.redis_serve_defaults_when_down,
                on_lost=lambda: follower.mark_lost() if follower is not None else None,
            )
            for name, b in bound.items()
        }

        def reimport() -> None:
            # Redis lost the version: imported again with the deltas this replica applied,
            # so that the rows it is ready with are those its answers name (row updates from
            # the stream since the loss are gone with it).
            applied = list(deltas)
            # One that cannot import looks once and again at the follower's next round.
            info, imported = import_version(applied, float(config.lock_timeout) if can_import else 0.0)
            if imported:  # their rows are in: a replica applying one later only re-reads
                for delta_step, _, _ in applied:
                    mark_written(conn, space.delta(version, delta_step))
                return
            # Another replica imported it with the deltas *it* had applied (its ready key
            # lists them), which may stop short of this one's (its updater lags, or it is
            # the leader of workers that applied a newer delta first): each delta this
            # replica's answers name and the import lacks is written again, once, by
            # whichever replica claims its marker first; the follower serves again only
            # after. A delta the import has is never written again: its rows may be older
            # than a later delta's the import also has.
            for delta_step, read, apply in applied:
                if delta_step not in info.deltas:
                    write_once(conn, space.delta(version, delta_step), lambda: apply(tables, read()),  # noqa: B023
                               lock_seconds=IMPORT_LOCK_SECONDS, wait_seconds=float(config.lock_timeout))

        follower = VersionFollower(conn, space, version, tables, reimport, follow_stream=config.redis_stream_updates)
        follower.start()
    except BaseException:
        if readers is not None:
            readers.shutdown(wait=False)
        conn.close()
        raise
    return RedisTableSet(info, imported, tables, conn, readers, follower, space, deltas, float(config.lock_timeout))
