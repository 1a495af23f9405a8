"""`recserve serve --workers N` (DESIGN §9): memory of the whole process tree with ~1 GB of
tables, and requests/s + server CPU per request for 1 and 2 workers under wrk."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.load_tools import free_port, post_script, serve_process, tree_cpu_seconds, tree_memory, wait_ready, wrk
from benchmarks.models import build_dlrm
from benchmarks.report import Row
from recserve import Processor
from recserve.export.demo import write_demo
from recserve.wire.codec import encode_request

TABLE_ROWS = 15_600_000  # 26 tables x 600k rows x dim 16: 998 MB of rows, as in issue #16
SECONDS = 6
CORES_ESTIMATE = 32

NOTES = """Memory: the DLRM-like model with 26 tables x 600k rows x 16 (998 MB of rows), sum of
Pss over every process of the server (leader, zygote and workers; shared pages count once in
the sum), 3 s after ready. Throughput: the demo model, EAS protobuf over HTTP, wrk -t1 -c16
on the same 2 cores (wrk takes part of them), 6 s per run after a 2 s warmup; server CPU per
request = user+system CPU of every process of the tree over the requests wrk completed.
The 32-core estimate: Processor.process on 1 and 2 threads in one process gives the share
of a request that holds the GIL (f = 2/speedup - 1); one process then tops out at
1/(f x CPU per request) requests/s whatever its cores, N workers at N times one worker's
rate until the cores run out (N = cores)."""


def _start(config: Path, workers: int) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    process = serve_process(config, port, None, "--workers", str(workers))
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        wait_ready(f"{url}/v2/health/ready", process, timeout=300)
    except RuntimeError:
        process.kill()
        raise
    return process, url, time.monotonic() - started


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(60)


def _memory(root: Path) -> list[Row]:
    model = build_dlrm(root / "dlrm", total_rows=TABLE_ROWS)
    table_bytes = sum(v.nbytes for v in model.values)
    config = root / "dlrm.json"
    config.write_text(json.dumps(model.config(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)))
    pss = {}
    for workers in (1, 2, 3):
        process, _, _ = _start(config, workers)
        time.sleep(3)
        pss[workers] = tree_memory(process.pid)["Pss"]
        _stop(process)
    extra = (pss[2] - pss[1]) / table_bytes
    per_worker = pss[3] - pss[2]
    return [
        Row(f"2 workers vs 1 process: extra Pss / table bytes ({table_bytes / 2**20:,.0f} MiB of rows)",
            f"+{(pss[2] - pss[1]) / 2**20:,.0f} MiB (2 workers: {pss[2] / 2**20:,.0f} MiB)",
            f"1 process {pss[1] / 2**20:,.0f} MiB", extra, "<= 0.15", extra <= 0.15),
        Row("each further worker: Pss added (3 workers - 2 workers) / table bytes",
            f"+{per_worker / 2**20:,.0f} MiB", f"{table_bytes / 2**20:,.0f} MiB of rows", per_worker / table_bytes),
    ]


def _gil_share(processor: Processor, body: bytes) -> tuple[float, float]:
    """(share of a request holding the GIL, in-process CPU us per request) from 1 vs 2 threads."""
    def rate(threads: int) -> float:
        count = [0] * threads
        stop = threading.Event()

        def loop(i: int) -> None:
            while not stop.is_set():
                processor.process(body)
                count[i] += 1

        pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        time.sleep(3)
        stop.set()
        for t in pool:
            t.join()
        return sum(count) / 3

    one, two = rate(1), rate(2)
    speedup = two / one
    started = time.process_time()
    for _ in range(2000):
        processor.process(body)
    return min(1.0, max(0.0, 2 / speedup - 1)), (time.process_time() - started) / 2000 * 1e6


def _throughput(root: Path) -> list[Row]:
    demo = write_demo(root / "demo")
    rows = []
    for batch in (1, 64):
        body = encode_request(demo.sample_inputs(batch, np.random.default_rng(batch)))
        script = post_script(root, body, f"b{batch}")
        measured = {}
        for workers in (1, 2):
            process, url, _ = _start(demo.config_path, workers)
            target = f"{url}/api/predict/default"
            wrk(target, script, threads=1, connections=16, seconds=2)
            before = tree_cpu_seconds(process.pid)
            result = wrk(target, script, threads=1, connections=16, seconds=SECONDS)
            cpu_us = (tree_cpu_seconds(process.pid) - before) / result["requests"] * 1e6
            measured[workers] = (result["requests"] / result["seconds"], cpu_us, result["p99_ms"])
            _stop(process)
        (one, cpu1, p99_1), (two, cpu2, p99_2) = measured[1], measured[2]
        goal = ">= 1.5" if batch == 1 else ""
        rows.append(Row(
            f"EAS HTTP batch {batch}, wrk -c16: 2 workers / 1 process, requests/s "
            f"(server CPU/request {cpu2:.0f} vs {cpu1:.0f} us; p99 {p99_2:.1f} vs {p99_1:.1f} ms)",
            f"{two:,.0f} req/s", f"{one:,.0f} req/s", two / one, goal, (two / one >= 1.5) if goal else None))
        if batch == 1:
            processor = Processor(json.loads(demo.config_path.read_text()))
            share, inproc_us = _gil_share(processor, body)
            processor.close()
            one_process = 1e6 / (share * cpu1) if share else float("inf")
            workers_rate = CORES_ESTIMATE * 1e6 / cpu1
            rows.append(Row(
                f"paper estimate, {CORES_ESTIMATE} cores, batch 1: {CORES_ESTIMATE} workers / 1 process "
                f"(GIL-held share {share:.0%} of {inproc_us:.0f} us in-process; server {cpu1:.0f} us/request)",
                f"{workers_rate:,.0f} req/s", f"{one_process:,.0f} req/s", workers_rate / one_process))
    return rows


def run() -> list[Row]:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: make bench installs it (apt-get install wrk)")
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-workers-"))
    try:
        return _throughput(root) + _memory(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
