"""The Redis store's config fields, each by what it changes against a real redis-server:
redis_password (a server started with --requirepass), redis_stream_updates=false,
redis_version_grace_seconds, update_thread_num."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recserve import Processor
from recserve.config import ProcessorConfig
from recserve.embedding import redis_import
from recserve.embedding.redis_keys import KeySpace
from recserve.embedding.redis_store import open_redis_tables
from recserve.errors import ConfigError
from recserve.export import RowUpdateWriter, TableData, write_checkpoint
from recserve.export.demo import write_demo
from recserve.export.reference import Reference
from recserve.model_spec import EmbeddingBinding
from recserve.model_store.checkpoint import Checkpoint, load_checkpoint
from recserve.model_store.manifest import read_manifest
from recserve.model_store.storage import LocalStorage
from recserve.model_store.versions import VersionRef
from tests.conftest import REDIS_PASSWORD
from tests.reference_answers import assert_answers_like_reference

MODEL = "m"
KEYS = np.arange(1, 101, dtype=np.int64)
BINDINGS = [EmbeddingBinding("user_id", "user", 4, "user_emb")]


def checkpoint(root: Path, step: int, tables: dict[str, TableData] | None = None) -> Checkpoint:
    tables = tables or {"user": TableData(KEYS, np.full((len(KEYS), 4), step, np.float32))}
    path = write_checkpoint(root, tables, global_step=step)
    storage = LocalStorage()
    return load_checkpoint(storage, VersionRef(path.name, str(path), step), read_manifest(storage, str(path)))


def config(server: Any, **fields: Any) -> ProcessorConfig:
    return ProcessorConfig(savedmodel_dir="/unused", feature_store_type="redis", redis_url=server.url, **fields)


def eventually(check: Any, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.01)


# -- redis_password --------------------------------------------------------------------------


def _demo_config(tmp_path: Path, server: Any, **fields: Any) -> tuple[Any, dict[str, Any]]:
    demo = write_demo(tmp_path / "demo")
    config = json.loads(demo.config_path.read_text())
    config.update(feature_store_type="redis", redis_url=f"127.0.0.1:{server.port}", redis_timeout_seconds=0.5,
                  **fields)
    return demo, config


def test_the_right_password_serves_like_the_reference(redis_server_with_password: Any, tmp_path: Path) -> None:
    demo, config = _demo_config(tmp_path, redis_server_with_password, redis_password=REDIS_PASSWORD)
    processor = Processor(config)
    try:
        inputs = demo.sample_inputs(16, np.random.default_rng(0))
        assert_answers_like_reference([processor], Reference(demo.model_dir, demo.checkpoint_dir), inputs)
    finally:
        processor.close()
    assert redis_server_with_password.client().exists(KeySpace("default").ready("1"))


@pytest.mark.parametrize("password", ["wrong-password-91", None])
def test_a_wrong_or_missing_password_fails_the_load_at_once_without_the_secret(
    redis_server_with_password: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, password: str | None
) -> None:
    fields = {} if password is None else {"redis_password": password}
    # Bounded: a refusal retried like an outage would fail after a minute, not hang the test.
    _, config = _demo_config(tmp_path, redis_server_with_password, init_timeout_minutes=1, **fields)
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError) as caught:
        Processor(config)
    assert time.monotonic() - started < 30  # at once, not after init_timeout_minutes
    message = caught.value.message
    assert message.startswith(f"Redis at redis://127.0.0.1:{redis_server_with_password.port} refused the "
                              "credentials (AuthenticationError: "), message
    assert message.endswith("; check redis_password") and caught.value.field == "redis_password", message
    for secret in (REDIS_PASSWORD, "wrong-password-91"):
        assert secret not in message and secret not in repr(caught.value) and secret not in caplog.text


# -- redis_stream_updates ----------------------------------------------------------------------


def test_stream_updates_off_leaves_cached_rows_until_the_next_version(redis_server: Any, tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path, 1)
    following = open_redis_tables(BINDINGS, ckpt, config(redis_server), MODEL)
    still = open_redis_tables(BINDINGS, ckpt, config(redis_server, redis_stream_updates=False), MODEL)
    writer = RowUpdateWriter(redis_server.url, MODEL)
    try:
        plans = [s.lookup_plan([("user", "none")]) for s in (following, still)]
        for plan in plans:
            plan.run([KEYS[:4]])  # cached in both
        for value in (7.0, 8.0):  # the second update lands after the first was followed
            writer.write("user", KEYS[:2], np.full((2, 4), value, np.float32))
            eventually(lambda v=value: (plans[0].run([KEYS[:2]])[0] == v).all(), f"the follower sees {value}")
        np.testing.assert_array_equal(plans[1].run([KEYS[:2]])[0], np.full((2, 4), 1.0, np.float32))
        # Uncached keys are read from Redis, where the writer put the rows.
        writer.write("user", KEYS[50:51], np.full((1, 4), 9.0, np.float32))
        np.testing.assert_array_equal(plans[1].run([KEYS[50:51]])[0], np.full((1, 4), 9.0, np.float32))
    finally:
        writer.close()
        following.close()
        still.close()


# -- redis_version_grace_seconds -------------------------------------------------------------


def test_a_retired_version_expires_after_the_configured_grace(redis_server: Any, tmp_path: Path) -> None:
    grace = 37.0
    sets = [open_redis_tables(BINDINGS, checkpoint(tmp_path, step), config(redis_server, redis_version_grace_seconds=grace),
                              MODEL) for step in (1, 2, 3)]
    try:
        client, space = redis_server.client(), KeySpace(MODEL)
        # Version 1 is beyond the newest two: its keys expire `grace` after version 3's import
        # (at least 30 s of it left on a slow machine; the default would leave up to 600 s).
        assert 30_000 < client.pttl(space.ready("1")) <= grace * 1000
        row_key = next(client.scan_iter(match=space.version_pattern("1"), count=1000))
        assert 30_000 < client.pttl(row_key) <= grace * 1000
        assert client.pttl(space.ready("2")) == -1 and client.pttl(space.ready("3")) == -1
    finally:
        for s in sets:
            s.close()


# -- update_thread_num --------------------------------------------------------------------------


@pytest.mark.parametrize("writers", [1, 3])
def test_update_thread_num_threads_write_a_version_together(
    redis_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: int
) -> None:
    """Three tables make three write jobs: with `writers` threads, that many write at once
    (each waits for the others at its first write; too few threads would time out)."""
    together = threading.Barrier(writers, timeout=30)
    names: set[str] = set()
    original = redis_import.write_rows

    def write_rows(*args: Any, **kwargs: Any) -> Any:
        name = threading.current_thread().name
        if name not in names:
            names.add(name)
            together.wait()
        return original(*args, **kwargs)

    monkeypatch.setattr(redis_import, "write_rows", write_rows)
    tables = {t: TableData(KEYS, np.full((len(KEYS), 4), 1.0, np.float32)) for t in ("a", "b", "c")}
    bindings = [EmbeddingBinding(f"{t}_id", t, 4, f"{t}_emb") for t in tables]
    store = open_redis_tables(bindings, checkpoint(tmp_path, 1, tables), config(redis_server, update_thread_num=writers),
                              MODEL)
    try:
        assert store.imported and len(names) == writers, names
        assert all(n.startswith("redis-import") for n in names), names
    finally:
        store.close()
