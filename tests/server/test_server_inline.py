"""Which HTTP predictions run on the event loop (recserve.server.inline_policy) and the
environment that sets it; answers are the same bytes whichever thread served them."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from recserve.errors import ConfigError
from recserve.server.inline_policy import InlinePolicy
from recserve.server.settings import (
    DEFAULT_INLINE_MAX_BYTES,
    DEFAULT_INLINE_MAX_MS,
    DEFAULT_INLINE_MAX_RELEASED_MS,
    ServerSettings,
)
from recserve.wire.codec import encode_request


def test_a_model_runs_inline_once_measured_fast_and_while_bodies_are_small() -> None:
    policy = InlinePolicy(max_bytes=1000, max_seconds=0.001)
    assert not policy.inline("m", 10)  # never seen: a worker measures it first
    policy.record("m", 0.0002)
    assert policy.inline("m", 10)
    assert not policy.inline("m", 1001)  # a large body predicts a long run
    assert not policy.inline("other", 10)  # each model has its own measure
    for _ in range(200):
        policy.record("m", 0.005)  # the model became slow: back to the workers
    assert not policy.inline("m", 10)


def test_zero_milliseconds_turns_inline_runs_off() -> None:
    policy = InlinePolicy(max_bytes=1000, max_seconds=0.0)
    policy.record("m", 1e-6)
    assert not policy.inline("m", 10)


def test_a_long_gil_free_part_sends_a_fast_model_to_the_workers() -> None:
    # 0.4 ms of 0.45 in C with the GIL released: a worker overlaps it with the loop's work.
    policy = InlinePolicy(max_bytes=1000, max_seconds=0.001, max_released_seconds=0.0001)
    policy.record("long", 0.00045, released=0.0004)
    assert not policy.inline("long", 10)
    policy.record("short", 0.00005, released=0.00002)  # batch 1: the hop would cost more
    assert policy.inline("short", 10)
    for _ in range(200):
        policy.record("short", 0.00045, released=0.0004)  # its requests grew: to the workers
    assert not policy.inline("short", 10)
    unlimited = InlinePolicy(max_bytes=1000, max_seconds=0.001)  # the default: no limit
    unlimited.record("long", 0.00045, released=0.0004)
    assert unlimited.inline("long", 10)


def test_settings_read_the_inline_limits_from_the_environment() -> None:
    defaults = ServerSettings.resolve([], env={})
    assert (defaults.inline_max_bytes, defaults.inline_max_ms, defaults.inline_max_released_ms) == (
        DEFAULT_INLINE_MAX_BYTES, DEFAULT_INLINE_MAX_MS, DEFAULT_INLINE_MAX_RELEASED_MS)
    assert DEFAULT_INLINE_MAX_RELEASED_MS == float("inf")  # off unless asked for (README, "Server")
    set_ = ServerSettings.resolve([], env={"RECSERVE_INLINE_MAX_BYTES": "4096", "RECSERVE_INLINE_MAX_MS": "0.5",
                                           "RECSERVE_INLINE_MAX_RELEASED_MS": "0.1"})
    assert (set_.inline_max_bytes, set_.inline_max_ms, set_.inline_max_released_ms) == (4096, 0.5, 0.1)
    for name, raw in (("RECSERVE_INLINE_MAX_MS", "fast"), ("RECSERVE_INLINE_MAX_BYTES", "-1"),
                      ("RECSERVE_INLINE_MAX_MS", "inf"), ("RECSERVE_INLINE_MAX_RELEASED_MS", "-0.1")):
        with pytest.raises(ConfigError, match=f"{name} must be a number >= 0.*got '{raw}'"):
            ServerSettings.resolve([], env={name: raw})


@pytest.mark.parametrize("env", [{"RECSERVE_INLINE_MAX_MS": "0"}, {"RECSERVE_INLINE_MAX_RELEASED_MS": "0"}])
def test_inline_and_worker_runs_answer_the_same_bytes(server, launch, demo, env) -> None:
    off = launch(json.loads(demo.config_path.read_text()), env=env)
    rng = np.random.default_rng(5)
    bodies = [encode_request(demo.sample_inputs(batch, rng)) for batch in (1, 3, 64)]
    with httpx.Client() as client:
        for body in bodies * 3:  # the first run of a model is on a worker, later ones inline
            inline = client.post(f"{server.url}/api/predict/default", content=body)
            worker = client.post(f"{off.url}/api/predict/default", content=body)
            assert inline.status_code == worker.status_code == 200
            assert inline.content == worker.content
