"""Fixtures for the server tests: the demo model and `recserve serve` running as a real
subprocess on free ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from recserve import Processor
from recserve.export import write_checkpoint, write_model_dir
from recserve.export.demo import DemoModel, write_demo
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec

ROOT = Path(__file__).resolve().parents[2]

# Config fields for tests that count every answer: admission (max_queue_ms 100 by default)
# answers 503 when a request waited its turn longer, which a loaded CI machine causes.
UNHURRIED = {"max_queue_ms": 60_000}


def settled(read: Callable[[], Any], done: Callable[[Any], bool], seconds: float = 10.0) -> Any:
    """`read()` again until `done(value)` or `seconds` have passed; its last value, for the
    test's exact assertion. A worker pool's /metrics has the other workers' requests only
    once they flushed them (recserve.server.pool_flush, every 0.5 s)."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value) or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self.process.wait(timeout)


def start_server(config_path: Path, log_dir: Path, *, env: dict[str, str] | None = None,
                 wait_ready: bool = True, workers: int | str = 1) -> RunningServer:
    http_port, grpc_port = free_port(), free_port()
    log_path = log_dir / f"server-{http_port}.log"
    full_env = {**os.environ, **(env or {})}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "recserve.server.cli", "serve", "--config", str(config_path),
             "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--workers", str(workers)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=full_env,
        )
    server = RunningServer(process, http_port, grpc_port, log_path)
    path = "/v2/health/ready" if wait_ready else "/v2/health/live"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + path, timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    server.stop(signal.SIGKILL)
    pytest.fail(f"server not {'ready' if wait_ready else 'live'} within 60 s:\n{server.log()}")


def write_rows_model(root: Path, rows: int, dim: int, default: DefaultSpec | None = None) -> dict[str, object]:
    """A model that answers the looked-up rows themselves (Identity on the embedding); keys
    0..rows-1 stored, others get `default` (zeros without one)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["emb"], ["row"])], "rows",
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", dim])],
        [helper.make_tensor_value_info("row", TensorProto.FLOAT, ["batch", dim])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    spec = ModelSpec(embeddings=(EmbeddingBinding(input="ids", table="t", dim=dim, graph_input="emb",
                                                  default=default or DefaultSpec()),))
    model_dir = write_model_dir(root / "model", model, spec)
    keys = np.arange(rows, dtype=np.int64)
    write_checkpoint(root / "checkpoints", {"t": (keys, np.zeros((rows, dim), np.float32))}, global_step=1)
    return {"model_store_type": "local", "savedmodel_dir": str(model_dir),
            "checkpoint_dir": str(root / "checkpoints"), "model_update_interval_seconds": 0.1,
            "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return write_demo(tmp_path_factory.mktemp("server-demo"))


@pytest.fixture(scope="session")
def demo_processor(demo: DemoModel) -> Iterator[Processor]:
    """The same model in-process: the reference every route's answer is compared to."""
    processor = Processor(json.loads(demo.config_path.read_text()))
    yield processor
    processor.close()


@pytest.fixture(scope="session")
def server(demo: DemoModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the demo model, shared by the read-only route tests."""
    running = start_server(demo.config_path, tmp_path_factory.mktemp("server-logs"))
    yield running
    running.stop()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """Start servers for one test (a config of its own); all are stopped afterwards."""
    started: list[RunningServer] = []

    def run(config: dict[str, Any], **kwargs: Any) -> RunningServer:
        path = tmp_path / f"config-{len(started)}.json"
        path.write_text(json.dumps(config))
        running = start_server(path, tmp_path, **kwargs)
        started.append(running)
        return running

    yield run
    for running in started:
        running.stop(signal.SIGKILL)

