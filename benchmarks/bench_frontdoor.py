"""`recserve serve` under wrk (a load generator that is not the bottleneck): the server's own
CPU per answered EAS request against in-process `Processor.process` on the same bytes, and
overload: batch-256 requests from 64 vs 512 connections (issues "lean server" and "front
doors under abuse")."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.load_tools import (
    free_port,
    post_script,
    request_cpu_seconds,
    serve_process,
    tree_cpu_seconds,
    wait_ready,
    wrk,
)
from benchmarks.report import Row
from recserve import Processor
from recserve.export.demo import write_demo
from recserve.perf.client_pool import ClientPool
from recserve.perf.results import summarize
from recserve.wire.codec import encode_request

NOTES = """Demo model (`recserve demo`), one server process on loopback, wrk -t1 -c16 (CPU rows) or
-t2 (overload rows) with a Lua script posting one fixed PredictRequest to
`/api/predict/default`. Server CPU per request = the server process's user+system CPU
(/proc/<pid>/stat, every thread) over the requests wrk completed, 5 s per run after a 2 s
warmup; in-process = `Processor.process` CPU (time.process_time) per call on the same bytes in
the benchmark's process; the server's CPU is split with its recserve_request_cpu_seconds_total
into the requests' handlers (lease to answer) and the HTTP front end (everything else:
reading, parsing, admission, metrics, writing; a bare uvicorn app answering fixed bytes
spent 46 us per request here in 2026-11). Overload: wrk's own p50/p99 over every answer (fast 503s included),
answered-200 requests/s, 503s/s and client timeouts (wrk --timeout 5s); 8 s per run, 64 and
512 connections alternated twice, the better of each kept. wrk from Debian's package
(`make bench` installs it). gRPC overload: the same request to EAS `Predict` from `recserve
perf`'s client (2 processes, one HTTP/2 connection per call in flight, the next call as soon
as one ends, a refusal included; 5 s deadline), 64 and 512 calls in flight alternated twice;
p99 over every answer, refusals (RESOURCE_EXHAUSTED) with their own p99. The clients share
the machine's cores with the server, and wrk retries a refused request at once: at 512
connections the client's CPU for ~2,000 refusals/s comes out of the same 2 cores (the server
got 0.73 of a core at 512 connections against 0.82 at 64 in the run below). HTTP refusals at
the headers (issue 25), measured against the code before them, servers side by side and
alternated, load average ~10 (shared machine): 200s/s at 512 connections 1,679-1,798 vs
1,207-1,360, p99 259-315 vs 515-615 ms (p99 at 512 / at 64: 2.4-2.9 vs 4.0-4.7).

