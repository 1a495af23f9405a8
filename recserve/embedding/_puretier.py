"""The pure-Python twin's tiers: a DRAM tier of at most `capacity` rows over one append-only
record file, with the native engine's semantics (write-through upserts, records of 8-byte
key + row, compaction when garbage is at least half the records and one segment's worth)
and the exact policies the native engine approximates: LFU by exact access counts, LRU by
exact recency, over every id looked up rather than a sample.

Every location is an immutable tuple (`_Dram` or `_Disk`) that a key is pointed at in one
dict assignment; a compacted file is unlinked at once but stays readable through the open
descriptor of every location still referring to it, so a reader sees a row whole.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np

from recserve.embedding import tiers
from recserve.errors import StorageError

_CHUNK = 4096


class _RecordFile:
    """One append-only file of records; closed when the last location using it goes."""

    def __init__(self, path: Path, record_bytes: int) -> None:
        self.path = path
        self.record_bytes = record_bytes
        self.records = 0
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def __del__(self) -> None:
        os.close(self.fd)

    def append(self, keys: np.ndarray, rows: np.ndarray) -> int:
        first = self.records
        for start in range(0, len(keys), _CHUNK):
            k = keys[start : start + _CHUNK].astype("<i8")
            r = rows[start : start + _CHUNK].astype("<f4")
            buf = np.concatenate([k.view(np.uint8).reshape(len(k), 8), r.view(np.uint8).reshape(len(k), -1)], axis=1)
            os.pwrite(self.fd, buf.tobytes(), self.records * self.record_bytes)
            self.records += len(k)
        return first

    def read(self, record: int) -> np.ndarray:
        data = os.pread(self.fd, self.record_bytes - 8, record * self.record_bytes + 8)
        if len(data) != self.record_bytes - 8:
            raise StorageError(f"{self.path}: record {record} is cut short")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)

    def read_key(self, record: int) -> int:
        return int(np.frombuffer(os.pread(self.fd, 8, record * self.record_bytes), "<i8")[0])


class _Disk(NamedTuple):
    file: _RecordFile
    record: int


class _Dram(NamedTuple):
    row: np.ndarray
    disk: _Disk


class TierStore:
    """The two tiers of one table. Admission fills the DRAM tier up to its capacity less the
    write reserve, like the native engine; updates of resident rows always stay in DRAM.

    Thread-safety: rows/contains/keys from any number of threads; every mutation (upsert,
    delete, maintain, compact) holds `lock`, which the owning table's writers take.
    """

    def __init__(
        self,
        where: str,
        dim: int,
        keys: np.ndarray,
        values: np.ndarray,
        freqs: np.ndarray | None,
        spec: tiers.TierSpec,
    ) -> None:
        self._spec = spec
        self._settings = config = tiers.settings(where, spec)
        self._dim = dim
        self._record_bytes = 8 + 4 * dim
        self.capacity = tiers.tier_capacity(dim, config.dram_bytes)
        self._segment_records = max(1, config.segment_bytes // self._record_bytes)
        if len(keys) * self._record_bytes > config.ssd_bytes:
            raise StorageError(
                f"{where}: its {len(keys)} rows need {len(keys) * self._record_bytes} bytes in "
                f"the SSD tier, more than its ssd_bytes budget (ev_storage_size[1]) of "
                f"{config.ssd_bytes}"
            )
        try:
            tiers.prepare_directory(config.ssd_path)
            self._file = _RecordFile(config.ssd_path / "seg-00000000.rec", self._record_bytes)
            self._file.append(keys, values)
        except OSError as exc:
            raise StorageError(f"{where}: cannot write the SSD tier under {config.ssd_path} ({exc})") from exc
        self._generation = 0
        self._where: dict[int, _Dram | _Disk] = {key: _Disk(self._file, i) for i, key in enumerate(keys.tolist())}
        self._garbage = 0
        self._counts: collections.Counter[int] = collections.Counter()
        self._recency: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._accesses: collections.deque[int] = collections.deque()
        self.lock = threading.Lock()
        self.stats = dict.fromkeys(("hits", "misses", "promotions", "evictions", "compactions"), 0)
        for i in tiers.resident_rows(self.capacity, freqs, len(keys)).tolist():
            key = int(keys[i])
            self._where[key] = _Dram(np.array(values[i], np.float32), _Disk(self._file, i))
            self._recency[key] = None

    # ---- readers ----

    def rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[n, dim] rows (zeros where absent) and whether each key is stored."""
        rows = np.zeros((keys.size, self._dim), dtype=np.float32)
        found = np.zeros(keys.size, dtype=bool)
        get = self._where.get
        for i, key in enumerate(keys.tolist()):
            at = get(key)
            if at is None:
                continue
            found[i] = True
            if isinstance(at, _Dram):
                rows[i] = at.row
                self.stats["hits"] += 1
            else:
                rows[i] = at.file.read(at.record)
                self.stats["misses"] += 1
            self._accesses.append(key)
        if self.lock.acquire(blocking=False):  # admission runs on whoever finds it free
            try:
                self._maintain()
            finally:
                self.lock.release()
        return rows, found

    def contains(self, keys: np.ndarray) -> np.ndarray:
        where = self._where
        return np.fromiter((k in where for k in keys.tolist()), dtype=bool, count=keys.size)

    def keys(self) -> list[int]:
        return list(self._where)

    def __len__(self) -> int:
        return len(self._where)

    # ---- writers (self.lock held) ----

    def upsert(self, keys: np.ndarray, values: np.ndarray) -> None:
        limit = self._settings.ssd_bytes // self._record_bytes
        if self._file.records + len(keys) > limit:
            self._compact(force=True)
        if self._file.records + len(keys) > limit:
            raise StorageError(
                "embedding engine: upsert needs more SSD tier space than its ssd_bytes budget "
                "(ev_storage_size[1]) allows even after compaction; nothing was applied"
            )
        first = self._file.append(keys, values)
        for i, key in enumerate(keys.tolist()):
            disk = _Disk(self._file, first + i)
            old = self._where.get(key)
            if old is not None:
                self._garbage += 1
            self._where[key] = _Dram(np.array(values[i], np.float32), disk) if isinstance(old, _Dram) else disk
        self._after_write()

    def delete(self, keys: np.ndarray) -> None:
        for key in keys.reshape(-1).tolist():
            if self._where.pop(key, None) is not None:
                self._garbage += 1
                self._recency.pop(key, None)
        self._after_write()

    def _after_write(self) -> None:
        if not self._settings.async_compaction:
            self._compact(force=False)

    def _resident(self) -> int:
        return len(self._recency)

    def _maintain(self) -> None:
        """Applies the policy to the accesses logged since the last call."""
        lfu = self._settings.policy == tiers.POLICIES.index("lfu")
        while self._accesses:
            key = self._accesses.popleft()
            self._counts[key] += 1
            at = self._where.get(key)
            if isinstance(at, _Dram):
                self._recency.move_to_end(key)
            elif at is not None and self.capacity > 0:
                if self._resident() >= self.capacity - tiers.write_reserve(self.capacity):
                    victim = min(self._recency, key=self._counts.__getitem__) if lfu else next(iter(self._recency))
                    if lfu and self._counts[key] <= self._counts[victim]:
                        continue
                    victim_at = self._where[victim]
                    assert isinstance(victim_at, _Dram)
                    self._where[victim] = victim_at.disk
                    del self._recency[victim]
                    self.stats["evictions"] += 1
                self._where[key] = _Dram(at.file.read(at.record), at)
                self._recency[key] = None
                self.stats["promotions"] += 1
        if self._settings.async_compaction:
            self._compact(force=False)

    def maintain(self) -> None:
        with self.lock:
            self._maintain()

    def _compact(self, force: bool) -> bool:
        """Rewrites the live records into a new file when due (or forced); True if it did."""
        live = self._file.records - self._garbage
        due = self._garbage >= self._segment_records and self._garbage >= live
        if not (due or (force and self._garbage)):
            return False
        self._generation += 1
        fresh = _RecordFile(self._settings.ssd_path / f"seg-{self._generation:08d}.rec", self._record_bytes)
        for key, at in list(self._where.items()):
            disk = at.disk if isinstance(at, _Dram) else at
            row = at.row if isinstance(at, _Dram) else disk.file.read(disk.record)
            moved = _Disk(fresh, fresh.append(np.array([key], np.int64), row[None, :]))
            self._where[key] = _Dram(at.row, moved) if isinstance(at, _Dram) else moved
        os.unlink(self._file.path)  # readers still holding it read through its descriptor
        self._file, self._garbage = fresh, 0
        self.stats["compactions"] += 1
        return True

    def compact(self) -> None:
        with self.lock:
            self._compact(force=True)

    def tier_stats(self) -> dict[str, int]:
        with self.lock:
            records = self._file.records
            return {
                "dram_capacity": self.capacity,
                "dram_rows": self._resident(),
                "dram_bytes": self.capacity * (4 * self._dim + tiers.SLOT_OVERHEAD),
                "index_bytes": 0,
                "ssd_segments": 1,
                "ssd_records": records,
                "ssd_live_records": records - self._garbage,
                "ssd_bytes": records * self._record_bytes,
                **self.stats,
            }

    def close(self) -> None:
        self._where = {}
        tiers.remove_directory(self._settings.ssd_path, self._spec.prune_up_to)
