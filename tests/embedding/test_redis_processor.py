"""Processors with feature_store_type redis, end to end on the demo model: two replicas share
one Redis and one import, answer like the numpy + onnxruntime reference, switch versions, and
survive Redis being killed and restarted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recserve import Processor
from recserve.embedding.redis_keys import KeySpace
from recserve.errors import StorageError
from recserve.export import write_checkpoint
from recserve.export.demo import DemoModel, demo_tables, write_demo
from recserve.export.reference import Reference
from recserve.wire.codec import encode_request
from tests.reference_answers import ATOL, assert_answers_like_reference


@pytest.fixture
def demo(tmp_path: Path) -> DemoModel:
    return write_demo(tmp_path / "demo")


def redis_config(demo: DemoModel, server: Any) -> dict[str, Any]:
    config = json.loads(demo.config_path.read_text())
    config.update(feature_store_type="redis", redis_url=f"127.0.0.1:{server.port}", redis_timeout_seconds=0.5,
                  model_update_interval_seconds=0.2)
    return config


@pytest.fixture
def replicas(demo: DemoModel, redis_server: Any) -> Iterator[list[Processor]]:
    ps = [Processor(redis_config(demo, redis_server)) for _ in range(2)]
    yield ps
    for p in ps:
        p.close()


def eventually(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        time.sleep(0.05)


def test_replicas_answer_like_the_reference(demo: DemoModel, replicas: list[Processor], redis_server: Any) -> None:
    reference = Reference(demo.model_dir, demo.checkpoint_dir)
    assert_answers_like_reference(replicas, reference, demo.sample_inputs(64, np.random.default_rng(0)))
    space = KeySpace("default")
    client = redis_server.client()
    assert client.exists(space.ready("1")) and client.get(space.lock("1")) is None


def test_only_the_importer_reads_table_files(
    demo: DemoModel, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that finds the version in Redis never loads the checkpoint's rows: the point
    of a shared store is that replicas do not each hold the tables."""
    from recserve.model_store import checkpoint

    reads: list[str] = []
    original = checkpoint.read_table

    def counting(storage: Any, path: str, **options: Any) -> Any:
        reads.append(path)
        return original(storage, path, **options)

    monkeypatch.setattr(checkpoint, "read_table", counting)
    importer = Processor(redis_config(demo, redis_server))
    try:
        assert len(reads) == len(demo_tables())
        reads.clear()
        follower = Processor(redis_config(demo, redis_server))
        try:
            assert reads == []
            inputs = demo.sample_inputs(16, np.random.default_rng(2))
            reference = Reference(demo.model_dir, demo.checkpoint_dir)
            assert_answers_like_reference([importer, follower], reference, inputs)
        finally:
            follower.close()
    finally:
        importer.close()


