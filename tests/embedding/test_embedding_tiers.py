"""Tiered tables (DRAM + SSD record files), on both engines: exact values whatever the tier,
the DRAM budget, restarts, write-through updates, compaction racing lookups and updates,
admission policies, configuration and cleanup."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from recserve.config import parse_config
from recserve.embedding import _native, tiers
from recserve.embedding.tiers import TierSpec, tier_spec
from recserve.errors import ConfigError, StorageError
from recserve.model_spec import DefaultSpec
from tests.threads import Threads

DIM = 8
ROW_SLOT = 4 * DIM + tiers.SLOT_OVERHEAD  # DRAM bytes per resident row


def checkpoint(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.permutation(np.unique(rng.integers(-(2**62), 2**62, size=n)))[:n]
    return keys.astype(np.int64), rng.standard_normal((n, DIM)).astype(np.float32)


def spec(tmp_path: Path, rows: int, **kw) -> TierSpec:
    """A DRAM tier of `rows` rows and small record files, so tests cross many of them."""
    return TierSpec(dram_bytes=rows * ROW_SLOT, ssd_path=tmp_path / "t", segment_bytes=4096, **kw)


@pytest.fixture(params=["mmap", "pread"])
def io(request: pytest.FixtureRequest) -> str:
    return request.param


def test_a_table_ten_times_its_dram_budget_serves_the_checkpoint_exactly(engine, io, tmp_path) -> None:
    n = 3000 if engine is _native else 600
    keys, values = checkpoint(n)
    default = DefaultSpec(kind="normal", stddev=0.1, seed=4)
    table = engine.EmbeddingTable("t", DIM, keys, values, default=default, storage=spec(tmp_path, n // 10, io=io))
    dram = engine.EmbeddingTable("d", DIM, keys, values.copy(), default=default)
    stats = table.tier_stats()
    capacity = n // 10
    assert stats["dram_capacity"] == capacity
    assert stats["dram_rows"] == capacity - tiers.write_reserve(capacity)
    assert stats["dram_bytes"] <= n // 10 * ROW_SLOT  # the budget holds
    assert stats["ssd_live_records"] == n and len(table) == n
    assert np.array_equal(table.lookup(keys), values)
    rng = np.random.default_rng(1)
    ids = np.where(rng.random((64, 9)) < 0.2, -1, keys[rng.integers(0, n, (64, 9))])
    ids[0, 0], ids[1, 1] = 77, -5  # unknown keys get the default
    plan = engine.LookupPlan([(table, "mean"), (table, "none"), (dram, "sqrtn")])
    reference = engine.LookupPlan([(dram, "mean"), (dram, "none"), (dram, "sqrtn")])
    for _ in range(3):  # with admissions and evictions in between
        got = plan.run([ids, ids, ids])
        for a, b in zip(got, reference.run([ids, ids, ids])):
            assert np.array_equal(a, b)
        table._maintain()
    assert np.array_equal(table.contains(np.array([keys[5], 77, -1])), [True, False, False])
    snap_keys, snap_values = table.snapshot()
    order = np.argsort(snap_keys)
    assert np.array_equal(snap_keys[order], np.sort(keys))
    assert np.array_equal(snap_values[order], values[np.argsort(keys)])
    assert table.tier_stats()["dram_bytes"] <= n // 10 * ROW_SLOT
    table.close()


def test_the_highest_freqs_start_in_dram(engine, tmp_path) -> None:
    keys, values = checkpoint(400)
    freqs = np.arange(400, dtype=np.int64)[::-1].copy()  # the first 40 keys are the hottest
    table = engine.EmbeddingTable("t", DIM, keys, values, freqs=freqs, storage=spec(tmp_path, 40))
    resident = 40 - tiers.write_reserve(40)  # 37: the rest is kept for updates
    table.lookup(keys[:resident])
    assert (table.tier_stats()["hits"], table.tier_stats()["misses"]) == (resident, 0)
    table.lookup(keys[resident:50])
    assert (table.tier_stats()["hits"], table.tier_stats()["misses"]) == (resident, 50 - resident)
    table.close()


def test_capacity_matches_the_native_formula() -> None:
    for dim, budget in [(8, 0), (8, 55), (8, 56), (16, 10**6), (3, 12345)]:
        assert _native._LIB.rs_tier_capacity(dim, budget) == tiers.tier_capacity(dim, budget)


def test_updates_land_in_whichever_tier_holds_the_row(engine, tmp_path) -> None:
    keys, values = checkpoint(200)
    freqs = np.zeros(200, np.int64)
    freqs[:10] = 1  # keys[:10] in DRAM
    table = engine.EmbeddingTable("t", DIM, keys, values, freqs=freqs, storage=spec(tmp_path, 10))
    fresh = np.full((3, DIM), 7, np.float32)
    table.upsert(np.array([keys[0], keys[100], 12345]), fresh)  # DRAM, SSD, new key
    before = table.tier_stats()
    assert np.array_equal(table.lookup(np.array([keys[0], keys[100], 12345])), fresh)
    after = table.tier_stats()
    assert after["hits"] - before["hits"] >= 1  # keys[0] stayed in DRAM with its new row
    assert after["dram_rows"] <= 10 and len(table) == 201
    table.delete(np.array([keys[1], keys[101], 999]))
    assert np.array_equal(table.lookup(np.array([keys[1], keys[101]])), np.zeros((2, DIM)))
    expected = dict(zip(keys.tolist(), values))
    expected.update({int(keys[0]): fresh[0], int(keys[100]): fresh[1], 12345: fresh[2]})
    del expected[int(keys[1])], expected[int(keys[101])]
    snap_keys, snap_values = table.snapshot()
    assert {int(k): v.tolist() for k, v in zip(snap_keys, snap_values)} == {k: v.tolist() for k, v in expected.items()}
    table.close()


def test_restart_rebuilds_from_the_checkpoint(engine, tmp_path) -> None:
    keys, values = checkpoint(300)
    tier = spec(tmp_path, 20)
    table = engine.EmbeddingTable("t", DIM, keys, values, storage=tier)
    table.upsert(keys[:50], np.ones((50, DIM), np.float32))
    table.delete(keys[50:60])
    assert sorted(p.name for p in Path(tier.ssd_path).iterdir())
    del table
    # What a process that died without closing leaves behind: record files of other rows.
    Path(tier.ssd_path).mkdir(parents=True, exist_ok=True)
    (Path(tier.ssd_path) / "seg-00000099.rec").write_bytes(b"\xff" * 4096)
    restarted = engine.EmbeddingTable("t", DIM, keys, values, storage=tier)
    assert np.array_equal(restarted.lookup(keys), values)
    assert not (Path(tier.ssd_path) / "seg-00000099.rec").exists()
    restarted.close()
    assert not Path(tier.ssd_path).exists()


@pytest.mark.parametrize("async_compaction", [False, True])
def test_compaction_under_concurrent_lookups_and_updates_loses_no_row(engine, async_compaction, tmp_path) -> None:
    """The writer rewrites rows whose every component is the row's version, inserts and
    deletes; readers check every row is whole; small record files make compaction run all
    the time. At the end the table holds exactly what the writer last wrote."""
    dim, n = 16, (2000 if engine is _native else 300)
    keys = np.arange(0, 7 * n, 7, dtype=np.int64)
    tier = TierSpec(
        dram_bytes=(n // 10) * (4 * dim + tiers.SLOT_OVERHEAD),
        ssd_path=tmp_path / "t",
        segment_bytes=8192,
        async_compaction=async_compaction,
        eviction_threads=2,
    )
    table = engine.EmbeddingTable("t", dim, keys, np.zeros((n, dim), np.float32), storage=tier)
    expected = {int(k): 0.0 for k in keys}
    rounds = 60 if engine is _native else 12
    stop = threading.Event()
    reading = threading.Barrier(3, timeout=60)  # the writer starts once both readers read
    failures: list[str] = []

    def read() -> int:
        rng = np.random.default_rng(threading.get_ident() % 2**32)
        ids = np.concatenate([keys, np.arange(10**6, 10**6 + 600)])
        lookups, stopped = 0, False
        while not stopped:  # a first lookup, then until stopped, and once more after
            if lookups == 1:
                reading.wait()
            stopped = lookups > 0 and stop.is_set()
            got = table.lookup(ids[rng.permutation(len(ids))[: len(ids) // 2]])
            torn = np.flatnonzero((got != got[:, :1]).any(axis=1))
            if len(torn):
                failures.append(f"torn row: {sorted(set(got[torn[0]].tolist()))}")
            if engine is _native:
                table._maintain()
            lookups += 1
        return lookups

    readers = Threads([read] * 2, "readers of the tiered table", breaks=[reading])
    try:
        reading.wait()
        for version in range(1, rounds + 1):
            batch = keys[version % 3 :: 2]
            table.upsert(batch, np.full((len(batch), dim), version, np.float32))
            expected.update(dict.fromkeys(batch.tolist(), float(version)))
            fresh = np.arange(10**6 + version * 10, 10**6 + version * 10 + 10)
            table.upsert(fresh, np.full((10, dim), version, np.float32))
            expected.update(dict.fromkeys(fresh.tolist(), float(version)))
            gone = keys[(version * 13) % n :: 53]
            table.delete(gone)
            for key in gone.tolist():
                expected.pop(key, None)
    finally:
        stop.set()
        lookups = readers.join(timeout=120)  # a reader's failure, not the barrier's, is reported
    assert min(lookups) >= 2, lookups  # every reader read before the writer and after it started
    assert failures == []
    table._maintain()
    stats = table.tier_stats()
    assert stats["compactions"] > 0
    assert stats["ssd_live_records"] == len(expected) == len(table)
    snap_keys, snap_values = table.snapshot()
    assert {int(k): float(v[0]) for k, v in zip(snap_keys, snap_values)} == expected
    assert (snap_values == snap_values[:, :1]).all()
    ids = np.array(sorted(expected), np.int64)
    assert np.array_equal(table.lookup(ids)[:, 0], [expected[k] for k in ids.tolist()])
    table.close()


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_hot_keys_end_up_in_dram(engine, policy, tmp_path) -> None:
    keys, values = checkpoint(1000)
    table = engine.EmbeddingTable(
        "t", DIM, keys, values, storage=spec(tmp_path, 50, policy=policy)
    )  # starts with keys[:50] resident: the hot ones below are all on SSD
    hot = keys[500:520]
    rng = np.random.default_rng(2)
    for _ in range(40):  # the hot keys and a few cold ones, interleaved
        table.lookup(rng.permutation(np.concatenate([np.repeat(hot, 8), keys[rng.integers(0, 1000, 10)]])))
        table._maintain()
    for _ in range(10):  # then only the hot keys: sampled LRU settles too
        table.lookup(np.repeat(hot, 8))
        table._maintain()
    before = table.tier_stats()
    assert np.array_equal(table.lookup(hot), values[500:520])
    after = table.tier_stats()
    assert after["hits"] - before["hits"] == len(hot)
    assert after["promotions"] >= len(hot) and after["evictions"] > 0
    assert after["dram_rows"] <= 50
    table.close()


def test_an_ssd_budget_too_small_is_an_error(engine, tmp_path) -> None:
    keys, values = checkpoint(100)
    record = 8 + 4 * DIM
    small = TierSpec(dram_bytes=0, ssd_path=tmp_path / "t", ssd_bytes=99 * record)
    with pytest.raises(
        StorageError,
        match=rf"table 't': its 100 rows need {100 * record} bytes in the SSD tier, more than "
        rf"its ssd_bytes budget \(ev_storage_size\[1\]\) of {99 * record}",
    ):
        engine.EmbeddingTable("t", DIM, keys, values, storage=small)
    exact = TierSpec(dram_bytes=0, ssd_path=tmp_path / "t", ssd_bytes=120 * record)
    table = engine.EmbeddingTable("t", DIM, keys, values, storage=exact)
    table.upsert(keys[:20], values[:20])  # fits: 120 records
    with pytest.raises(StorageError, match="more SSD tier space than its ssd_bytes budget"):
        table.upsert(np.arange(10**6, 10**6 + 30), np.ones((30, DIM), np.float32))
    assert len(table) == 100 and np.array_equal(table.lookup(keys), values)
    table.upsert(keys[:20], values[:20] + 1)  # compaction makes room again
    assert np.array_equal(table.lookup(keys[:20]), values[:20] + 1)
    table.close()


def test_tier_spec_from_the_processor_config(tmp_path) -> None:
    base = {"savedmodel_dir": "/m"}
    assert tier_spec(parse_config(base), model="m", version="1", table="t") is None
    dram = parse_config({**base, "ev_storage_type": 1})
    assert tier_spec(dram, model="m", version="1", table="t") is None
    config = parse_config(
        {
            **base,
            "ev_storage_type": 12,
            "ev_storage_path": str(tmp_path),
            "ev_storage_size": [4096],
        }
    )
    got = tier_spec(config, model="rank er", version="v/2", table="user/emb")
    assert got == TierSpec(
        dram_bytes=4096,
        ssd_bytes=1 << 30,
        ssd_path=str(tmp_path / "rank%20er" / "v%2F2" / "user%2Femb"),
        prune_up_to=str(tmp_path),
    )


def test_close_removes_the_files_and_empty_parents(engine, tmp_path) -> None:
    keys, values = checkpoint(50)
    root = tmp_path / "ev"
    one, two = (TierSpec(dram_bytes=0, ssd_path=root / "m" / "v1" / name, prune_up_to=root) for name in ("a", "b"))
    first = engine.EmbeddingTable("a", DIM, keys, values, storage=one)
    second = engine.EmbeddingTable("b", DIM, keys, values, storage=two)
    first.close()
    first.close()  # idempotent
    assert sorted(p.name for p in (root / "m" / "v1").iterdir()) == ["b"]
    second.close()
    assert root.exists() and list(root.iterdir()) == []


def test_tier_environment_variables(engine, tmp_path, monkeypatch) -> None:
    keys, values = checkpoint(10)
    tier = TierSpec(dram_bytes=0, ssd_path=tmp_path / "t")
    monkeypatch.setenv("TF_SSDHASH_ASYNC_COMPACTION", "maybe")
    with pytest.raises(
        ConfigError,
        match="environment variable TF_SSDHASH_ASYNC_COMPACTION must be 0, 1, false or true, got 'maybe'",
    ):
        engine.EmbeddingTable("t", DIM, keys, values, storage=tier)
    monkeypatch.setenv("TF_SSDHASH_ASYNC_COMPACTION", "true")
    monkeypatch.setenv("TF_MULTI_TIER_EV_EVICTION_THREADS", "0")
    with pytest.raises(
        ConfigError,
        match="environment variable TF_MULTI_TIER_EV_EVICTION_THREADS must be an integer from 1 to 64, got 0",
    ):
        engine.EmbeddingTable("t", DIM, keys, values, storage=tier)
    monkeypatch.setenv("TF_MULTI_TIER_EV_EVICTION_THREADS", "3")
    table = engine.EmbeddingTable("t", DIM, keys, values, storage=tier)
    assert np.array_equal(table.lookup(keys), values)
    table.close()


def test_bad_tier_specs(engine, tmp_path) -> None:
    keys, values = checkpoint(10)
    with pytest.raises(ValueError, match=r"table 't': policy must be one of \['lfu', 'lru'\], got 'fifo'"):
        engine.EmbeddingTable("t", DIM, keys, values, storage=TierSpec(dram_bytes=0, ssd_path=tmp_path, policy="fifo"))
    with pytest.raises(ValueError, match="table 't': dram_bytes must be a non-negative integer, got -1"):
        engine.EmbeddingTable("t", DIM, keys, values, storage=TierSpec(dram_bytes=-1, ssd_path=tmp_path))
    with pytest.raises(ValueError, match="table 't': key 3 occurs more than once in keys"):
        engine.EmbeddingTable(
            "t", DIM, np.array([1, 3, 3]), values[:3], storage=TierSpec(dram_bytes=0, ssd_path=tmp_path / "x")
        )
    assert not (tmp_path / "x").exists()
