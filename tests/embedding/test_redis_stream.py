"""Real-time row updates: `RowUpdateWriter` (recserve.export) writes rows to Redis and the
model's stream; every replica's cache follows within a bounded wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recserve.config import ProcessorConfig
from recserve.embedding import default_vectors
from recserve.embedding.redis_store import open_redis_tables
from recserve.errors import CorruptVersionError, ModelNotReadyError
from recserve.export import RowUpdateWriter, TableData, write_checkpoint
from recserve.model_spec import DefaultSpec, EmbeddingBinding
from recserve.model_store.checkpoint import Checkpoint, load_checkpoint
from recserve.model_store.manifest import read_manifest
from recserve.model_store.storage import LocalStorage
from recserve.model_store.versions import VersionRef

DEFAULT = DefaultSpec("normal", 0.5, 3)
BINDINGS = [EmbeddingBinding("user_id", "user", 4, "user_emb", default=DEFAULT)]
KEYS = np.arange(1, 101, dtype=np.int64)


def checkpoint(root: Path, step: int) -> Checkpoint:
    values = np.full((100, 4), step, np.float32)
    path = write_checkpoint(root, {"user": TableData(KEYS, values)}, global_step=step)
    storage = LocalStorage()
    return load_checkpoint(storage, VersionRef(path.name, str(path), step), read_manifest(storage, str(path)))


def config(server: Any) -> ProcessorConfig:
    return ProcessorConfig(savedmodel_dir="/unused", feature_store_type="redis", redis_url=server.url)


def eventually(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        time.sleep(0.01)


def test_updates_reach_every_replica(redis_server: Any, tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path, 1)
    replicas = [open_redis_tables(BINDINGS, ckpt, config(redis_server), "m") for _ in range(2)]
    writer = RowUpdateWriter(redis_server.url, "m")
    try:
        plans = [r.lookup_plan([("user", "none")]) for r in replicas]
        for plan in plans:
            plan.run([KEYS[:4]])  # cached everywhere
        new_rows = np.array([[7, 7, 7, 7], [8, 8, 8, 8]], np.float32)
        writer.write("user", KEYS[:2], new_rows, deleted=KEYS[2:3])
        writer.write("user", np.array([5000]), np.full((1, 4), 9, np.float32))  # a new key
        want = np.concatenate([new_rows, default_vectors(DEFAULT, KEYS[2:3], 4), np.ones((1, 4), np.float32),
                               np.full((1, 4), 9, np.float32)])
        ids = np.array([1, 2, 3, 4, 5000])
        for plan in plans:
            eventually(lambda plan=plan: np.array_equal(plan.run([ids])[0], want), "the update is visible")
        # Key 5000 was never cached, so it reads Redis and can show the second update before
        # a follower applies it: wait for the followers too.
        eventually(lambda: all(r.follower.applied == 2 for r in replicas), "both followers applied both entries")
    finally:
        writer.close()
        for r in replicas:
            r.close()


def test_updates_go_to_the_newest_version_only(redis_server: Any, tmp_path: Path) -> None:
    old = open_redis_tables(BINDINGS, checkpoint(tmp_path, 1), config(redis_server), "m")
    new = open_redis_tables(BINDINGS, checkpoint(tmp_path, 2), config(redis_server), "m")
    try:
        with RowUpdateWriter(redis_server.url, "m") as writer:
            assert writer.newest_version() == "2"
            writer.write("user", KEYS[:1], np.full((1, 4), 5, np.float32))
        eventually(lambda: new.lookup_plan([("user", "none")]).run([KEYS[:1]])[0][0, 0] == 5, "update on v2")
        assert old.lookup_plan([("user", "none")]).run([KEYS[:1]])[0][0, 0] == 1  # v1 untouched
        assert old.follower.applied == 0
    finally:
        old.close()
        new.close()


def test_writer_refuses_what_does_not_fit(redis_server: Any, tmp_path: Path) -> None:
    with RowUpdateWriter(redis_server.url, "m") as writer:
        with pytest.raises(ModelNotReadyError, match="no version of model 'm' has been imported into Redis"):
            writer.write("user", KEYS[:1], np.ones((1, 4), np.float32))
        store = open_redis_tables(BINDINGS, checkpoint(tmp_path, 1), config(redis_server), "m")
        try:
            with pytest.raises(CorruptVersionError, match=r"version '1' of model 'm' has no table 'item'; it has \['user'\]"):
                writer.write("item", KEYS[:1], np.ones((1, 4), np.float32))
            with pytest.raises(CorruptVersionError, match=r"values for table 'user' must be floats of shape \[1, 4\]"):
                writer.write("user", KEYS[:1], np.ones((1, 3), np.float32))
            with pytest.raises(CorruptVersionError, match="key -1 is reserved for padding"):
                writer.write("user", np.array([-1]), np.ones((1, 4), np.float32))
        finally:
            store.close()


def test_a_delta_is_written_once_and_never_over_newer_stream_rows(redis_server: Any, tmp_path: Path) -> None:
    """The first replica to apply a delta writes it to Redis; a replica applying it later (it
    lagged, or started later) writes nothing and drops the keys from its cache, so a stream
    update made in between is what both serve."""
    from recserve.model_store.updater import apply_delta

    ckpt = checkpoint(tmp_path, 1)
    first, late = (open_redis_tables(BINDINGS, ckpt, config(redis_server), "m") for _ in range(2))
    writer = RowUpdateWriter(redis_server.url, "m")
    client = redis_server.client()

    def msets() -> int:
        return int(client.info("commandstats").get("cmdstat_mset", {}).get("calls", 0))

    try:
        plans = [r.lookup_plan([("user", "none")]) for r in (first, late)]
        ids = KEYS[:4]
        plans[1].run([ids])  # the late replica caches the version's rows
        delta = Checkpoint(
            VersionRef("2", "unused", 2), ckpt.manifest,
            {"user": TableData(KEYS[:2], np.full((2, 4), 20, np.float32), deleted=KEYS[2:3])}, {},
        )
        before = msets()
        assert first.apply_delta(delta, apply_delta) == 3
        assert msets() - before == 1  # one chunk, one replica
        writer.write("user", KEYS[:1], np.full((1, 4), 30, np.float32))  # newer than the delta
        before = msets()
        assert late.apply_delta(delta, apply_delta) == 3
        assert msets() == before
        want = np.concatenate([np.full((1, 4), 30, np.float32), np.full((1, 4), 20, np.float32),
                               default_vectors(DEFAULT, KEYS[2:3], 4), np.ones((1, 4), np.float32)])
        for plan in plans:
            eventually(lambda plan=plan: np.array_equal(plan.run([ids])[0], want), "the stream row is served")
    finally:
        writer.close()
        for r in (first, late):
            r.close()
