"""ModelUpdater and VersionWatcher with real files, real servables (onnxruntime) and a fake
clock: polls are driven one by one, backoffs are read off the clock, nothing sleeps."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest

from recserve.config import parse_config
from recserve.errors import CorruptVersionError, ModelLoadError, StorageError, VersionNotReadyError
from recserve.export import write_delta
from recserve.model_store import LocalStorage, load_model_dir
from recserve.model_store.backoff import Backoff, Retry, Stopped
from recserve.model_store.updater import ModelUpdater
from recserve.model_store.watcher import VersionWatcher
from recserve.processor.manager import ServableManager
from recserve.processor.servable import Servable
from recserve.warmup import Warmup


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return True


class Harness:
    def __init__(self, tiny, storage=None, *, warmup=None, pinned=None, checkpoint_dir=None, **config):  # type: ignore[no-untyped-def]
        self.tiny = tiny
        self.clock = FakeClock()
        self.config = parse_config(tiny.config(**config))
        self.manager: ServableManager[Servable] = ServableManager("m")
        model = load_model_dir(LocalStorage(), str(tiny.model_dir))
        self.built: list[Servable] = []

        def build(checkpoint):  # type: ignore[no-untyped-def]
            servable = Servable.load(model, checkpoint, self.config)
            self.built.append(servable)
            return servable

        self.watcher = VersionWatcher(storage or LocalStorage(), checkpoint_dir or str(tiny.checkpoint_dir),
                                      backoff=Backoff(base=1.0, cap=8.0), clock=self.clock)
        self.updater = ModelUpdater(self.watcher, self.manager, build, interval=0.5,
                                    warmup=warmup if warmup is not None else Warmup().run,
                                    pinned=pinned, backoff=Backoff(base=1.0, cap=8.0), wait=self.clock.wait,
                                    clock=self.clock, model_name="m")

    def score(self, keys: np.ndarray) -> np.ndarray:
        with self.manager.acquire() as servable:
            return servable.predict({"item_id": keys})["score"]

    def serves(self, tag: float, w: float, keys: np.ndarray | None = None) -> bool:
        keys = self.tiny.keys if keys is None else keys
        return bool(np.array_equal(self.score(keys), self.tiny.expected(keys, tag, w)))


def test_a_poll_serves_the_newest_complete_version_with_its_deltas(tiny):
    tiny.write_full(1, tag=10, w=1)
    v2 = tiny.write_full(2, tag=20, w=2)
    tiny.write_delta(v2, 3, tag=30)
    tiny.write_delta(v2, 4, tag=40, keys=tiny.keys[:8])
    h = Harness(tiny)
    assert h.updater.poll_once() is True
    assert h.serves(40, 2, tiny.keys[:8]) and h.serves(30, 2, tiny.keys[8:])
    status = h.updater.status()
    assert (status["version"], status["global_step"], status["delta_step"], status["full_updates"]) == ("2", 2, 4, 1)
    assert status["delta_updates"] == 2 and status["last_error"] is None
    assert h.updater.poll_once() is False
    # A new delta is applied in place, to the same servable.
    tiny.write_delta(v2, 5, tag=50, deleted=tiny.keys[-2:], keys=tiny.keys[:-2])
    assert h.updater.poll_once() is True
    assert len(h.built) == 1
    assert h.serves(50, 2, tiny.keys[:-2])
    np.testing.assert_array_equal(h.score(tiny.keys[-2:]), np.zeros((2, 4), np.float32))  # deleted: default zeros
    assert h.updater.status()["delta_step"] == 5


def test_a_newer_full_version_swaps_in_while_a_request_holds_the_old_one(tiny):
    tiny.write_full(1, tag=10, w=1)
    h = Harness(tiny)
    h.updater.poll_once()
    with h.manager.acquire() as old:
        v2 = tiny.write_full(2, tag=20, w=3)
        tiny.write_delta(v2, 3, tag=30)
        assert h.updater.poll_once() is True
        # The leased servable still answers with its own version...
        np.testing.assert_array_equal(old.predict({"item_id": tiny.keys})["score"], tiny.expected(tiny.keys, 10, 1))
        # ...while new requests get the new version, deltas applied before it served.
        assert h.serves(30, 3)
    assert h.updater.status()["delta_step"] == 3


def test_incomplete_and_corrupt_versions_are_skipped_counted_and_retried_after_backoff(tiny):
    tiny.write_full(1, tag=10, w=1)
    h = Harness(tiny)
    h.updater.poll_once()
    v2 = tiny.write_full(2, tag=20, w=2)
    table = v2 / "embedding" / "item.safetensors"
    good = table.read_bytes()
    table.write_bytes(good[:-10])  # half-written
    assert h.updater.poll_once() is False
    assert h.serves(10, 1)
    assert h.watcher.counts.not_ready == 1
    assert "item.safetensors has" in h.watcher.last_error and "(still being written)" in h.watcher.last_error
    table.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # now complete but corrupt
    h.updater.poll_once()
    assert h.watcher.counts.corrupt == 0  # still inside the 1 s backoff: not looked at
    h.clock.now += 1.0
    h.updater.poll_once()
    assert h.watcher.counts.corrupt == 1
    assert h.watcher.last_error.startswith("corrupt: ") and "sha256 is" in h.watcher.last_error
    h.clock.now += 3.9  # the second failure backs off 2 s, the third 4 s
    h.updater.poll_once()
    assert h.watcher.counts.corrupt == 2
    h.clock.now += 3.9
    h.updater.poll_once()
    assert h.watcher.counts.corrupt == 2
    assert h.serves(10, 1)
    table.write_bytes(good)
    h.clock.now += 0.2
    assert h.updater.poll_once() is True
    assert h.serves(20, 2)


def test_deltas_stop_at_a_delta_that_does_not_fit_the_serving_version(tiny):
    v1 = tiny.write_full(1, tag=10, w=1)
    h = Harness(tiny)
    h.updater.poll_once()
    # A delta written for a model whose table has another dim: a different base.
    write_delta(v1, {"item": (tiny.keys[:2], np.ones((2, 8), np.float32))}, global_step=2)
    tiny.write_delta(v1, 3, tag=30)
    assert h.updater.poll_once() is False
    assert h.serves(10, 1)
    assert h.watcher.counts.wrong_base == 1
    assert h.watcher.last_error.endswith("table 'item' has dim 8; version 1 serves dim 4")
    shutil.rmtree(v1 / ".incremental_ckpt" / "2")
    h.clock.now += 1
    assert h.updater.poll_once() is True
    assert h.serves(30, 1)
    # Only tables the model does not have: also a different base; later deltas wait.
    write_delta(v1, {"other": (tiny.keys[:2], np.ones((2, 4), np.float32))}, global_step=4)
    tiny.write_delta(v1, 5, tag=50)
    assert h.updater.poll_once() is False
    assert h.watcher.counts.wrong_base == 2
    assert "updates tables ['other']; version 1 serves tables ['item']" in h.watcher.last_error
    assert h.serves(30, 1) and h.updater.status()["delta_step"] == 3
    shutil.rmtree(v1 / ".incremental_ckpt" / "4")
    assert h.updater.poll_once() is True
    assert h.serves(50, 1)


def test_a_delta_recording_another_base_is_refused(tiny):
    """recserve.export records the full version's global_step in each delta's manifest; a
    delta whose full version was rewritten in place (same name, another step) never applies."""
    v1 = tiny.write_full(1, tag=10, w=1)
    delta = tiny.write_delta(v1, 2, tag=20)
    manifest = json.loads((delta / "MANIFEST.json").read_text())
    assert manifest["base_global_step"] == 1
    (delta / "MANIFEST.json").write_text(json.dumps({**manifest, "base_global_step": 0}))
    h = Harness(tiny)
    h.updater.poll_once()
    assert h.serves(10, 1) and h.watcher.counts.wrong_base == 1
    assert h.watcher.last_error.endswith(
        "was written on a full version at global_step 0, but version 1 has global_step 1"
    )


def test_a_version_that_fails_warmup_never_serves(tiny):
    tiny.write_full(1, tag=10, w=1)
    calls = []

    def warmup(servable):  # type: ignore[no-untyped-def]
        calls.append(servable.version)
        if servable.version == "2":
            raise ModelLoadError("warmup request 0 failed on version 2: boom")

    h = Harness(tiny, warmup=warmup)
    h.updater.poll_once()
    tiny.write_full(2, tag=20, w=2)
    assert h.updater.poll_once() is False
    assert h.serves(10, 1)
    assert calls == ["1", "2"]
    assert h.watcher.counts.load == 1 and h.watcher.last_error == "load: warmup request 0 failed on version 2: boom"
    assert h.built[1].sessions.session_count == 0  # the rejected servable was closed


def test_pinning_rolls_back_keeps_applying_the_pinned_versions_deltas_and_unpins(tiny):
    v1 = tiny.write_full(1, tag=10, w=1)
    tiny.write_full(2, tag=20, w=2)
    h = Harness(tiny)
    h.updater.poll_once()
    assert h.serves(20, 2)
    status = h.updater.load_version("1")
    assert (status["version"], status["pinned_version"]) == ("1", "1")
    assert h.serves(10, 1)
    tiny.write_full(3, tag=30, w=3)
    tiny.write_delta(v1, 4, tag=40)
    assert h.updater.poll_once() is True
    assert h.serves(40, 1)
    with pytest.raises(VersionNotReadyError, match=r"^version 'nope' is not in .*; versions there: \['1', '2', '3'\]$"):
        h.updater.load_version("nope")
    assert h.updater.status()["pinned_version"] == "1"
    status = h.updater.load_version(None)
    assert (status["version"], status["pinned_version"], status["delta_step"]) == ("3", None, 0)
    assert h.serves(30, 3)


def test_pinned_version_from_the_config_and_a_corrupt_rollback_target(tiny):
    tiny.write_full(1, tag=10, w=1)
    v2 = tiny.write_full(2, tag=20, w=2)
    h = Harness(tiny, pinned="1")
    h.updater.poll_once()
    assert h.serves(10, 1)
    (v2 / "dense.safetensors").write_bytes(b"x" * (v2 / "dense.safetensors").stat().st_size)
    with pytest.raises(CorruptVersionError, match=r"dense.safetensors: sha256 is [0-9a-f]{64}; MANIFEST.json lists"):
        h.updater.load_version("2")
    assert h.serves(10, 1) and h.updater.status()["pinned_version"] == "1"


def test_load_initial_waits_for_a_first_version_or_fails_after_the_timeout(tiny):
    h = Harness(tiny)
    with pytest.raises(ModelLoadError) as info:
        h.updater.load_initial(timeout=2.0)
    assert info.value.message == (
        f"model 'm': no complete version appeared in {tiny.checkpoint_dir} within 2 s; "
        "last problem: it holds no version with a MANIFEST.json"
    )
    assert h.clock.waits == [0.5, 0.5, 0.5, 0.5]
    v1 = tiny.write_full(1, tag=10, w=1)
    (v1 / "dense.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"last problem: not_ready: .*dense.safetensors has 0 of \d+ bytes"):
        h.updater.load_initial(timeout=1.0)
    tiny.write_full(2, tag=20, w=2)
    h.updater.load_initial(timeout=None)
    assert h.serves(20, 2)


def test_a_storage_outage_fails_the_poll_and_the_version_keeps_serving(tiny, webhdfs, monkeypatch):
    monkeypatch.setenv("RECSERVE_HDFS_DRIVER", "webhdfs")
    from recserve.model_store.hdfs import WebHdfsStorage
    tiny.write_full(1, tag=10, w=1, root=webhdfs.root / "ckpt")
    h = Harness(tiny, WebHdfsStorage(timeout=2), checkpoint_dir=f"{webhdfs.url}/ckpt")
    h.updater.poll_once()
    assert h.serves(10, 1)
    webhdfs.stop()
    with pytest.raises(StorageError, match=r"namenode unreachable"):
        h.updater.poll_once()
    assert h.serves(10, 1)
    assert h.watcher.counts.storage == 1 and h.watcher.last_error.startswith("storage: cannot ")
    tiny.write_full(2, tag=20, w=2, root=webhdfs.root / "ckpt")
    webhdfs.start()
    assert h.updater.poll_once() is True
    assert h.serves(20, 2)


def test_the_thread_retries_failed_polls_with_backoff_and_stops(tiny):
    tiny.write_full(1, tag=10, w=1)
    h = Harness(tiny)
    h.updater.poll_once()
    failures = iter([StorageError("cannot list x: down")] * 3)
    real_poll = h.updater.poll_once
    polled = threading.Event()
    waits: list[float] = []

    def flaky_poll() -> bool:
        for exc in failures:
            raise exc
        polled.set()
        return real_poll()

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return not polled.is_set()  # stop after the first good poll

    h.updater.poll_once = flaky_poll  # type: ignore[method-assign]
    h.updater._retry.wait = wait
    h.updater.start()
    h.updater.stop(timeout=30)
    assert waits == [1.0, 2.0, 4.0, 0.5]


def test_backoff_and_retry():
    b = Backoff(base=0.5, cap=3.0)
    assert [b.compute(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert Backoff(base=1, cap=60).compute(10**6) == 60
    with pytest.raises(ValueError):
        Backoff(base=2, cap=1)
    waits: list[float] = []
    errors: list[tuple[str, int]] = []
    outcomes = iter([StorageError("a"), CorruptVersionError("b"), "done"])

    def do() -> str:
        item = next(outcomes)
        if isinstance(item, Exception):
            raise item
        return item

    retry = Retry(b, lambda s: waits.append(s) or True)
    assert retry.call(do, lambda exc, n: errors.append((str(exc), n))) == "done"
    assert waits == [0.5, 1.0] and errors == [("a", 1), ("b", 2)]
    with pytest.raises(Stopped):
        Retry(b, lambda s: False).call(lambda: (_ for _ in ()).throw(StorageError("x")), lambda e, n: None)
    with pytest.raises(KeyError):  # not a RecserveError: a bug, never retried
        Retry(b, lambda s: True).call(lambda: {}["k"], lambda e, n: None)
