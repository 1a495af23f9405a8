"""Tables over time: construction, upsert/delete, growth, snapshot, sampling, slot recycling,
and readers racing one writer without ever seeing a torn row."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from recserve.embedding import _native
from recserve.model_spec import DefaultSpec
from tests.threads import Threads, wait_for


def as_dict(keys: np.ndarray, values: np.ndarray) -> dict[int, list[float]]:
    return {int(k): v.tolist() for k, v in zip(keys, values)}


def test_table_properties(engine) -> None:
    spec = DefaultSpec(kind="normal", stddev=0.5, seed=3)
    table = engine.EmbeddingTable("users", 3, [5, 6], np.zeros((2, 3)), default=spec)
    assert (table.name, table.dim, table.default, len(table)) == ("users", 3, spec, 2)


def test_values_are_adopted_without_a_copy_when_they_can_be() -> None:
    values = np.arange(8, dtype=np.float32).reshape(4, 2)
    table = _native.EmbeddingTable("t", 2, np.arange(4), values)
    assert table._values is values
    float64 = np.arange(8, dtype=np.float64).reshape(4, 2)
    assert _native.EmbeddingTable("t", 2, np.arange(4), float64)._values is not float64


def test_upsert_inserts_and_overwrites_and_delete_removes(engine) -> None:
    table = engine.EmbeddingTable(
        "t", 2, np.array([1, 2, 3]), np.array([[1, 1], [2, 2], [3, 3]], np.float32)
    )
    table.upsert(np.array([2, 4, 4]), np.array([[20, 20], [40, 40], [41, 41]], np.float32))
    assert len(table) == 4  # 4 written twice in one batch: the last row wins
    ids = np.array([1, 2, 3, 4, 5], np.int64)
    assert table.lookup(ids).tolist() == [[1, 1], [20, 20], [3, 3], [41, 41], [0, 0]]
    table.delete(np.array([1, 4, 99, -1]))  # unknown keys and padding are ignored
    assert len(table) == 2
    assert table.lookup(ids).tolist() == [[0, 0], [20, 20], [3, 3], [0, 0], [0, 0]]
    assert table.contains(np.array([[1, 2], [3, -1]])).tolist() == [[False, True], [True, False]]
    table.upsert(np.array([1]), np.array([[10, 10]], np.float32))  # a deleted key comes back
    assert table.lookup(np.array([1], np.int64)).tolist() == [[10, 10]]
    assert len(table) == 3


def test_deleted_keys_get_the_default(engine) -> None:
    spec = DefaultSpec(kind="normal", stddev=1.0, seed=8)
    table = engine.EmbeddingTable("t", 4, np.array([7]), np.ones((1, 4), np.float32), default=spec)
    table.delete(np.array([7]))
    assert np.array_equal(
        table.lookup(np.array([7], np.int64)), engine.default_vectors(spec, np.array([7]), 4)
    )


def test_growth_to_ten_times_the_initial_size(engine) -> None:
    rng = np.random.default_rng(0)
    keys = rng.permutation(np.unique(rng.integers(-(2**62), 2**62, size=11_000)))[:11_000]
    values = rng.standard_normal((len(keys), 4)).astype(np.float32)
    table = engine.EmbeddingTable("t", 4, keys[:1000], values[:1000].copy())
    for start in range(1000, len(keys), 700):  # many batches: several index rebuilds
        table.upsert(keys[start : start + 700], values[start : start + 700])
    assert len(table) == len(keys)
    assert np.array_equal(table.lookup(keys), values)
    assert np.array_equal(
        table.lookup(keys[::-1].reshape(-1, 11), "sum"),
        table.lookup(keys[::-1].reshape(-1, 11), "sum"),
    )
    snap_keys, snap_values = table.snapshot()
    assert as_dict(snap_keys, snap_values) == as_dict(keys, values)


def test_snapshot_holds_exactly_the_live_rows(engine) -> None:
    table = engine.EmbeddingTable(
        "t", 2, np.array([1, 2, 3]), np.array([[1, 1], [2, 2], [3, 3]], np.float32)
    )
    table.upsert(np.array([3, 4]), np.array([[30, 30], [4, 4]], np.float32))
    table.delete(np.array([1]))
    keys, values = table.snapshot()
    assert keys.dtype == np.int64 and values.dtype == np.float32
    assert as_dict(keys, values) == {2: [2, 2], 3: [30, 30], 4: [4, 4]}
    empty = engine.EmbeddingTable("e", 2, np.array([], np.int64), np.zeros((0, 2), np.float32))
    assert [a.shape for a in empty.snapshot()] == [(0,), (0, 2)]
    assert sorted(table.keys().tolist()) == [2, 3, 4] and table.keys().dtype == np.int64
    assert empty.keys().shape == (0,)


def test_sample_keys_returns_existing_keys(engine) -> None:
    keys = np.arange(100, 400, 3)
    table = engine.EmbeddingTable("t", 2, keys, np.zeros((len(keys), 2), np.float32))
    table.delete(keys[:50])
    sample = table.sample_keys(500, np.random.default_rng(1))
    assert sample.dtype == np.int64 and sample.shape == (500,)
    assert set(sample.tolist()) <= set(keys[50:].tolist())
    assert len(set(sample.tolist())) > 25
    table.delete(keys)
    with pytest.raises(ValueError, match="table 't' has no rows to sample keys from"):
        table.sample_keys(1, np.random.default_rng(1))
    assert table.sample_keys(0, np.random.default_rng(1)).shape == (0,)


def test_freed_slots_are_recycled_once_no_reader_can_hold_them() -> None:
    table = _native.EmbeddingTable("t", 2, np.arange(10), np.zeros((10, 2), np.float32))
    table.upsert(np.arange(10), np.ones((10, 2), np.float32))  # retires the 10 original slots
    grown = table._storage_rows()
    assert grown == 20
    for version in range(2, 50):
        table.upsert(np.arange(10), np.full((10, 2), version, np.float32))
    assert table._storage_rows() == grown  # no reader in between: every batch reuses slots
    assert table.lookup(np.arange(10)).tolist() == [[49, 49]] * 10


def test_construction_errors(engine) -> None:
    rows = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="table 't': key 5 occurs more than once in keys"):
        engine.EmbeddingTable("t", 2, np.array([5, 6, 5]), rows)
    with pytest.raises(ValueError, match="table 't': key -1 is reserved for padding"):
        engine.EmbeddingTable("t", 2, np.array([5, -1, 6]), rows)
    with pytest.raises(
        ValueError, match=r"table 't': values must be a float array of shape \[3, 4\]"
    ):
        engine.EmbeddingTable("t", 4, np.array([1, 2, 3]), rows)
    with pytest.raises(ValueError, match=r"table 't': keys must be integers, got float64 array"):
        engine.EmbeddingTable("t", 2, np.array([1.0, 2.0, 3.0]), rows)
    with pytest.raises(ValueError, match="table 't': dim must be a positive integer, got 0"):
        engine.EmbeddingTable("t", 0, np.array([1, 2, 3]), rows)
    with pytest.raises(ValueError, match=r"table 't': freqs must be integers of shape \[3\]"):
        engine.EmbeddingTable("t", 2, np.array([1, 2, 3]), rows, freqs=np.array([1, 2]))
    with pytest.raises(ValueError, match="table 't': default must be a DefaultSpec"):
        engine.EmbeddingTable("t", 2, np.array([1, 2, 3]), rows, default="zeros")
    engine.EmbeddingTable(
        "t",
        2,
        np.array([1, 2, 3]),
        rows,
        freqs=np.ones(3, np.int64),
        versions=np.zeros(3, np.int64),
    )


def test_update_errors(engine) -> None:
    table = engine.EmbeddingTable("t", 2, np.array([1]), np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="table 't': key -1 is reserved for padding"):
        table.upsert(np.array([-1]), np.zeros((1, 2), np.float32))
    with pytest.raises(
        ValueError, match=r"table 't': values must be a float array of shape \[1, 2\]"
    ):
        table.upsert(np.array([3]), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="table 't': keys must be integers"):
        table.delete(np.array(["a"]))
    assert len(table) == 1


def test_readers_never_see_a_torn_row(engine) -> None:
    """One writer rewrites rows whose every component is the row's version; readers check
    that each row they get is constant. The writer runs until every reader has done its
    lookups, inserting fresh keys too, so the index is rebuilt under the readers."""
    dim, keys = 256, np.arange(0, 2000, 7, dtype=np.int64)
    table = engine.EmbeddingTable("t", dim, keys, np.zeros((len(keys), dim), np.float32))
    readers, lookups = 2, (300 if engine is _native else 30)
    stop, first_write = threading.Event(), threading.Event()
    failures: list[str] = []

    def write() -> int:
        version = 0
        try:
            while not stop.is_set():
                version += 1
                batch = keys[version % 5 :: 2]
                table.upsert(batch, np.full((len(batch), dim), version, np.float32))
                fresh = np.arange(10**6 + version * 20, 10**6 + version * 20 + 20)
                table.upsert(fresh, np.full((20, dim), version, np.float32))
                table.delete(keys[(version * 11) % len(keys) :: 97])
                first_write.set()
        finally:
            first_write.set()  # a writer that failed lets the readers finish; join re-raises
        return version

    def read() -> set[float]:
        # Reading starts after the first write, so a reader sees the writer's rows, not only
        # the initial zeros (a writer that failed would leave nothing but zeros to see).
        wait_for(first_write, 60, "the writer's first upsert")
        ids = np.concatenate([keys, np.arange(10**6, 10**6 + 4000, 13)])
        seen: set[float] = set()
        for _ in range(lookups):
            rows = table.lookup(ids)
            pooled = table.lookup(ids.reshape(-1, 1), "sum")  # [B, 1]: one row per sample too
            seen.update(np.unique(rows[:, 0]).tolist())
            for got in (rows, pooled):
                torn = np.flatnonzero((got != got[:, :1]).any(axis=1))
                if len(torn):
                    failures.append(
                        f"torn row for key {ids[torn[0]]}: {sorted(set(got[torn[0]].tolist()))}"
                    )
                    break
        return seen

    writer = Threads([write], "the row writer")
    reader_threads = Threads([read] * readers, "the row readers")
    try:
        seen_by_reader = reader_threads.join(timeout=300)
    finally:
        stop.set()
    (versions,) = writer.join(timeout=60)
    assert versions > 1
    assert all(seen - {0.0} for seen in seen_by_reader), seen_by_reader
    assert failures == []
    _, final_values = table.snapshot()
    assert (final_values == final_values[:, :1]).all()
