"""A real redis-server for the tests' fixtures and the benchmarks (bench_redis, the soak):
one subprocess on a free port, optionally a one-node Redis Cluster owning every slot, or
one that requires a password (AUTH)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from benchmarks.load_tools import free_port

__all__ = ["RedisServer"]


class RedisServer:
    """One redis-server subprocess on a free port, without persistence: killed (a crash) and
    started again, it comes back empty on the same port. Not thread-safe."""

    def __init__(self, workdir: Path, *, cluster: bool = False, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; run `make redis-server` (apt-get install redis-server)")
        self.binary = binary
        self.port = free_port(with_cluster_bus=cluster)
        self.workdir = workdir
        self.cluster = cluster
        self.password = password  # --requirepass: clients must AUTH with it
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        log = self.workdir / f"redis-{self.port}.log"
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(log)]
        if self.password is not None:
            args += ["--requirepass", self.password]
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
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, password=self.password)

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
