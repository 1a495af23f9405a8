"""Redis killed and restarted under Redis-backed tables: fail fast with a clear 503 (or serve
defaults when configured), keep serving cached rows, re-import the lost version once Redis
is back, and a dead importer's lock lapses. Waits are bounded; nothing is timed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recserve.config import ProcessorConfig, Secret
from recserve.embedding import default_vectors
from recserve.embedding.redis_connection import RedisConnection
from recserve.embedding.redis_import import ensure_version
from recserve.embedding.redis_keys import KeySpace
from recserve.embedding.redis_store import open_redis_tables
from recserve.errors import StorageError, VersionNotReadyError
from recserve.export import TableData, write_checkpoint
from recserve.model_spec import DefaultSpec, EmbeddingBinding
from recserve.model_store.checkpoint import Checkpoint, load_checkpoint
from recserve.model_store.manifest import read_manifest
from recserve.model_store.storage import LocalStorage
from recserve.model_store.versions import VersionRef

DEFAULT = DefaultSpec("normal", 0.5, 3)
BINDINGS = [EmbeddingBinding("user_id", "user", 4, "user_emb", default=DEFAULT)]
KEYS = np.arange(1, 1001, dtype=np.int64)
VALUES = np.arange(4000, dtype=np.float32).reshape(1000, 4)


def checkpoint(root: Path) -> Checkpoint:
    path = write_checkpoint(root, {"user": TableData(KEYS, VALUES)}, global_step=1)
    storage = LocalStorage()
    return load_checkpoint(storage, VersionRef(path.name, str(path), 1), read_manifest(storage, str(path)))


def config(server: Any, **fields: Any) -> ProcessorConfig:
    return ProcessorConfig(savedmodel_dir="/unused", feature_store_type="redis", redis_url=server.url,
                           redis_timeout_seconds=0.5, **fields)


def eventually(check: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        time.sleep(0.05)


def succeeds(action: Callable[[], Any]) -> bool:
    try:
        action()
        return True
    except StorageError:
        return False


def test_outage_fails_fast_then_recovers_with_a_reimport(redis_server: Any, tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path)
    a = open_redis_tables(BINDINGS, ckpt, config(redis_server), "m")
    b = open_redis_tables(BINDINGS, ckpt, config(redis_server), "m")
    try:
        plan = b.lookup_plan([("user", "none")])
        np.testing.assert_array_equal(plan.run([KEYS[:10]])[0], VALUES[:10])

        redis_server.kill()
        np.testing.assert_array_equal(plan.run([KEYS[:10]])[0], VALUES[:10])  # cached rows serve
        with pytest.raises(StorageError) as caught:
            plan.run([KEYS[10:20]])
        assert caught.value.status == 503
        assert f"Redis at {redis_server.url} is unreachable" in caught.value.message
        assert "fetching rows of table 'user'" in caught.value.message
        with pytest.raises(StorageError, match="not retrying for another"):  # the circuit is open
            plan.run([KEYS[10:20]])

        redis_server.start()  # same port, empty: the version's rows are gone
        eventually(lambda: succeeds(lambda: plan.run([KEYS[10:20]])), "lookups work again")
        np.testing.assert_array_equal(plan.run([KEYS[10:30]])[0], VALUES[10:30])
        plan_a = a.lookup_plan([("user", "none")])  # the other replica's follower re-checks too
        eventually(lambda: succeeds(lambda: plan_a.run([KEYS[500:501]])), "the other replica serves")
        np.testing.assert_array_equal(plan_a.run([KEYS[500:600]])[0], VALUES[500:600])
        assert redis_server.client().exists(KeySpace("m").ready("1"))
    finally:
        a.close()
        b.close()


def test_outage_serves_defaults_when_configured(redis_server: Any, tmp_path: Path) -> None:
    store = open_redis_tables(BINDINGS, checkpoint(tmp_path), config(redis_server, redis_serve_defaults_when_down=True), "m")
    try:
        plan = store.lookup_plan([("user", "none")])
        plan.run([KEYS[:5]])
        redis_server.kill()
        got = plan.run([KEYS[:10]])[0]
        np.testing.assert_array_equal(got[:5], VALUES[:5])
        np.testing.assert_array_equal(got[5:], default_vectors(DEFAULT, KEYS[5:10], 4))
    finally:
        store.close()


def test_unreachable_redis_fails_the_open_with_the_url_not_the_password(tmp_path: Path) -> None:
    cfg = ProcessorConfig(savedmodel_dir="/unused", feature_store_type="redis", redis_url="redis://127.0.0.1:1",
                          redis_password=Secret("hunter2"), redis_timeout_seconds=0.5)
    with pytest.raises(StorageError) as caught:
        open_redis_tables(BINDINGS, checkpoint(tmp_path), cfg, "m")
    assert "Redis at redis://127.0.0.1:1 is unreachable" in caught.value.message
    assert "hunter2" not in caught.value.message


def test_a_dead_importers_lock_lapses_and_another_replica_imports(redis_server: Any, tmp_path: Path) -> None:
    space = KeySpace("m")
    client = redis_server.client()
    client.set(space.lock("1"), "crashed-replica", px=300)  # taken, never renewed
    conn = RedisConnection(redis_server.url)
    try:
        info, imported = ensure_version(
            conn, space, "1", 1, lambda: {"user": TableData(KEYS, VALUES)},
            writers=2, lock_seconds=5, wait_seconds=30, grace_seconds=60,
        )
        assert imported and info.tables["user"].dim == 4
        assert client.get(space.lock("1")) is None  # released after the import
    finally:
        conn.close()


def test_waiting_for_another_import_is_bounded(redis_server: Any) -> None:
    space = KeySpace("m")
    redis_server.client().set(space.lock("1"), "busy-replica", px=60_000)
    conn = RedisConnection(redis_server.url)
    sleeps: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += max(seconds, 0.1)

    try:
        with pytest.raises(VersionNotReadyError, match=r"version '1' of model 'm' is being imported into "
                           r"Redis by another replica and was not ready after 2 s \(lock_timeout\)"):
            ensure_version(conn, space, "1", 1, dict, writers=1, lock_seconds=5, wait_seconds=2,
                           grace_seconds=60, clock=lambda: now[0], sleep=sleep)
        assert sleeps and max(sleeps) <= 0.5
    finally:
        conn.close()