Why the p99 goal and the 200s goal pull against each other here: wrk keeps every connection's
request out and sends the next the moment an answer (a 503 too) arrives, so by Little's law
the mean latency at 512 connections is 512 / (answers per second), whatever the server
does, unless it answers many more requests per second than it can serve, i.e. refuses them
fast. A p99 at 512 of 3x the 64-connection one (~50 ms) needs ~10,000 answers/s where ~5,500
can be served: ~5,000 refusals/s, each costing the server ~22 us and wrk about as much on
the same 2 cores, which comes out of the served requests. The max_queue_ms 30 rows measure
it: a shorter wait refuses more and lowers p99 less than it lowers the served rate. Served
requests wait in the kernel's socket buffers and on the event loop's pass over the ready
connections (a batch-256 prediction runs inline, ~0.15 ms, and one pass over 512 ready
connections takes about the p50 at 512), where admission sees them only once read."""

CPU_SECONDS, OVERLOAD_SECONDS = 5, 8
GRPC_PREDICT = "/tensorflow.eas.PredictionService/Predict"


def run() -> list[Row]:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: make bench installs it (apt-get install wrk)")
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-frontdoor-"))
    demo = write_demo(root / "demo")
    http_port, grpc_port = free_port(), free_port()
    server = serve_process(demo.config_path, http_port, grpc_port)
    base = f"http://127.0.0.1:{http_port}"
    url = f"{base}/api/predict/default"
    rows: list[Row] = []
    try:
        wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", server, what="recserve serve")
        processor = Processor(json.loads(demo.config_path.read_text()))
        for batch, goal in ((1, 0.75), (64, 0.85)):
            body = encode_request(demo.sample_inputs(batch, np.random.default_rng(batch)))
            script = post_script(root, body, f"b{batch}")
            wrk(url, script, threads=1, connections=16, seconds=2)
            before, handled = tree_cpu_seconds(server.pid), request_cpu_seconds(base)
            result = wrk(url, script, threads=1, connections=16, seconds=CPU_SECONDS)
            server_us = (tree_cpu_seconds(server.pid) - before) / result["requests"] * 1e6
            handler_us = (request_cpu_seconds(base) - handled) / result["requests"] * 1e6
            started = time.process_time()
            for _ in range(2000):
                processor.process(body)
            inproc_us = (time.process_time() - started) / 2000 * 1e6
            ratio = inproc_us / server_us
            rows.append(Row(
                f"EAS HTTP batch {batch}, wrk -c16: in-process CPU / server CPU per request "
                f"({result['requests'] / CPU_SECONDS:,.0f} req/s, p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms; "
                f"of the server's CPU, {handler_us:.0f} us in the request's handler, {server_us - handler_us:.0f} us "
                "in the HTTP front end)",
                f"server {server_us:.0f} us", f"Processor.process {inproc_us:.0f} us", ratio, f">= {goal}", ratio >= goal))
        processor.close()
        body = encode_request(demo.sample_inputs(256, np.random.default_rng(256)))
        script = post_script(root, body, "b256")
        rows += _overload_rows(url, script, "")
        rows += _grpc_overload(f"127.0.0.1:{grpc_port}", body)
        rows += _shorter_wait_rows(root, demo.config_path, script)
        return rows
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _overload_rows(url: str, script: Path, setting: str) -> list[Row]:
    """p99 and answered requests/s at 512 connections against 64 (batch 256, wrk -t2)."""
    wrk(url, script, threads=2, connections=64, seconds=2)
    best: dict[int, dict[str, float]] = {}
    for connections in (64, 512, 64, 512):
        r = wrk(url, script, threads=2, connections=connections, seconds=OVERLOAD_SECONDS)
        if connections not in best or r["p99_ms"] < best[connections]["p99_ms"]:
            best[connections] = r
    low, high = best[64], best[512]
    ok_low = (low["requests"] - low["non2xx"]) / OVERLOAD_SECONDS
    ok_high = (high["requests"] - high["non2xx"]) / OVERLOAD_SECONDS
    p99_ratio = high["p99_ms"] / low["p99_ms"]
    answers = high["requests"] / OVERLOAD_SECONDS
    goals = not setting  # the goals are the default settings'; another setting's rows inform
    return [
        Row(f"overload{setting}, batch 256: p99 at 512 connections / at 64 (p50 {high['p50_ms']:.0f} vs "
            f"{low['p50_ms']:.0f} ms; 503s {high['non2xx'] / OVERLOAD_SECONDS:,.0f}/s; client timeouts "
            f"{high['timeouts']:.0f}; 512 / all answers per second = {512 / answers * 1e3:.0f} ms, the mean "
            "latency of a client that always has 512 requests out)",
            f"{high['p99_ms']:.0f} ms", f"{low['p99_ms']:.0f} ms", p99_ratio, "<= 3, no timeouts" if goals else "",
            p99_ratio <= 3 and high["timeouts"] == 0 if goals else None),
        Row(f"overload{setting}, batch 256: answered (200) requests/s at 512 connections / at 64",
            f"{ok_high:,.0f} req/s", f"{ok_low:,.0f} req/s", ok_high / ok_low, ">= 0.9" if goals else "",
            ok_high / ok_low >= 0.9 if goals else None),
    ]


def _shorter_wait_rows(root: Path, config_path: Path, script: Path) -> list[Row]:
    """The overload rows again with max_queue_ms 30 (default 100): what a shorter wait buys
    and costs against a client that retries every refusal at once."""
    config = root / "wait30.json"
    config.write_text(json.dumps(json.loads(config_path.read_text()) | {"max_queue_ms": 30}))
    http_port = free_port()
    server = serve_process(config, http_port)
    try:
        wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", server, what="recserve serve")
        return _overload_rows(f"http://127.0.0.1:{http_port}/api/predict/default", script, " (max_queue_ms 30)")
    finally:
        server.terminate()
        server.wait(timeout=30)


def _grpc_overload(target: str, body: bytes) -> list[Row]:
    """Batch-256 Predict calls, 64 vs 512 in flight: the same shape as wrk's rows."""
    payload = [(body, GRPC_PREDICT)]
    best: dict[int, dict[str, float]] = {}
    with ClientPool(2) as pool:
        pool.run(target, True, payload, 64, 2.0, 0.5, 5.0)
        for calls in (64, 512, 64, 512):
            samples = pool.run(target, True, payload, calls, OVERLOAD_SECONDS, 1.0, 5.0)
            point = summarize(samples, 256, calls, OVERLOAD_SECONDS)
            refused_latency = np.concatenate([s.latency[~s.ok] for s in samples])
            failed = sum(point.errors.values())
            refused, timeouts = point.errors.get("RESOURCE_EXHAUSTED", 0), point.errors.get("timeout", 0)
            result = {
                "p50_ms": point.latency_ms["p50"], "p99_ms": point.latency_ms["p99"],
                "ok_per_s": (point.requests - failed) / OVERLOAD_SECONDS,
                "refused_per_s": refused / OVERLOAD_SECONDS,
                "refused_p99_ms": float(np.percentile(refused_latency, 99) * 1e3) if refused_latency.size else 0.0,
                "timeouts": timeouts, "other": failed - refused - timeouts, "client_cpu": point.client_cpu,
            }
            if calls not in best or result["p99_ms"] < best[calls]["p99_ms"]:
                best[calls] = result
    low, high = best[64], best[512]
    p99_ratio, ok_ratio = high["p99_ms"] / low["p99_ms"], high["ok_per_s"] / low["ok_per_s"]
    return [
        Row(f"gRPC overload, batch 256: p99 at 512 calls in flight / at 64 (p50 {high['p50_ms']:.0f} vs "
            f"{low['p50_ms']:.0f} ms; RESOURCE_EXHAUSTED {high['refused_per_s']:,.0f}/s, their p99 "
            f"{high['refused_p99_ms']:.1f} ms; deadlines missed {high['timeouts']:.0f}, other errors "
            f"{high['other']:.0f}; busiest client process {high['client_cpu']:.0%} of a core)",
            f"{high['p99_ms']:.0f} ms", f"{low['p99_ms']:.0f} ms", p99_ratio, "<= 3, no timeouts",
            p99_ratio <= 3 and high["timeouts"] == 0),
        Row("gRPC overload, batch 256: answered (OK) calls/s at 512 calls in flight / at 64",
            f"{high['ok_per_s']:,.0f} calls/s", f"{low['ok_per_s']:,.0f} calls/s", ok_ratio, ">= 0.9", ok_ratio >= 0.9),
    ]
