"""A full version written into the serving tables (`full_update_mode: "in_place"`).

A swap builds the new version's tables beside the serving ones: ~2x the table memory at
its peak. In place, each table of the serving version takes the new version's rows through
the engine's writer, one table and one chunk of rows at a time (new and changed keys
upserted, keys the new version lacks deleted), so the extra memory is a chunk's worth plus
one table's keys. Readers meanwhile see every row entirely old or entirely new, and a mix
of updated and not yet updated rows and tables, as during a delta.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from recserve.errors import ModelLoadError
from recserve.model_store.checkpoint import EMBEDDING_DIR, TABLE_SUFFIX, read_table
from recserve.model_store.manifest import Manifest
from recserve.model_store.storage import Storage, join
from recserve.model_store.versions import VersionRef

__all__ = ["CHUNK_ROWS", "in_place_blocker", "write_in_place"]

log = logging.getLogger("recserve.model_store")

# Rows per engine write. An overwritten row goes to a free row and its old one is retired,
# reusable from the next write on: the storage a table grows by stays about two chunks.
CHUNK_ROWS = 4096


def _table_files(manifest: Manifest) -> dict[str, str]:
    return {name[len(EMBEDDING_DIR):-len(TABLE_SUFFIX)]: name for name in manifest.files
            if name.startswith(EMBEDDING_DIR) and name.endswith(TABLE_SUFFIX)}


def in_place_blocker(servable: Any, manifest: Manifest) -> str | None:
    """Why `manifest`'s version cannot be written into `servable`'s tables; None if it can."""
    if getattr(servable, "redis", None) is not None:
        return "its tables are in Redis (written once per fleet)"
    files = _table_files(manifest)
    missing = sorted(set(servable.tables) - set(files))
    if missing:
        return f"the new version has no table {missing[0]!r}"
    return None


def write_in_place(storage: Storage, ref: VersionRef, manifest: Manifest, tables: Mapping[str, Any]) -> int:
    """Write the version's rows into `tables` (its checksums already verified); returns the
    rows written. Raises ModelLoadError on a dim mismatch (before any table is touched) and
    CorruptVersionError / StorageError from reading (tables written before stay written)."""
    files = _table_files(manifest)
    for name, table in tables.items():
        rows = read_table(storage, join(ref.path, files[name]))
        if rows.values.shape[1] != table.dim:
            raise ModelLoadError(
                f"table {name!r} in version {ref.name!r} has dim {rows.values.shape[1]}; the serving table "
                f"has dim {table.dim}, so it cannot be updated in place")
        del rows  # checked first, all of them; written below, one table at a time
    written = 0
    for name, table in tables.items():
        rows = read_table(storage, join(ref.path, files[name]))
        for start in range(0, len(rows.keys), CHUNK_ROWS):
            table.upsert(rows.keys[start:start + CHUNK_ROWS], rows.values[start:start + CHUNK_ROWS])
        gone = _absent(table.keys(), rows.keys)
        for start in range(0, len(gone), CHUNK_ROWS):
            table.delete(gone[start:start + CHUNK_ROWS])
        written += len(rows.keys)
        log.info("version %s: table %r written in place (%d rows, %d keys deleted)",
                 ref.name, name, len(rows.keys), len(gone))
        del rows
    return written


def _absent(serving: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Keys of `serving` not in `new` (both one table's keys), chunk by chunk, so the
    temporaries stay small next to the tables."""
    new = np.sort(new)
    gone = []
    for start in range(0, len(serving), CHUNK_ROWS * 16):
        chunk = serving[start:start + CHUNK_ROWS * 16]
        at = np.minimum(np.searchsorted(new, chunk), max(len(new) - 1, 0))
        missing = chunk[new[at] != chunk] if len(new) else chunk
        if len(missing):
            gone.append(missing)
    return np.concatenate(gone) if gone else np.zeros(0, np.int64)
