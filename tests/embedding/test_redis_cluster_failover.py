"""A real Redis Cluster (3 masters, 3 replicas, cluster-node-timeout 2 s) under two
Processors' lookups: SIGKILL the master `redis_url` names, then another master. recserve must
never answer wrong (against the numpy + onnxruntime reference), and must answer exactly again within 10 s of each death (it reaches the
cluster through its node map, not through the dead seed)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import numpy as np
import pytest
import redis

from benchmarks.load_tools import free_port
from recserve import Processor
from recserve.embedding.redis_keys import KeySpace
from recserve.export.demo import DemoModel, write_demo
from recserve.export.reference import Reference
from tests.reference_answers import ATOL, assert_answers_like_reference
from tests.threads import Threads

pytestmark = pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli (redis-tools) is not installed")

RECOVERY_SECONDS = 10.0


def _cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10,
                          check=False).stdout


class RedisClusterProcesses:
    """Six redis-server processes on free ports, made into a cluster by redis-cli."""

    def __init__(self, root: Path) -> None:
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        ports: list[int] = []
        while len(ports) < 6:
            port = free_port(with_cluster_bus=True)
            if port not in ports:
                ports.append(port)
        for port in ports:
            workdir = root / str(port)
            workdir.mkdir(parents=True)
            self.procs[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--save", "",
                 "--appendonly", "no", "--dir", str(workdir)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in ports:
            self._wait(lambda p=port: _cli(p, "ping").strip() == "PONG", f"redis-server on {port}")
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "1",
             "--cluster-yes"], capture_output=True, text=True, timeout=60, check=False)
        assert created.returncode == 0, created.stdout + created.stderr
        self.wait_healthy(replicas=3)

    @staticmethod
    def _wait(check: Any, what: str, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"not within {seconds} s: {what}")
            time.sleep(0.1)

    def wait_healthy(self, replicas: int | None = None) -> None:
        """Every node says the cluster is ok and every replica's link to its master is up
        (a replica that never synced is not promoted); with `replicas`, that many exist."""
        def healthy() -> bool:
            infos = [_cli(p, "info", "replication") for p in self.procs]
            linked = [i for i in infos if "role:slave" in i]
            return (all("cluster_state:ok" in _cli(p, "cluster", "info") for p in self.procs)
                    and (replicas is None or len(linked) == replicas)
                    and all("master_link_status:up" in i for i in linked))
        self._wait(healthy, "a healthy cluster")

    def masters(self) -> list[int]:
        return [p for p in self.procs if "role:master" in _cli(p, "info", "replication")]

    def kill(self, port: int) -> None:
        process = self.procs.pop(port)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.procs.values():
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterProcesses]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; run `make redis-server`")
    processes = RedisClusterProcesses(tmp_path / "cluster")
    yield processes
    processes.stop()


class Load:
    """Threads sending requests to each processor and checking every answer against the
    reference's (numpy + onnxruntime, recserve/export/reference.py); records (time, outcome)
    with outcome "ok", "error" or "wrong"."""

    def __init__(self, processors: list[Processor], reference: Reference, demo: DemoModel) -> None:
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        rng = np.random.default_rng(9)
        self._requests = [demo.sample_inputs(8, rng) for _ in range(16)]
        self._wants = [reference.predict(r) for r in self._requests]
        self._processors = processors
        self._threads: Threads | None = None

    def _run(self, processor: Processor, seed: int) -> int:
        k = seed
        while not self._stop.is_set():
            k += 1
            request, want = self._requests[k % 16], self._wants[k % 16]
            try:
                got = processor.predict(request)
                outcome = "ok" if all(np.allclose(got[n], want[n], atol=ATOL, rtol=0) for n in want) else "wrong"
            except Exception:  # noqa: BLE001  (an outage answers an error; counted, not raised)
                outcome = "error"
            self.events.append((time.monotonic(), outcome))
            time.sleep(0.005)
        return k - seed

    def __enter__(self) -> Self:
        self._threads = Threads([lambda p=p, i=i: self._run(p, i) for i, p in enumerate(self._processors)],
                                "cluster load clients")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._threads is not None
        assert min(self._threads.join(timeout=30)) > 0  # every client sent requests

    def recovered_after(self, since: float) -> float | None:
        """Seconds from `since` to the start of the final run of correct answers (None if the
        last answer was not correct)."""
        events = [e for e in list(self.events) if e[0] >= since]
        if not events or events[-1][1] != "ok":
            return None
        start = events[-1][0]
        for at, outcome in reversed(events):
            if outcome != "ok":
                break
            start = at
        return start - since


def test_a_master_dies_and_lookups_recover_through_the_node_map(cluster: RedisClusterProcesses, tmp_path: Path) -> None:
    demo = write_demo(tmp_path / "demo")
    seed = cluster.masters()[0]
    config = json.loads(demo.config_path.read_text())
    config.update(feature_store_type="redis", redis_cluster=True, redis_url=f"127.0.0.1:{seed}",
                  redis_timeout_seconds=0.5, redis_cache_rows=4, model_update_interval_seconds=0.2)
    reference = Reference(demo.model_dir, demo.checkpoint_dir)
    replicas = [Processor(config) for _ in range(2)]
    try:
        # Rows spread over the cluster: every master holds part of every table.
        version = replicas[0].model_info()["version"]
        tables = sorted(replicas[0].model_info()["tables"])
        space = KeySpace("default")
        for port in cluster.masters():
            node = redis.Redis(port=port)
            for table in tables:
                pattern = space.row_prefix(version, table).decode() + "*"
                assert next(node.scan_iter(match=pattern, count=1000), None) is not None, (port, table)
        with Load(replicas, reference, demo) as load:
            time.sleep(1.0)
            for victim in (seed, next(p for p in cluster.masters() if p != seed)):
                killed_at = time.monotonic()
                cluster.kill(victim)
                time.sleep(RECOVERY_SECONDS + 2)
                recovered = load.recovered_after(killed_at)
                print(f"master {victim} killed: exact answers again after {recovered} s")
                assert recovered is not None and recovered <= RECOVERY_SECONDS, (victim, recovered)
                cluster.wait_healthy()
        outcomes = [o for _, o in load.events]
        assert outcomes.count("wrong") == 0
        assert outcomes.count("ok") > 100
    finally:
        for p in replicas:
            p.close()


def test_several_seed_nodes_and_a_dead_first_seed(cluster: RedisClusterProcesses, tmp_path: Path) -> None:
    demo = write_demo(tmp_path / "demo")
    first, second = cluster.masters()[:2]
    cluster.kill(first)
    cluster.wait_healthy()
    config = json.loads(demo.config_path.read_text())
    config.update(feature_store_type="redis", redis_cluster=True, redis_timeout_seconds=0.5,
                  redis_url=f"127.0.0.1:{first},redis://127.0.0.1:{second}")
    processor = Processor(config)  # the first seed is dead: the second gives the node map
    try:
        inputs = demo.sample_inputs(4, np.random.default_rng(2))
        assert_answers_like_reference([processor], Reference(demo.model_dir, demo.checkpoint_dir), inputs)
    finally:
        processor.close()
