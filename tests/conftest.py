"""Fixtures shared by every test area: a real redis-server on a free port, and requests
for the torch-exported ONNX fixtures.

`redis_server` starts one for the test and stops it after; `redis_server.kill()` and
`.start()` simulate an outage (same port, data lost: the server runs without persistence,
``--save "" --appendonly no``). `redis_cluster_node` is a one-node Redis Cluster owning all
16384 slots, for code paths that use redis-py's cluster client. Never a system service.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

__all__ = ["RedisServer"]


def _free_port(*, with_cluster_bus: bool = False) -> int:
    """A free port; with_cluster_bus: one whose Cluster bus port (port + 10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not with_cluster_bus:
            return port
        if port + 10000 <= 65535:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


class RedisServer:
    """One redis-server subprocess. Not thread-safe; tests drive it from one thread."""

    def __init__(self, workdir: Path, *, cluster: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed; run `make redis-server` (apt-get install redis-server)")
        self.binary = binary
        self.port = _free_port(with_cluster_bus=cluster)
        self.workdir = workdir
        self.cluster = cluster
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        log = self.workdir / f"redis-{self.port}.log"
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(log)]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf"]
            (self.workdir / f"nodes-{self.port}.conf").unlink(missing_ok=True)
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    if self.process.poll() is None:
                        self.process.kill()
                    err = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise RuntimeError(f"redis-server on port {self.port} did not start: {err}") from None
                time.sleep(0.01)
        if self.cluster:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise RuntimeError("one-node Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.02)
        client.close()

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def kill(self) -> None:
        """SIGKILL, as a crash; the data is gone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
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
