"""The trainer side of real-time row updates (``feature_store_type: redis``).

    with RowUpdateWriter("redis://cache:6379", "ctr") as writer:
        writer.write("user", keys, values)                 # rows changed by training
        writer.write("user", deleted=np.array([42]))       # rows to drop

Each `write` stores the rows in the Redis namespace of the model's newest imported version
(or `version=`), then appends one entry to the model's update stream; every serving replica
of that version follows the stream and refreshes its local cache, so the update is visible
everywhere within a round trip or so. Replicas still serving an older version ignore it; a
newer full version is expected to contain it (it comes from the same trainer). Entries
beyond `max_stream_len` are trimmed (approximately) — the rows themselves stay in Redis.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import numpy as np

from recserve.embedding.redis_connection import RedisConnection
from recserve.embedding.redis_import import VersionInfo, write_rows
from recserve.embedding.redis_keys import KeySpace, row_keys
from recserve.embedding.redis_updates import RowUpdate
from recserve.errors import CorruptVersionError, ModelNotReadyError

__all__ = ["RowUpdateWriter"]


class RowUpdateWriter:
    """Writes row updates of one model to Redis and its update stream.

    Thread-safety: `write` may be called from several threads (each call is independent;
    updates of the same key from two threads land in an unspecified order)."""

    def __init__(
        self,
        redis_url: str,
        model_name: str,
        *,
        password: str | None = None,
        cluster: bool = False,
        timeout: float = 5.0,
        max_stream_len: int = 100_000,
    ) -> None:
        self._conn = RedisConnection(redis_url, password=password, cluster=cluster, timeout=timeout)
        self._space = KeySpace(model_name)
        self._max_len = max_stream_len
        self._versions: dict[str, VersionInfo] = {}

    def newest_version(self) -> str:
        """The imported version with the highest global_step; ModelNotReadyError if none."""
        newest = self._conn.call("reading versions", lambda c: c.zrange(self._space.versions, 0, 0, desc=True))
        if not newest:
            raise ModelNotReadyError(
                f"no version of model {self._space.model!r} has been imported into Redis at "
                f"{self._conn.url} yet; start a replica with feature_store_type redis first"
            )
        return str(newest[0].decode())

    def _info(self, version: str) -> VersionInfo:
        if version not in self._versions:
            raw = self._conn.call("reading the version", lambda c: c.get(self._space.ready(version)))
            if raw is None:
                raise ModelNotReadyError(
                    f"version {version!r} of model {self._space.model!r} is not in Redis at {self._conn.url}"
                )
            self._versions[version] = VersionInfo.from_json(raw)
        return self._versions[version]

    def write(
        self,
        table: str,
        keys: Any = None,
        values: Any = None,
        *,
        deleted: Any = None,
        version: str | None = None,
    ) -> str:
        """Store `values` [N, dim] under `keys` [N] and delete `deleted` in `table`; returns
        the stream entry's id. CorruptVersionError if the table or shapes do not fit."""
        version = self.newest_version() if version is None else version
        info = self._info(version)
        if table not in info.tables:
            raise CorruptVersionError(
                f"version {version!r} of model {self._space.model!r} has no table {table!r}; "
                f"it has {sorted(info.tables)}"
            )
        dim = info.tables[table].dim
        update = _update(version, table, dim, keys, values, deleted)
        prefix = self._space.row_prefix(version, table)
        if update.keys.size:
            self._conn.call(
                "writing row updates",
                lambda c: write_rows(c, self._conn.cluster, prefix, update.keys, update.values),
            )
        if update.deleted.size:
            names = row_keys(prefix, update.deleted)
            self._conn.call("deleting rows", lambda c: c.delete(*names))
        entry = self._conn.call(
            "appending to the update stream",
            lambda c: c.xadd(self._space.updates, update.to_fields(), maxlen=self._max_len, approximate=True),
        )
        return str(entry.decode())

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _update(version: str, table: str, dim: int, keys: Any, values: Any, deleted: Any) -> RowUpdate:
    k = np.zeros(0, dtype=np.int64) if keys is None else np.asarray(keys)
    v = np.zeros((0, dim), dtype=np.float32) if values is None else np.asarray(values)
    d = np.zeros(0, dtype=np.int64) if deleted is None else np.asarray(deleted)
    if k.dtype.kind not in "iu" or k.ndim != 1 or d.dtype.kind not in "iu" or d.ndim != 1:
        raise CorruptVersionError(f"keys and deleted must be 1-D integer arrays; got {k.dtype}{list(k.shape)} and {d.dtype}{list(d.shape)}")
    if v.dtype.kind != "f" or v.shape != (len(k), dim):
        raise CorruptVersionError(
            f"values for table {table!r} must be floats of shape [{len(k)}, {dim}], got {v.dtype}{list(v.shape)}"
        )
    if (k == -1).any() or (d == -1).any():
        raise CorruptVersionError("key -1 is reserved for padding and cannot be stored")
    return RowUpdate(version, table, k.astype(np.int64), v.astype(np.float32), d.astype(np.int64))