def test_a_delta_reaches_both_replicas_and_redis_once(
    demo: DemoModel, replicas: list[Processor], redis_server: Any
) -> None:
    """Through the Processors' updaters: both replicas serve the delta, like the reference
    of the same checkpoint with the delta, and only one of them wrote it to Redis."""
    from recserve.export import write_delta

    client = redis_server.client()

    def msets() -> int:
        return int(client.info("commandstats").get("cmdstat_mset", {}).get("calls", 0))

    tables = demo_tables()
    name = max(tables, key=lambda t: len(tables[t].keys))
    keys = tables[name].keys  # every row of the table: any known key in a request sees it
    inputs = demo.sample_inputs(64, np.random.default_rng(5))
    old = replicas[0].predict(inputs)["probabilities"]
    before = msets()
    write_delta(demo.version_dir, {name: (keys, np.full((len(keys), tables[name].dim), 0.5, np.float32))},
                global_step=2)
    eventually(lambda: all(p.model_info()["delta_step"] == 2 for p in replicas), "both replicas applied the delta")
    assert msets() - before == -(-len(keys) // 2048)  # its chunks of 2,048 rows, written by one replica
    assert client.exists(KeySpace("default").delta("1", 2))
    # Like the reference of the version with its delta: its rows changed the answers.
    want = assert_answers_like_reference(replicas, Reference(demo.model_dir, demo.version_dir), inputs)
    assert not np.allclose(want["probabilities"], old, atol=ATOL, rtol=0)


def test_new_version_switches_without_mixed_responses(demo: DemoModel, replicas: list[Processor]) -> None:
    tables = demo_tables()
    scaled = {name: (data.keys, data.values * 2) for name, data in tables.items()}
    inputs = demo.sample_inputs(32, np.random.default_rng(1))
    before = replicas[0].predict(inputs)["probabilities"]
    write_checkpoint(demo.checkpoint_dir, scaled, global_step=2)
    eventually(lambda: all(p.model_info()["version"] == "2" for p in replicas), "both replicas serve v2")
    after = assert_answers_like_reference(replicas, Reference(demo.model_dir, demo.checkpoint_dir), inputs)
    assert not np.allclose(before, after["probabilities"], atol=ATOL, rtol=0)


def test_redis_killed_and_restarted(demo: DemoModel, replicas: list[Processor], redis_server: Any) -> None:
    inputs = demo.sample_inputs(16, np.random.default_rng(2))
    reference = Reference(demo.model_dir, demo.checkpoint_dir)
    assert_answers_like_reference(replicas, reference, inputs)
    redis_server.kill()
    fresh = demo.sample_inputs(16, np.random.default_rng(3))  # ids not cached yet
    with pytest.raises(StorageError, match=f"Redis at redis://127.0.0.1:{redis_server.port} is unreachable"):
        replicas[0].predict(fresh)
    # The C ABI path reports, never raises: a valid request needing uncached rows is a 503
    # naming the unreachable Redis.
    other = demo.sample_inputs(16, np.random.default_rng(4))
    status, message = replicas[1].process(encode_request(other))
    assert status == 503, message
    assert f"Redis at redis://127.0.0.1:{redis_server.port} is unreachable" in message.decode(), message
    redis_server.start()
    # Each replica's follower finds the rows gone on its own schedule (its reconnect
    # backoff), so each recovers on its own; one serving says nothing of the other.
    eventually(lambda: all(_works(p, fresh) for p in replicas), "both replicas serving after Redis restarted")
    assert_answers_like_reference(replicas, reference, inputs)
    assert_answers_like_reference(replicas, reference, fresh)


def _works(p: Processor, inputs: dict[str, np.ndarray]) -> bool:
    try:
        p.predict(inputs)
        return True
    except StorageError:
        return False


def _small_cache_replicas(demo: DemoModel, redis_server: Any) -> list[Processor]:
    """Replicas caching one row per table: their answers come from what Redis holds."""
    return [Processor({**redis_config(demo, redis_server), "redis_cache_rows": 1}) for _ in range(2)]


def test_redis_restarted_empty_gets_the_version_back_with_its_deltas(demo: DemoModel, redis_server: Any) -> None:
    """Redis loses everything; the version is imported again as its answers name it: with the
    deltas applied since (imported without them, it answered its base rows as delta 2's)."""
    from recserve.export import write_delta

    replicas = _small_cache_replicas(demo, redis_server)
    try:
        tables = demo_tables()
        user = tables["user"]
        write_delta(demo.version_dir, {"user": (user.keys[:1000], np.full((1000, user.dim), 0.25, np.float32))},
                    global_step=2)
        write_delta(demo.version_dir, {"user": (user.keys[500:1500], np.full((1000, user.dim), -0.5, np.float32))},
                    global_step=3)
        eventually(lambda: all(p.model_info()["delta_step"] == 3 for p in replicas), "every processor at delta 3")
        reference = Reference(demo.model_dir, demo.version_dir)  # the version with both deltas
        inputs = demo.sample_inputs(64, np.random.default_rng(8))
        assert_answers_like_reference(replicas, reference, inputs)
        redis_server.kill()
        redis_server.start()
        fresh = demo.sample_inputs(64, np.random.default_rng(18))  # rows not in any cache
        eventually(lambda: all(_works(p, fresh) for p in replicas), "both replicas serving after Redis came back empty")
        assert all(p.model_info()["delta_step"] == 3 for p in replicas)
        assert_answers_like_reference(replicas, reference, fresh)
        # The re-import marked its deltas written: a replica applying one later only re-reads.
        assert redis_server.client().exists(KeySpace("default").delta("1", 3))
    finally:
        for p in replicas:
            p.close()


def _reimport_after(replica: Processor, never: str) -> threading.Event:
    """Holds `replica`'s Redis follower back from re-importing a lost version until the
    returned event is set (another replica then imports first); `never`: the failure if it
    is not set within 30 s."""
    follower = replica._manager.current.redis.follower  # type: ignore[union-attr]
    other_imported = threading.Event()
    own_reimport = follower._reimport

    def after_the_other() -> None:
        assert other_imported.wait(30), never
        own_reimport()

    follower._reimport = after_the_other  # type: ignore[method-assign]
    return other_imported


def test_a_replica_ahead_of_the_importer_writes_its_deltas_again(demo: DemoModel, redis_server: Any) -> None:
    """Redis comes back empty and the replica that imports the version again is a delta
    behind another (its updater polls less often): the other writes its newer delta again
    before it serves, so it never answers the importer's older rows under its own step."""
    from recserve.export import write_delta

    tables = demo_tables()
    user = tables["user"]
    write_delta(demo.version_dir, {"user": (user.keys[:1000], np.full((1000, user.dim), 0.25, np.float32))},
                global_step=2)
    lagging = Processor({**redis_config(demo, redis_server), "redis_cache_rows": 1,
                         "model_update_interval_seconds": 3600})
    ahead = Processor({**redis_config(demo, redis_server), "redis_cache_rows": 1})
    try:
        inputs = demo.sample_inputs(64, np.random.default_rng(28))
        at_two = Reference(demo.model_dir, demo.version_dir).predict(inputs)["probabilities"]
        write_delta(demo.version_dir, {"user": (user.keys, np.full((len(user.keys), user.dim), -0.5, np.float32))},
                    global_step=3)
        eventually(lambda: ahead.model_info()["delta_step"] == 3, "the second replica at delta 3")
        assert lagging.model_info()["delta_step"] == 2
        at_three = Reference(demo.model_dir, demo.version_dir)
        # The lagging replica imports first: the other's follower waits until it has.
        imported = _reimport_after(ahead, "the lagging replica never imported")
        redis_server.kill()
        redis_server.start()
        eventually(lambda: _works(lagging, inputs), "the lagging replica imported the version again")
        np.testing.assert_allclose(lagging.predict(inputs)["probabilities"], at_two, atol=ATOL, rtol=0)
        imported.set()
        eventually(lambda: _works(ahead, inputs), "the replica ahead serving again")
        assert ahead.model_info()["delta_step"] == 3
        want = assert_answers_like_reference([ahead], at_three, inputs)
        assert not np.allclose(want["probabilities"], at_two, atol=ATOL, rtol=0)  # delta 3 changed them
    finally:
        lagging.close()
        ahead.close()


def test_a_replica_level_with_the_importer_writes_no_delta_again(demo: DemoModel, redis_server: Any) -> None:
    """Redis comes back empty; one replica re-imports the version with both its deltas while
    the other, level with it, finds the import done before the importer has marked delta 2
    written (its marker is deleted here to hold that moment): it must not write
    delta 2 again over rows delta 3 changed after it (the import's ready key lists them)."""
    from recserve.export import write_delta

    tables = demo_tables()
    user = tables["user"]
    write_delta(demo.version_dir, {"user": (user.keys[:1000], np.full((1000, user.dim), 0.25, np.float32))},
                global_step=2)
    write_delta(demo.version_dir, {"user": (user.keys, np.full((len(user.keys), user.dim), -0.5, np.float32))},
                global_step=3)
    replicas = _small_cache_replicas(demo, redis_server)
    importer, other = replicas
    try:
        eventually(lambda: all(p.model_info()["delta_step"] == 3 for p in replicas), "every processor at delta 3")
        inputs = demo.sample_inputs(64, np.random.default_rng(38))
        reference = Reference(demo.model_dir, demo.version_dir)
        imported = _reimport_after(other, "the importer never imported")
        redis_server.kill()
        redis_server.start()
        eventually(lambda: _works(importer, inputs), "the importer imported the version again")
        # The moment the importer has marked delta 3 written but not yet delta 2.
        assert redis_server.client().delete(KeySpace("default").delta("1", 2)) == 1
        imported.set()
        eventually(lambda: _works(other, inputs), "the other replica serving again")
        assert_answers_like_reference(replicas, reference, inputs)
    finally:
        for p in replicas:
            p.close()


def test_a_lost_version_whose_files_are_gone_gives_way_to_the_newest_readable(
    demo: DemoModel, redis_server: Any, tmp_path: Path
) -> None:
    """Redis lost version 2's rows and version 2's files were deleted: nothing can bring it
    back, so the replicas serve version 1 (older, complete) instead of failing every miss."""
    import shutil

    replicas = _small_cache_replicas(demo, redis_server)
    try:
        scaled = {name: (t.keys, t.values * 3) for name, t in demo_tables().items()}
        v2 = write_checkpoint(demo.checkpoint_dir, scaled, global_step=2)
        eventually(lambda: all(p.model_info()["version"] == "2" for p in replicas), "both replicas serve v2")
        shutil.rmtree(v2)
        redis_server.kill()
        redis_server.start()
        eventually(lambda: all(p.model_info()["version"] == "1" for p in replicas), "both replicas back on v1")
        inputs = demo.sample_inputs(32, np.random.default_rng(9))  # rows not in any cache
        eventually(lambda: all(_works(p, inputs) for p in replicas), "both replicas answering on v1")
        assert_answers_like_reference(replicas, Reference(demo.model_dir, demo.version_dir), inputs)
    finally:
        for p in replicas:
            p.close()


def test_redis_tables_take_the_python_route_counted(demo: DemoModel, redis_server: Any) -> None:
    """Redis lookups are Python: the version has no native part, and every request says why
    (DESIGN §10, /metrics' recserve_native_route_fallbacks_total{reason="no_servable"})."""
    from recserve.wire.codec import encode_request

    processor = Processor(redis_config(demo, redis_server))
    try:
        data = encode_request(demo.sample_inputs(3, np.random.default_rng(70)))
        answers = [processor.process(data) for _ in range(3)]
        assert answers[0][0] == 200 and answers.count(answers[0]) == 3
        assert answers[0] == processor.process_python(data)
        route = processor.model_info()["native_route"]
        assert route["enabled"] is False and route["served"] == 0
        assert route["fallbacks"]["no_servable"] == 3
    finally:
        processor.close()
