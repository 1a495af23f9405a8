"""Redis-backed tables against a real redis-server: lookups equal the checkpoint's rows,
one importer among replicas, version switches, deltas written through, the local cache's
bounds, Redis Cluster through redis-py's cluster client."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from recserve.config import ProcessorConfig
from recserve.embedding import EmbeddingTable, default_vectors
from recserve.embedding.redis_import import KEEP_VERSIONS
from recserve.embedding.redis_keys import KeySpace, row_keys
from recserve.embedding.redis_store import RedisTableSet, open_redis_tables
from recserve.errors import ModelLoadError
from recserve.export import TableData, write_checkpoint
from recserve.model_spec import DefaultSpec, EmbeddingBinding
from recserve.model_store.checkpoint import Checkpoint, load_checkpoint
from recserve.model_store.manifest import read_manifest
from recserve.model_store.storage import LocalStorage
from recserve.model_store.versions import VersionRef
from tests.threads import Threads, wait_for

MODEL = "ctr"
USER_DEFAULT = DefaultSpec("normal", 0.1, 7)
ZEROS = DefaultSpec()
BINDINGS = [
    EmbeddingBinding("user_id", "user", 8, "user_emb", default=USER_DEFAULT),
    EmbeddingBinding("clicked", "item", 4, "clicked_emb", combiner="mean"),
    EmbeddingBinding("item_id", "item", 4, "item_emb"),
]


def tables_for(step: int, n: int = 3000) -> dict[str, TableData]:
    rng = np.random.default_rng(step)
    out = {}
    for name, dim in (("user", 8), ("item", 4)):
        keys = rng.choice(2**40, size=n, replace=False).astype(np.int64) - 2**39  # negatives too
        out[name] = TableData(keys, rng.standard_normal((n, dim)).astype(np.float32) + step)
    return out


def version(root: Path, step: int, tables: dict[str, TableData] | None = None) -> Checkpoint:
    path = write_checkpoint(root, tables or tables_for(step), global_step=step)
    storage = LocalStorage()
    return load_checkpoint(storage, VersionRef(path.name, str(path), step), read_manifest(storage, str(path)))


def config(server: Any, **fields: Any) -> ProcessorConfig:
    return ProcessorConfig(
        savedmodel_dir="/unused", feature_store_type="redis", redis_url=server.url, **fields
    )


def reference(ckpt: Checkpoint, table: str, default: DefaultSpec = ZEROS) -> EmbeddingTable:
    data = ckpt.tables[table]
    return EmbeddingTable(table, data.values.shape[1], data.keys, data.values.copy(), default=default)


def request(ckpt: Checkpoint, rng: np.random.Generator, batch: int = 64) -> list[np.ndarray]:
    users = np.concatenate([rng.choice(ckpt.tables["user"].keys, batch - 4), rng.integers(0, 2**50, 4)])
    items = ckpt.tables["item"].keys
    clicked = rng.choice(items, (batch, 5))
    clicked[:, 3:] = -1
    clicked[0, 0] = 123456789  # unknown: zeros default, counts toward the mean
    return [users.astype(np.int64), clicked.astype(np.int64), rng.choice(items, batch).astype(np.int64)]


def expected(ckpt: Checkpoint, ids: list[np.ndarray]) -> list[np.ndarray]:
    user, item = reference(ckpt, "user", USER_DEFAULT), reference(ckpt, "item")
    return [user.lookup(ids[0]), item.lookup(ids[1], "mean"), item.lookup(ids[2])]


PLAN = [("user", "none"), ("item", "mean"), ("item", "none")]


@pytest.fixture
def opened() -> Any:
    sets: list[RedisTableSet] = []

    def open_(*args: Any, **kwargs: Any) -> RedisTableSet:
        s = open_redis_tables(*args, **kwargs)
        sets.append(s)
        return s

    yield open_
    for s in sets:
        s.close()


def test_lookups_equal_the_checkpoint_rows(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    store = opened(BINDINGS, ckpt, config(redis_server), MODEL)
    assert store.imported and store.version == "1"
    plan = store.lookup_plan(PLAN)
    rng = np.random.default_rng(0)
    for _ in range(3):  # cold, then warm cache
        ids = request(ckpt, rng)
        for got, want in zip(plan.run(ids), expected(ckpt, ids)):
            np.testing.assert_array_equal(got, want)
    raw = redis_server.client().get(row_keys(KeySpace(MODEL).row_prefix("1", "user"), ckpt.tables["user"].keys[:1])[0])
    assert raw == ckpt.tables["user"].values[0].astype("<f4").tobytes()


def test_rows_are_fetched_in_batches_and_unknown_keys_only_once(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    store = opened(BINDINGS, ckpt, config(redis_server), MODEL)
    plan = store.lookup_plan([("user", "none")])
    client = redis_server.client()
    ids = np.concatenate([ckpt.tables["user"].keys[:100], np.arange(1, 51)]).astype(np.int64)
    client.config_resetstat()
    plan.run([ids])
    assert client.info("commandstats")["cmdstat_mget"]["calls"] == 1
    plan.run([ids])  # known rows cached, unknown keys remembered as absent
    plan.run([ids[::-1].copy()])
    assert client.info("commandstats")["cmdstat_mget"]["calls"] == 1
    np.testing.assert_array_equal(plan.run([ids])[0], reference(ckpt, "user", USER_DEFAULT).lookup(ids))


def test_big_batches_split_over_read_threads(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    store = opened(BINDINGS, ckpt, config(redis_server, read_thread_num=4), MODEL)
    ids = ckpt.tables["user"].keys[:2048].copy()
    client = redis_server.client()
    client.config_resetstat()
    np.testing.assert_array_equal(store.lookup_plan([("user", "none")]).run([ids])[0], ckpt.tables["user"].values[:2048])
    assert client.info("commandstats")["cmdstat_mget"]["calls"] == 4


def test_cache_stays_bounded_and_lookups_stay_exact(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    store = opened(BINDINGS, ckpt, config(redis_server, redis_cache_rows=500), MODEL)
    plan = store.lookup_plan(PLAN)
    rng = np.random.default_rng(1)
    for _ in range(20):
        ids = request(ckpt, rng, batch=80)
        for got, want in zip(plan.run(ids), expected(ckpt, ids)):
            np.testing.assert_array_equal(got, want)
        assert len(store.tables["user"].cache) <= 500 and len(store.tables["item"].cache) <= 500


def test_concurrent_lookups_with_evictions_are_exact(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    # A 10 s socket timeout: on a loaded 2-core machine a round trip took over the 1 s
    # default (measured at load 10); this test is about evictions, not timeouts.
    store = opened(BINDINGS, ckpt, config(redis_server, redis_cache_rows=300, redis_timeout_seconds=10), MODEL)
    plan = store.lookup_plan(PLAN)

    def worker(seed: int) -> int:
        rng = np.random.default_rng(seed)
        for lookups in range(1, 31):
            ids = request(ckpt, rng, batch=100)
            for got, want in zip(plan.run(ids), expected(ckpt, ids)):
                np.testing.assert_array_equal(got, want)
        return lookups

    workers = Threads([lambda seed=seed: worker(seed) for seed in range(4)], "concurrent Redis lookups")
    assert workers.join(timeout=120) == [30] * 4


def test_replicas_share_one_import(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    loads = []

    def reload() -> Checkpoint:
        loads.append(1)
        return ckpt

    barrier = threading.Barrier(3, timeout=60)

    def replica() -> RedisTableSet:
        barrier.wait()
        return opened(BINDINGS, ckpt, config(redis_server), MODEL, reload=reload)

    results = Threads([replica] * 3, "replicas opening one version").join(timeout=60)
    assert sorted(s.imported for s in results) == [False, False, True]
    assert len(loads) == 1  # only the importer read the rows
    rng = np.random.default_rng(2)
    ids = request(ckpt, rng)
    for s in results:
        for got, want in zip(s.lookup_plan(PLAN).run(ids), expected(ckpt, ids)):
            np.testing.assert_array_equal(got, want)


def test_version_switch_never_mixes_versions(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    # Every value of version s is s, so a response's version is readable.
    def tables(step: int) -> dict[str, TableData]:
        keys = np.arange(1, 2001, dtype=np.int64)
        return {
            "user": TableData(keys, np.full((2000, 8), step, np.float32)),
            "item": TableData(keys, np.full((2000, 4), step, np.float32)),
        }

    v1 = version(tmp_path, 1, tables(1))
    current = [opened(BINDINGS, v1, config(redis_server), MODEL)]
    current_plan = [current[0].lookup_plan(PLAN)]
    stop = threading.Event()
    saw = {step: threading.Event() for step in (1.0, 2.0, 3.0)}
    errors: list[str] = []

    def reader() -> set[float]:
        rng = np.random.default_rng(3)
        seen: set[float] = set()
        while not stop.is_set():
            plan = current_plan[0]  # one lease: the whole request uses one servable
            ids = [rng.integers(1, 2001, 64), rng.integers(1, 2001, (64, 5)), rng.integers(1, 2001, 64)]
            values = np.unique(np.concatenate([o.ravel() for o in plan.run(ids)]))
            if len(values) != 1:
                errors.append(f"mixed response: {values}")
            seen.add(float(values[0]))
            if float(values[0]) in saw:
                saw[float(values[0])].set()
        return seen

    thread = Threads([reader], "the reader across version switches")
    try:
        wait_for(saw[1.0], 60, "the reader's first response, from version 1", thread)
        for step in (2, 3):
            nxt = opened(BINDINGS, version(tmp_path, step, tables(step)), config(redis_server), MODEL)
            current_plan[0] = nxt.lookup_plan(PLAN)
            current.append(nxt)
        wait_for(saw[3.0], 60, "the reader's first response from version 3", thread)
    finally:
        stop.set()
        (seen,) = thread.join(timeout=60)
    assert not errors, errors[:3]
    assert {1.0, 3.0} <= seen <= {1.0, 2.0, 3.0}, seen
    assert current_plan[0].run([np.array([1]), np.array([[1]]), np.array([1])])[0][0, 0] == 3.0
    # Version 1 is beyond the newest KEEP_VERSIONS: it expires after the grace period.
    client = redis_server.client()
    space = KeySpace(MODEL)
    assert KEEP_VERSIONS == 2
    assert [v.decode() for v in client.zrange(space.versions, 0, -1)] == ["2", "3"]
    assert 0 < client.pttl(space.ready("1")) <= 600_000
    assert 0 < client.pttl(row_keys(space.row_prefix("1", "user"), np.array([1]))[0]) <= 600_000
    assert client.pttl(space.ready("2")) == -1 and client.pttl(space.ready("3")) == -1


def test_deltas_write_through_to_redis_and_the_cache(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    a = opened(BINDINGS, ckpt, config(redis_server), MODEL)
    b = opened(BINDINGS, ckpt, config(redis_server), MODEL)
    keys = ckpt.tables["user"].keys[:3].copy()
    plan_a, plan_b = a.lookup_plan([("user", "none")]), b.lookup_plan([("user", "none")])
    plan_a.run([keys])
    plan_b.run([keys])  # cached in both replicas
    rows = np.full((2, 8), 9.0, np.float32)
    for replica in (a, b):  # each replica's updater applies the same delta
        replica.tables["user"].upsert(keys[:2], rows)
        replica.tables["user"].delete(keys[2:])
    for plan in (plan_a, plan_b):
        got = plan.run([keys])[0]
        np.testing.assert_array_equal(got[:2], rows)
        np.testing.assert_array_equal(got[2:], default_vectors(USER_DEFAULT, keys[2:], 8))
    c = opened(BINDINGS, ckpt, config(redis_server), MODEL)  # a new replica reads Redis
    np.testing.assert_array_equal(c.lookup_plan([("user", "none")]).run([keys[:2]])[0], rows)


def test_table_missing_from_version_is_refused_before_import(redis_server: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1, {"user": tables_for(1)["user"]})
    with pytest.raises(ModelLoadError, match=r"table 'item' \(bound by input 'clicked'\) is not in checkpoint version '1'"):
        open_redis_tables(BINDINGS, ckpt, config(redis_server), MODEL)
    assert redis_server.client().dbsize() == 0


def test_sample_keys_come_from_the_version(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    store = opened(BINDINGS, ckpt, config(redis_server), MODEL)
    sample = store.tables["user"].sample_keys(50, np.random.default_rng(0))
    assert sample.shape == (50,) and np.isin(sample, ckpt.tables["user"].keys).all()
    assert len(store.tables["user"]) == 3000


def test_redis_cluster_client(redis_cluster_node: Any, opened: Any, tmp_path: Path) -> None:
    ckpt = version(tmp_path, 1)
    store = opened(BINDINGS, ckpt, config(redis_cluster_node, redis_cluster=True), MODEL)
    assert store.imported
    rng = np.random.default_rng(4)
    ids = request(ckpt, rng)
    for got, want in zip(store.lookup_plan(PLAN).run(ids), expected(ckpt, ids)):
        np.testing.assert_array_equal(got, want)
    assert redis.RedisCluster.from_url(redis_cluster_node.url).ping() is True


def test_a_rows_default_answers_keys_redis_lacks(redis_server: Any, opened: Any, tmp_path: Path) -> None:
    """The cache's default is the binding's: with `{"rows": file}`, a key absent from Redis
    (never stored, or deleted by a delta) answers row key mod k of the matrix, pooled too."""
    matrix = np.random.default_rng(9).standard_normal((5, 4)).astype(np.float32)
    rows_default = DefaultSpec(kind="rows", rows_file="defaults/item.npy", matrix=matrix)
    bindings = [EmbeddingBinding("clicked", "item", 4, "clicked_emb", combiner="sum", default=rows_default),
                EmbeddingBinding("item_id", "item", 4, "item_emb", default=rows_default)]
    ckpt = version(tmp_path, 1, {"item": tables_for(1)["item"]})
    store = opened(bindings, ckpt, config(redis_server), MODEL)
    plan = store.lookup_plan([("item", "none"), ("item", "sum")])
    stored = ckpt.tables["item"]
    known = {int(k): v for k, v in zip(stored.keys, stored.values)}
    unknown = np.array([k for k in (3, 4, -6, 2**62 + 1, -(2**63)) if k not in known], np.int64)
    store.tables["item"].delete(stored.keys[:1])
    del known[int(stored.keys[0])]
    ids = np.concatenate([unknown, stored.keys[:3]]).astype(np.int64)
    assert len(ids) == 8  # none of the unknown ones is in the checkpoint
    grid = ids.reshape(2, 4)

    def row(k: int) -> np.ndarray:
        return known[k] if k in known else matrix[k % 5]

    for _ in range(2):  # cold: fetched and found absent; warm: remembered as absent
        single, pooled = plan.run([ids, grid])
        np.testing.assert_array_equal(single, np.array([row(int(k)) for k in ids], np.float32))
        want = np.zeros((2, 4), np.float32)
        for b, sample in enumerate(grid):
            for k in sample:
                want[b] += row(int(k))
        np.testing.assert_array_equal(pooled, want)
