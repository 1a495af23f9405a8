"""`recserve perf` against `recserve serve` on this machine: its requests/s beside wrk's on
the same server (can users trust it?), and the plots BENCHMARKS.md embeds — throughput
vs batch, latency CDFs, and p99 over time across a full version swap and a delta."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_server import _start_server
from benchmarks.models import build_dlrm
from benchmarks.report import Row
from recserve.export.checkpoint_writer import write_checkpoint, write_delta
from recserve.export.demo import write_demo
from recserve.perf.client_pool import ClientPool
from recserve.perf.options import PerfOptions
from recserve.perf.plot import plot_latency_cdf, plot_run, plot_throughput_vs_batch, plot_timeline
from recserve.perf.results import PointResult, summarize
from recserve.perf.run import measure, payloads_by_batch
from recserve.warmup.warmup_file import write_warmup_file
from recserve.wire.codec import encode_request

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "benchmarks" / "plots"
PROCESSES = 2          # client processes of recserve perf; wrk gets as many threads
CONNECTIONS = 16
ROUNDS = 6             # wrk and perf alternate, the order flipping every round
ROUND_SECONDS = 5.0
GRID_BATCHES = (1, 8, 64, 256, 512)
GRID_CONCURRENCY = (1, 4, 16)
GRID_SECONDS = 2.0
SWAP_SECONDS = 30.0    # the timeline point; the full version lands at 1/3, the delta at 2/3
DELTA_ROWS = 100_000
NOTES = ""             # written by run(): the figures behind the rows, and the plots

_WRK_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/octet-stream"
local f = assert(io.open(os.getenv("RECSERVE_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()
"""


def _options(url: str, **extra: Any) -> PerfOptions:
    base = PerfOptions(
        url=url, protocol="eas-http", model="default", batches=(64,), concurrency=(CONNECTIONS,),
        duration=ROUND_SECONDS, warmup=1.0, requests_file=None, keys=(0, 100_000), zipf=1.1, distinct=64,
        processes=PROCESSES, metrics_url=None, json_path=None, plot_path=None, timeout=30.0)
    return replace(base, **extra)


def _wrk(url: str, body: Path, script: Path, seconds: float) -> float:
    out = subprocess.run(
        ["wrk", f"-t{PROCESSES}", f"-c{CONNECTIONS}", f"-d{seconds:.0f}s", "-s", str(script), url],
        capture_output=True, text=True, check=True, env={**os.environ, "RECSERVE_BODY": str(body)}).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{out}")
    return float(match[1])


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _versus_wrk(root: Path, url: str, pool: ClientPool, demo_inputs: dict[str, np.ndarray]) -> tuple[Row, str]:
    """Same server, same request bytes, same connections: perf and wrk take turns."""
    body = encode_request(demo_inputs)
    body_path, requests_path, script = root / "body.bin", root / "requests.bin", root / "post.lua"
    body_path.write_bytes(body)
    write_warmup_file(requests_path, [body])
    script.write_text(_WRK_LUA)
    options = _options(url, requests_file=str(requests_path), batches=None)
    payloads = payloads_by_batch(options)
    target = f"{url}/api/predict/default"
    ours: list[float] = []
    theirs: list[float] = []
    loads = [_load()]
    _wrk(target, body_path, script, 2)  # warm the server
    for i in range(ROUNDS):
        turns = [lambda: theirs.append(_wrk(target, body_path, script, ROUND_SECONDS)),
                 lambda: ours.append(measure(options, payloads, pool)[0].requests_per_s)]
        for turn in (turns if i % 2 == 0 else turns[::-1]):
            turn()
        loads.append(_load())
    perf_median, wrk_median = statistics.median(ours), statistics.median(theirs)
    ratio = perf_median / wrk_median
    row = Row(f"recserve perf vs wrk: EAS HTTP requests/s, batch 64, {CONNECTIONS} connections "
              f"({PROCESSES} processes / threads), median of {ROUNDS} alternating rounds",
              f"{perf_median:,.0f} req/s", f"wrk {wrk_median:,.0f} req/s", ratio, "0.9 - 1.1", 0.9 <= ratio <= 1.1)
    detail = (f"Rounds (req/s, {ROUND_SECONDS:.0f} s each): recserve perf "
              f"{', '.join(f'{x:,.0f}' for x in ours)}; wrk {', '.join(f'{x:,.0f}' for x in theirs)}. "
              f"Load average (1, 5, 15 min) before and after each round: {' | '.join(loads)}.")
    return row, detail


