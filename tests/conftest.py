"""Fixtures shared by every test area: a real redis-server on a free port, and requests
for the torch-exported ONNX fixtures.

`redis_server` starts one for the test and stops it after; `redis_server.kill()` and
`.start()` simulate an outage (same port, data lost: the server runs without persistence,
``--save "" --appendonly no``). `redis_cluster_node` is a one-node Redis Cluster owning all
16384 slots, for code paths that use redis-py's cluster client; `redis_server_with_password`
requires AUTH with REDIS_PASSWORD. Never a system service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.redis_server import RedisServer

__all__ = ["RedisServer"]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


REDIS_PASSWORD = "s3cret-pass-7f1c"


@pytest.fixture
def redis_server_with_password(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server started with --requirepass REDIS_PASSWORD."""
    server = RedisServer(tmp_path, password=REDIS_PASSWORD)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_cluster_node(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, cluster=True)
    server.start()
    yield server
    server.stop()


# -- torch-exported fixtures (tests/fixtures/torch, made by make_fixtures.py) ------------

TORCH_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "torch"


def _ids_and_dense(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    return {
        "user_id": rng.integers(0, 50, batch),
        "item_id": rng.integers(0, 30, batch),
        "dense": rng.standard_normal((batch, 3)).astype(np.float32),
    }


def _bags(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    return {"tags": rng.integers(0, 40, (batch, 5)), "cats": rng.integers(0, 20, (batch, 3))}


def _float_row(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    ids = rng.integers(0, 10, (batch, 3))
    return {"x": np.concatenate([rng.standard_normal((batch, 3)), ids], axis=1).astype(np.float32)}


TorchRequest = Callable[[np.random.Generator, int], dict[str, np.ndarray]]


@pytest.fixture(scope="session")
def torch_requests() -> dict[str, TorchRequest]:
    """Per fixture file: a function making a valid request of `batch` rows."""
    return {
        "embedding_torchscript.onnx": _ids_and_dense,
        "embedding_dynamo.onnx": _ids_and_dense,
        "embedding_bag_torchscript.onnx": _bags,
        "embedding_bag_dynamo.onnx": _bags,
        "float_input_ctr.onnx": _float_row,
    }
