"""Multi-tier storage for embedding tables (DeepRec's ``ev_storage_type`` 12: DRAM + SSDHASH).

    spec = tier_spec(config, model="ranker", version="1200", table="user")   # None unless 12
    table = EmbeddingTable("user", 16, keys, values, default=d, freqs=f, storage=spec)

A tiered table keeps every row in record files under ``spec.ssd_path`` and the hottest
rows, within ``spec.dram_bytes``, in DRAM as well; a lookup reads whichever tier holds each
row in the same call. The directory belongs to the table: files left there by an earlier
process are deleted when the table is built (it is always rebuilt from the checkpoint), and
the directory itself when the table is closed. The admission/eviction policy, the budget
and the environment variables are documented in docs/tiers.md.

Shared by the native engine and its pure-Python twin, so both read the same settings.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np

from recserve.errors import ConfigError

if TYPE_CHECKING:
    from recserve.config import ProcessorConfig

__all__ = ["POLICIES", "TierSpec", "tier_capacity", "tier_spec"]

POLICIES = ("lfu", "lru")  # index = RS_POLICY_*
IO_MODES = ("mmap", "pread")  # index = RS_IO_*
# DRAM bytes per slot besides its row: key, record number, LRU stamp, 4 sketch counters
# (SLOT_OVERHEAD in native/embedding_internal.h).
SLOT_OVERHEAD = 24
RECORD_GLOB = "seg-*.rec"
ASYNC_COMPACTION_ENV = "TF_SSDHASH_ASYNC_COMPACTION"
EVICTION_THREADS_ENV = "TF_MULTI_TIER_EV_EVICTION_THREADS"
_GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class TierSpec:
    """Where and how a table keeps its tiers. Immutable.

    dram_bytes: the DRAM tier's budget (rows plus SLOT_OVERHEAD bytes of metadata each).
    ssd_path: the table's own directory for its record files.
    ssd_bytes: the SSD tier's budget in record bytes (records are 8 + 4 * dim bytes).
    policy: "lfu" (default: measured better on Zipf traffic, see docs/tiers.md) or "lru".
    io: how lookups read records: "mmap" (default) or "pread".
    segment_bytes: size of one record file; compaction works a file at a time.
    async_compaction / eviction_threads: None reads TF_SSDHASH_ASYNC_COMPACTION (unset or
    0/false: compaction runs in the writer's call; 1/true: on the eviction threads) and
    TF_MULTI_TIER_EV_EVICTION_THREADS (default 1) when the table is built.
    prune_up_to: after close, empty parent directories of ssd_path are removed up to (not
    including) this one.
    """

    dram_bytes: int
    ssd_path: str | os.PathLike[str]
    ssd_bytes: int = _GIB
    policy: str = "lfu"
    io: str = "mmap"
    segment_bytes: int = 64 << 20
    async_compaction: bool | None = None
    eviction_threads: int | None = None
    prune_up_to: str | os.PathLike[str] | None = None


def tier_spec(config: ProcessorConfig, *, model: str, version: str, table: str) -> TierSpec | None:
    """The TierSpec of one table of one model version, or None when ev_storage_type is 0 or
    1 (everything in DRAM). Each table gets ev_storage_path/<model>/<version>/<table> (each
    part percent-encoded), so two versions of a model never share files during a swap."""
    if config.ev_storage_type != 12:
        return None
    if not config.ev_storage_path:
        raise ConfigError(
            "ev_storage_type 12 (DRAM + SSD) needs ev_storage_path, the SSD tier's directory",
            field="ev_storage_path",
        )
    root = Path(config.ev_storage_path)
    dram, ssd = config.ev_tier_sizes
    path = root.joinpath(*(quote(part, safe="") for part in (model, version, table)))
    return TierSpec(dram_bytes=dram, ssd_bytes=ssd, ssd_path=str(path), prune_up_to=str(root))


def tier_capacity(dim: int, dram_bytes: int) -> int:
    """DRAM slots (rows) a budget holds."""
    return max(0, int(dram_bytes)) // (4 * dim + SLOT_OVERHEAD) if dram_bytes > 0 else 0


def write_reserve(capacity: int) -> int:
    """DRAM slots admission leaves free for updates of resident rows (rs_tier_write_reserve)."""
    return min(256, (capacity + 15) // 16)


@dataclass(frozen=True)
class Settings:
    """A TierSpec checked, with the environment's defaults filled in."""

    dram_bytes: int
    ssd_path: Path
    ssd_bytes: int
    policy: int
    io: int
    segment_bytes: int
    async_compaction: bool
    eviction_threads: int


def settings(where: str, spec: TierSpec) -> Settings:
    if not isinstance(spec, TierSpec):
        raise TypeError(f"{where}: storage must be a TierSpec or None, got {type(spec).__name__}")
    for field in ("dram_bytes", "ssd_bytes", "segment_bytes"):
        value = getattr(spec, field)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}: {field} must be a non-negative integer, got {value!r}")
    if spec.segment_bytes == 0:
        raise ValueError(f"{where}: segment_bytes must be positive")
    if spec.policy not in POLICIES:
        raise ValueError(f"{where}: policy must be one of {list(POLICIES)}, got {spec.policy!r}")
    if spec.io not in IO_MODES:
        raise ValueError(f"{where}: io must be one of {list(IO_MODES)}, got {spec.io!r}")
    return Settings(
        dram_bytes=int(spec.dram_bytes),
        ssd_path=Path(spec.ssd_path),
        ssd_bytes=int(spec.ssd_bytes),
        policy=POLICIES.index(spec.policy),
        io=IO_MODES.index(spec.io),
        segment_bytes=int(spec.segment_bytes),
        async_compaction=(_env_flag(ASYNC_COMPACTION_ENV) if spec.async_compaction is None else spec.async_compaction),
        eviction_threads=(
            _env_threads() if spec.eviction_threads is None else _threads(spec.eviction_threads, "eviction_threads")
        ),
    )