def _grid(url: str, pool: ClientPool) -> list[PointResult]:
    options = _options(url, batches=GRID_BATCHES, concurrency=GRID_CONCURRENCY, duration=GRID_SECONDS,
                       warmup=0.5)
    return measure(options, payloads_by_batch(options), pool)


def _metric(url: str, name: str, label: str = "") -> float:
    """A sample of the server's /metrics (0 when absent)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + "{") and label in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _timeline(root: Path, pool: ClientPool) -> tuple[PointResult, list[tuple[float, str]], list[Row]]:
    """Load at a steady batch 64 while a full version (1M rows) and then a delta land."""
    model = build_dlrm(root / "dlrm", n_sparse=4, total_rows=1_000_000, hidden=(256, 64))
    config = root / "dlrm.json"
    config.write_text(json.dumps(model.config(model_update_interval_seconds=0.5, intra_op_parallelism_threads=1,
                                              inter_op_parallelism_threads=1)))
    staging = root / "staging"
    full = write_checkpoint(staging, {f"t{t}": (k, v + np.float32(1)) for t, (k, v) in
                                      enumerate(zip(model.keys, model.values))}, global_step=2)
    shadow = staging / "shadow"
    shadow.mkdir()
    shutil.copy(full / "MANIFEST.json", shadow / "MANIFEST.json")
    rng = np.random.default_rng(5)
    delta = write_delta(shadow, {"t0": (model.keys[0][:DELTA_ROWS],
                                        rng.standard_normal((DELTA_ROWS, model.dim), dtype=np.float32))},
                        global_step=3)
    requests = root / "dlrm-requests.bin"
    write_warmup_file(requests, [encode_request(model.sample(64, np.random.default_rng(i))[0]) for i in range(64)])
    proc, http_port, _ = _start_server(config, root / "dlrm-server.log")
    url = f"http://127.0.0.1:{http_port}"
    events: list[tuple[float, str]] = []
    try:
        options = _options(url, requests_file=str(requests), batches=None, concurrency=(4,),
                           duration=SWAP_SECONDS)
        wire = [(p.data, p.method) for p in payloads_by_batch(options)[64]]
        start_at = time.time() + 2.0

        def updates() -> None:
            time.sleep(max(0.0, start_at + SWAP_SECONDS / 3 - time.time()))
            landed = model.checkpoint_dir / full.name
            full.rename(landed)
            events.append((time.time() - start_at, "full version lands"))
            _wait(lambda: _metric(url, "recserve_serving_global_step") >= 2, start_at, events,
                  "serving the full version")
            time.sleep(max(0.0, start_at + 2 * SWAP_SECONDS / 3 - time.time()))
            (landed / ".incremental_ckpt").mkdir(exist_ok=True)
            delta.rename(landed / ".incremental_ckpt" / delta.name)
            events.append((time.time() - start_at, f"delta ({DELTA_ROWS // 1000}k rows) lands"))
            _wait(lambda: _metric(url, "recserve_model_updates_total", 'kind="delta"') >= 1, start_at, events,
                  "delta applied")

        thread = threading.Thread(target=updates)
        thread.start()
        samples = pool.run(url, False, wire, 4, SWAP_SECONDS, 1.0, 30.0, start_at=start_at)
        thread.join()
        point = summarize(samples, 64, 4, SWAP_SECONDS)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return point, events, _swap_rows(point, events)


def _wait(done: Callable[[], bool], start_at: float, events: list[tuple[float, str]], label: str) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if done():
            events.append((time.time() - start_at, label))
            return
        time.sleep(0.1)
    raise RuntimeError(f"not {label} within 60 s")


def _swap_rows(point: PointResult, events: list[tuple[float, str]]) -> list[Row]:
    """Worst per-second p99 from an update landing until 2 s after it was served, against
    the median per-second p99 before anything landed."""
    steady = [x["p99_ms"] for x in point.timeline if x["t"] <= events[0][0]]
    base = statistics.median(steady)
    rows = []
    for (landed, what), (served, _) in ((events[0], events[1]), (events[2], events[3])):
        during = [x["p99_ms"] for x in point.timeline if landed < x["t"] <= served + 2.0]
        worst = max(during) if during else float("nan")
        rows.append(Row(f"p99 per second while the {what.split(' lands')[0]} lands (worst second / steady "
                        f"median; lower is better), batch 64, 4 connections",
                        f"{worst:.2f} ms (served {served - landed:.1f} s after landing)", f"steady {base:.2f} ms",
                        worst / base))
    return rows


def run() -> list[Row]:
    global NOTES
    if shutil.which("wrk") is None:
        raise RuntimeError("bench_perf needs wrk (make bench installs it: apt-get install wrk)")
    PLOTS.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-perf-"))
    proc = None
    try:
        demo = write_demo(root / "demo")
        proc, http_port, _ = _start_server(demo.config_path, root / "server.log")
        url = f"http://127.0.0.1:{http_port}"
        with ClientPool(PROCESSES) as pool:
            wrk_row, wrk_detail = _versus_wrk(root, url, pool, demo.sample_inputs(64, np.random.default_rng(64)))
            grid = _grid(url, pool)
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            proc = None
            point, events, swap_rows = _timeline(root, pool)
        plot_throughput_vs_batch(grid, PLOTS / "perf_throughput_vs_batch.png",
                                 "recserve serve, demo model, EAS HTTP: throughput vs batch")
        plot_latency_cdf([p for p in grid if p.batch == 64], PLOTS / "perf_latency_cdf.png",
                         "Latency CDF, demo model, EAS HTTP, batch 64")
        plot_run([p for p in grid if p.batch in (1, 64, 512)], PLOTS / "perf_concurrency.png",
                 "recserve serve, demo model, EAS HTTP")
        plot_timeline(point, events, PLOTS / "perf_p99_over_time.png",
                      "p99 per second across a full version swap (1M rows) and a delta, batch 64, 4 connections")
        best = {b: max(p.requests_per_s for p in grid if p.batch == b) for b in GRID_BATCHES}
        NOTES = f"""Server: `recserve serve` on the demo model (one ORT session, 1 intra-op thread) for the
