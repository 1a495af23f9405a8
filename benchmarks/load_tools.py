"""What the server benchmarks (and the worker memory test) share: `recserve serve` in a
subprocess, free ports, wrk runs with a binary POST body, and the CPU and memory of a
server's whole process tree (and the share of that CPU its requests' handlers report)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["free_port", "post_script", "process_tree", "request_cpu_seconds", "serve_process", "tree_cpu_seconds",
           "tree_memory", "wait_ready", "wrk"]

ROOT = Path(__file__).resolve().parent.parent


def serve_process(config: Path | str, http_port: int, grpc_port: int | None = None, *extra: str,
                  env: Mapping[str, str] | None = None, **popen: Any) -> subprocess.Popen[bytes]:
    """`recserve serve --config config` in a subprocess (WARNING logs) on `http_port` and
    `grpc_port` (a free one if None); `extra`: more of its flags; `env`: added to this
    process's environment; `popen`: subprocess.Popen's other arguments (stdout, ...)."""
    return subprocess.Popen(
        [sys.executable, "-m", "recserve.server.cli", "--log-level", "WARNING", "serve", "--config", str(config),
         "--http-port", str(http_port), "--grpc-port", str(free_port() if grpc_port is None else grpc_port), *extra],
        cwd=ROOT, env=None if env is None else {**os.environ, **env}, **popen)


def free_port(*, with_cluster_bus: bool = False) -> int:
    """A free port on 127.0.0.1; with_cluster_bus: one whose Redis Cluster bus port (port +
    10000) is free too."""
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


def wait_ready(url: str, process: subprocess.Popen[bytes] | None = None, *, what: str = "the server",
               timeout: float = 60.0) -> None:
    """Poll `url` (a readiness route) until it answers 200; RuntimeError if `process` exits or
    `timeout` seconds pass first."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready")
        try:
            if httpx.get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} was not ready within {timeout:.0f} s")


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (a worker pool: leader, zygote, workers)."""
    try:
        children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []
    return [pid] + [q for child in children for q in process_tree(child)]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of every thread of every process in the tree, so far."""
    total = 0
    for q in process_tree(pid):
        try:
            fields = Path(f"/proc/{q}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def request_cpu_seconds(base_url: str) -> float:
    """The server's recserve_request_cpu_seconds_total summed over models and routes: CPU
    spent serving requests from the model's lease to the answer (the rest of the process's
    CPU is the protocols' own)."""
    import httpx

    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("recserve_request_cpu_seconds_total{"))


def tree_memory(pid: int) -> dict[str, int]:
    """Bytes summed over the tree from smaps_rollup: Pss (shared pages counted once in the
    sum), Pss_Anon, Pss_File (mapped files: libraries, table files, SSD records),
    Pss_Shmem (the shared arena), Rss."""
    total = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0, "Pss_Shmem": 0, "Rss": 0}
    for q in process_tree(pid):
        try:
            lines = Path(f"/proc/{q}/smaps_rollup").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            key, value = line.split(":")
            if key in total:
                total[key] += int(value.split()[0]) * 1024
    return total


def wrk(url: str, script: Path, *, threads: int, connections: int, seconds: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "--latency",
         "-s", str(script), url], capture_output=True, text=True, check=True).stdout
    done = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)\b", out)
    assert done is not None, out
    elapsed = float(done.group(2)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[done.group(3)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    timeouts = re.search(r"timeout (\d+)", out)

    def ms(label: str) -> float:
        value = re.search(rf"{label}%\s+([\d.]+)(us|ms|s)", out)
        assert value is not None, out
        return float(value.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[value.group(2)]

    return {"requests": int(done.group(1)), "seconds": elapsed, "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "timeouts": int(timeouts.group(1)) if timeouts else 0, "p50_ms": ms("50"), "p99_ms": ms("99")}


def post_script(directory: Path, body: bytes, name: str, content_type: str = "application/octet-stream") -> Path:
    """A wrk script POSTing `body` (kept in a file next to it) as `content_type`."""
    (directory / f"{name}.bin").write_bytes(body)
    script = directory / f"{name}.lua"
    script.write_text(f'wrk.method = "POST"\nlocal f = io.open("{directory / name}.bin", "rb")\n'
                      'wrk.body = f:read("*all")\nf:close()\n'
                      f'wrk.headers["Content-Type"] = "{content_type}"\n')
    return script
