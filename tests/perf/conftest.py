"""`recserve serve` on the demo model, as a real subprocess, for `recserve perf` to load."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from recserve.export.demo import DemoModel, write_demo
from tests.server.conftest import ROOT, RunningServer, start_server


@pytest.fixture(scope="session")
def perf_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return write_demo(tmp_path_factory.mktemp("perf-demo"))


@pytest.fixture(scope="session")
def perf_server(perf_demo: DemoModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(perf_demo.config_path, tmp_path_factory.mktemp("perf-server-logs"))
    yield running
    running.stop()


def run_perf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`recserve perf ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "recserve.server.cli", "perf", *args], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def served_requests(server: RunningServer, route: str) -> float:
    """Answers with status 200 the server counted on `route` (its /metrics)."""
    import httpx

    total = 0.0
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith("recserve_requests_total{") and f'route="{route}"' in line and 'code="200"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