wrk row and the grid; the timeline uses the benchmark DLRM (4 tables, 1M rows of dim 16,
MLP 77-256-64-1, updates polled every 0.5 s). Client and server share the machine's 2
cores. wrk: `wrk -t{PROCESSES} -c{CONNECTIONS} -d{ROUND_SECONDS:.0f}s -s post.lua` posting the same
PredictRequest bytes that `recserve perf --requests` sends (`--processes {PROCESSES}
--concurrency {CONNECTIONS}`). {wrk_detail}

Grid (`--batch {','.join(map(str, GRID_BATCHES))} --concurrency {','.join(map(str, GRID_CONCURRENCY))}
--duration {GRID_SECONDS:.0f}s`, synthesized requests, Zipf ids): best requests/s per batch
{', '.join(f'{b}: {r:,.0f}' for b, r in best.items())}.
Timeline events (seconds into the window): {'; '.join(f'{t:.1f} {e}' for t, e in events)}.

![throughput vs batch](benchmarks/plots/perf_throughput_vs_batch.png)

![latency CDF](benchmarks/plots/perf_latency_cdf.png)

![throughput and p99 vs concurrency](benchmarks/plots/perf_concurrency.png)

![p99 over time across a full version swap and a delta](benchmarks/plots/perf_p99_over_time.png)
"""
        return [wrk_row, *swap_rows]
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        shutil.rmtree(root, ignore_errors=True)
