"""Record files of the SSD tier changed behind the table's back (found by tests/fuzz/fuzz_ssd):
the native engine reports the damage and keeps serving every row it can still read, never a
read through a deleted file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from recserve.embedding import _native
from recserve.embedding.tiers import TierSpec
from recserve.errors import StorageError

DIM = 8
RECORD = 8 + 4 * DIM   # a record: its key, then its row
PER_SEGMENT = 4096 // RECORD


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_a_damaged_key_keeps_its_record_file_out_of_compaction(io: str, tmp_path: Path) -> None:
    n = PER_SEGMENT + 50   # two record files
    keys = np.arange(n, dtype=np.int64) * 11 + 5
    values = np.arange(n * DIM, dtype=np.float32).reshape(n, DIM)
    tier = TierSpec(dram_bytes=0, ssd_path=tmp_path / "t", segment_bytes=4096, io=io)
    table = _native.EmbeddingTable("t", DIM, keys, values, storage=tier)
    # Someone overwrites the stored key of record 0 (keys[0]'s row) in the first file.
    first = tmp_path / "t" / "seg-00000000.rec"
    with first.open("r+b") as f:
        f.write(struct.pack("<q", 123456789))
    # Deleting the rest of that file's rows (and one more: compaction waits for a file's
    # worth of garbage) leaves it one live record: compaction, run by the writer's call,
    # finds keys[0]'s record live yet not named by its stored key.
    with pytest.raises(StorageError, match="failed reading or writing the SSD tier"):
        table.delete(keys[1:PER_SEGMENT + 1])
    expected = values.copy()
    expected[1:PER_SEGMENT + 1] = 0   # the delete itself was applied before compaction
    assert np.array_equal(table.lookup(keys), expected)
    assert first.exists()   # the damaged file keeps serving keys[0]
    # Compaction skips that file from now on: later writes and compactions succeed.
    table.upsert(keys[PER_SEGMENT + 1:], np.ones((n - PER_SEGMENT - 1, DIM), np.float32))
    table._compact()
    expected[PER_SEGMENT + 1:] = 1
    assert np.array_equal(table.lookup(keys), expected)
    snap_keys, snap_values = table.snapshot()
    order = np.argsort(snap_keys)
    live = np.r_[0, PER_SEGMENT + 1:n]
    assert np.array_equal(snap_keys[order], keys[live]) and np.array_equal(snap_values[order], expected[live])
    table.close()