def _env_flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "0", "false"):
        return False
    if raw in ("1", "true"):
        return True
    raise ConfigError(f"environment variable {name} must be 0, 1, false or true, got {raw!r}")


def _threads(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 64:
        raise ConfigError(f"{what} must be an integer from 1 to 64, got {value!r}")
    return value


def _env_threads() -> int:
    raw = os.environ.get(EVICTION_THREADS_ENV, "1").strip()
    try:
        value: object = int(raw)
    except ValueError:
        value = raw
    return _threads(value, f"environment variable {EVICTION_THREADS_ENV}")


def resident_rows(capacity: int, freqs: np.ndarray | None, n: int) -> np.ndarray:
    """Rows that start in DRAM, as many as the tier takes besides its write reserve: those
    with the highest freqs (ties: earlier rows first), or the first rows without freqs.
    Sorted by row."""
    count = min(capacity - write_reserve(capacity), n)
    if freqs is None or count == n:
        return np.arange(count, dtype=np.int64)
    order = np.argsort(-np.asarray(freqs, dtype=np.int64), kind="stable")[:count]
    return np.sort(order).astype(np.int64)


def prepare_directory(path: Path) -> None:
    """Creates the table's directory, or empties it of an earlier process's record files."""
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob(RECORD_GLOB):
        stale.unlink()


def remove_directory(path: Path, prune_up_to: str | os.PathLike[str] | None) -> None:
    """Removes the table's directory, then its empty parents up to prune_up_to."""
    shutil.rmtree(path, ignore_errors=True)
    if prune_up_to is None:
        return
    root = Path(prune_up_to).resolve()
    parent = path.resolve().parent
    while parent != root and root in parent.parents:
        try:
            parent.rmdir()
        except OSError:  # not empty (another version or table) or gone
            return
        parent = parent.parent
