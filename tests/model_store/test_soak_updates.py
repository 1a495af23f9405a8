"""Soak: 8 client threads send requests through `Processor.process` (the C ABI's path) while
3 full versions and 20 deltas land on a local and on an OSS (moto S3 API) checkpoint dir.

Every response must be a 200 that equals exactly one version's expected output — a full
version (tag, w) or one of its deltas (tag) — and each delta must be served within two
polling intervals of its MANIFEST landing, plus 2 s of slack for a loaded machine (the
delays, not a speed goal: a poll that waited for something else would take far longer). Requests carry one id each: the embedding
engine's guarantee is per row (a delta is applied row by row), so a one-row response is
exactly what must never be torn; a full swap is atomic for a whole request.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from recserve import Processor
from recserve.wire.codec import decode_response, encode_request
from tests.threads import Threads

# Polling intervals. moto is a Python server sharing the machine's two cores with eight
# unpaced client threads; under that load each of its requests takes 50-150 ms (~10 ms
# idle) and a new delta costs three (one listing, its MANIFEST, its table file), so a poll
# that finds a delta can take 0.3-0.4 s.
INTERVAL = {"local": 0.2, "oss": 1.0}
CLIENTS = 8
FULLS = 3
DELTAS_PER_VERSION = 5  # on the first version and on each of the 3 new ones: 20 in all
WAIT_LIMIT = 30.0  # a landing not served by then fails the test (it is not a speed goal)


class Publisher:
    """Writes versions where the processor reads them; `land` returns when the MANIFEST is there."""

    def __init__(self, tiny, store: str, moto_s3, bucket: str | None) -> None:  # type: ignore[no-untyped-def]
        self.tiny, self.store, self.moto_s3, self.bucket = tiny, store, moto_s3, bucket
        self.staging = tiny.root / "staging"

    @property
    def checkpoint_dir(self) -> str:
        return str(self.tiny.checkpoint_dir) if self.store == "local" else f"oss://{self.bucket}/ckpt"

    def full(self, step: int, tag: float, w: float) -> Path:
        if self.store == "local":
            return self.tiny.write_full(step, tag, w)  # type: ignore[no-any-return]
        path = self.tiny.write_full(step, tag, w, root=self.staging)
        self.moto_s3.upload(path, self.bucket, f"ckpt/{path.name}")
        return path  # type: ignore[no-any-return]

    def delta(self, version: Path, step: int, tag: float) -> None:
        path = self.tiny.write_delta(version, step, tag)
        if self.store == "oss":
            self.moto_s3.upload(path, self.bucket, f"ckpt/{version.name}/.incremental_ckpt/{path.name}")


@pytest.mark.parametrize("store", ["local", "oss"])
def test_soak_updates_under_load(tiny, store, request):  # type: ignore[no-untyped-def]
    interval = INTERVAL[store]
    bucket = None
    moto_s3 = request.getfixturevalue("moto_s3") if store == "oss" else None
    extra: dict[str, object] = {}
    model_dir = str(tiny.model_dir)
    if store == "oss":
        bucket = request.getfixturevalue("s3_bucket")
        moto_s3.upload(tiny.model_dir, bucket, "model")
        model_dir = f"oss://{bucket}/model"
        extra = {"model_store_type": "oss", **moto_s3.config_fields()}
    publish = Publisher(tiny, store, moto_s3, bucket)

    version = publish.full(1, 1000.0, 1.0)
    processor = Processor(tiny.config(savedmodel_dir=model_dir, checkpoint_dir=publish.checkpoint_dir,
                                      model_update_interval_seconds=interval, **extra))
    keys = tiny.keys
    table = {(tag, w): tiny.expected(keys, tag, w) for tag, w in [(1000.0 * j + i, float(j))
                                                                 for j in range(1, FULLS + 2)
                                                                 for i in range(DELTAS_PER_VERSION + 1)]}

    def matches(index: int, row: np.ndarray) -> list[tuple[float, float]]:
        return [state for state, out in table.items() if np.array_equal(out[index], row)]

    stop = threading.Event()
    problems: list[str] = []
    served = [0] * CLIENTS

    def client(n: int) -> None:
        rng = np.random.default_rng(n)
        while not stop.is_set():
            i = int(rng.integers(len(keys)))
            status, body = processor.process(encode_request({"item_id": keys[i:i + 1]}))
            if status != 200:
                problems.append(f"status {status}: {body[:200]!r}")
                return
            row = decode_response(body)["score"][0]
            if len(matches(i, row)) != 1:
                problems.append(f"key {keys[i]}: {row.tolist()} matches {matches(i, row)}")
                return
            served[n] += 1

    def wait_served(state: tuple[float, float]) -> float:
        """Seconds until a probe request sees `state`."""
        landed = time.monotonic()
        while time.monotonic() - landed < WAIT_LIMIT:
            status, body = processor.process(encode_request({"item_id": keys[:1]}))
            assert status == 200, body
            if np.array_equal(decode_response(body)["score"][0], table[state][0]):
                return time.monotonic() - landed
            time.sleep(0.005)
        raise AssertionError(f"{state} not served within {WAIT_LIMIT} s; model info {processor.model_info()}")

    threads = Threads([lambda n=n: client(n) for n in range(CLIENTS)], "soak clients")
    delta_delays: list[float] = []
    step = 1
    try:
        for j in range(1, FULLS + 2):
            if j > 1:
                step += 1
                version = publish.full(step, 1000.0 * j, float(j))
                wait_served((1000.0 * j, float(j)))
            for i in range(1, DELTAS_PER_VERSION + 1):
                step += 1
                publish.delta(version, step, 1000.0 * j + i)
                delta_delays.append(wait_served((1000.0 * j + i, float(j))))
    finally:
        stop.set()
        try:
            threads.join(timeout=60)
        finally:
            info = processor.model_info()
            processor.close()
    assert problems == []
    assert len(delta_delays) == 20 and min(served) > 0
    assert max(delta_delays) <= 2 * interval + 2.0, delta_delays
    assert (info["version"], info["full_updates"], info["delta_updates"], info["last_error"]) == (
        str(step - DELTAS_PER_VERSION), FULLS + 1, 20, None)
    assert info["delta_step"] == step
