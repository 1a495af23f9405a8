"""The server over loopback vs in-process `Processor.process`, same run, same requests:
requests/s and p50/p99 latency at batch 1 and batch 64 over HTTP-protobuf (EAS route),
KServe v2 binary (HTTP) and gRPC (tensorflow.eas Predict), 16 concurrent clients."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np

from benchmarks.load_tools import free_port, serve_process
from benchmarks.report import Row
from recserve import Processor
from recserve.export.demo import write_demo
from recserve.proto import eas_service_pb2_grpc, predict_pb2
from recserve.wire.codec import encode_request

CLIENTS = 16
PROCESSES = 4  # client processes (CLIENTS / PROCESSES threads each): one Python process is GIL-bound
SECONDS = 3.0
BATCHES = (1, 64)
NOTES = f"""Demo model (`recserve demo`: 6 embedding bindings, 3 dense features, MLP 51-32-16-1),
one ORT session with 1 intra-op thread, as its config.json says. {CLIENTS} clients in {PROCESSES}
processes (httpx with one keep-alive TCP_NODELAY connection per client; one gRPC channel
per process; KServe v2 binary bodies built once, as tritonclient.http sends them) against
`recserve serve` in a subprocess on loopback; the baseline is `Processor.process` called by
{CLIENTS} threads in one process on the same request bytes. {SECONDS:.0f} s per measurement
after a warmup. Clients and server share the machine's cores, so on small machines the
ratios are bounded by the Python clients as much as by the server.

The CPU rows take the clients out: one client sends 3,000 requests one at a time and the
server's CPU time (all threads, /proc/<pid>/stat) is divided by the count, against the CPU
of Processor.process in this process. Before the EAS route left FastAPI and the server
moved to uvloop (2026-11), the HTTP figure was ~820-1,040 us on this machine (same
method, measured by hand over five alternating runs; ~580-670 us after)."""


def _percentiles(latencies: list[float], count: int, elapsed: float) -> tuple[float, float, float]:
    flat = sorted(latencies)
    p99 = flat[min(len(flat) - 1, int(len(flat) * 0.99))]
    return count / elapsed, statistics.median(flat) * 1e3, p99 * 1e3


def _run_threads(call: Callable[[], object], threads: int) -> tuple[list[float], float]:
    """`threads` threads calling `call` for SECONDS: (latencies, elapsed seconds)."""
    for _ in range(20):
        call()
    latencies: list[list[float]] = [[] for _ in range(threads)]
    deadline = time.perf_counter() + SECONDS
    started = time.perf_counter()

    def client(i: int) -> None:
        own = latencies[i]
        while (t0 := time.perf_counter()) < deadline:
            call()
            own.append(time.perf_counter() - t0)

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return [x for own in latencies for x in own], time.perf_counter() - started


def _in_process(call: Callable[[], object]) -> tuple[float, float, float]:
    latencies, elapsed = _run_threads(call, CLIENTS)
    return _percentiles(latencies, len(latencies), elapsed)


def _client_process(kind: str, target: str, payload: bytes, header: int, threads: int) -> tuple[list[float], float]:
    """One load-generating process (spawned): `threads` clients of one transport."""
    local = threading.local()
    if kind == "grpc":
        channel = grpc.insecure_channel(target)
        predict = channel.unary_unary("/tensorflow.eas.PredictionService/Predict")  # raw bytes both ways

        def call() -> object:
            return predict(payload, timeout=30)
    else:
        path, headers = ("/api/predict/bench", {}) if kind == "eas" else (
            "/v2/models/default/infer", {"Inference-Header-Content-Length": str(header)})

        def call() -> object:
            if not hasattr(local, "client"):
                # TCP_NODELAY: httpx writes headers and body separately; with Nagle the
                # body waits for the server's delayed ACK (~40 ms).
                transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
                local.client = httpx.Client(base_url=target, timeout=30, transport=transport)
            _check(local.client.post(path, content=payload, headers=headers).status_code)
            return None
    return _run_threads(call, threads)


def _over_loopback(pool: Any, kind: str, target: str, payload: bytes, header: int = 0) -> tuple[float, float, float]:
    per_process = CLIENTS // PROCESSES
    results = pool.starmap(_client_process, [(kind, target, payload, header, per_process)] * PROCESSES)
    latencies = [x for own, _ in results for x in own]
    rate = sum(len(own) / elapsed for own, elapsed in results)
    p50, p99 = _percentiles(latencies, 1, 1.0)[1:]
    return rate, p50, p99


def _check(status: int) -> None:
    if status != 200:
        raise RuntimeError(f"request failed with status {status}")


def _kserve_body(inputs: dict[str, np.ndarray]) -> tuple[bytes, int]:
    specs, raw = [], []
    types = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}
    for name, value in inputs.items():
        if value.dtype == object:
            data = b"".join(len(v).to_bytes(4, "little") + v for v in value.ravel())
            datatype = "BYTES"
        else:
            data, datatype = value.tobytes(), types[value.dtype]
        specs.append({"name": name, "shape": list(value.shape), "datatype": datatype,
                      "parameters": {"binary_data_size": len(data)}})
        raw.append(data)
    head = json.dumps({"inputs": specs, "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(raw), len(head)


def _start_server(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    http_port, grpc_port = free_port(), free_port()
    with open(log, "wb") as out:
        proc = serve_process(config, http_port, grpc_port, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1).status_code == 200:
                return proc, http_port, grpc_port
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not become ready:\n{log.read_text()}")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime, all threads


def _cpu_row(name: str, proc: subprocess.Popen[bytes], call: Callable[[], object], processor: Processor,
             body: bytes, count: int = 3000) -> Row:
    """CPU the server spends per request (all its threads) against Processor.process's
    in this process, one request at a time: what each costs, whatever the clients cost."""
    for _ in range(200):
        call()
        processor.process(body)
    start = _cpu_seconds(proc.pid)
    for _ in range(count):
        call()
    server = (_cpu_seconds(proc.pid) - start) / count
    usage = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(count):
        _check(processor.process(body)[0])
    after = resource.getrusage(resource.RUSAGE_SELF)
    inside = (after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime) / count
    return Row(f"{name}, batch 1: server CPU per request (ratio = in-process / server)",
               f"{server * 1e6:.0f} us", f"Processor.process {inside * 1e6:.0f} us", inside / server)


def _row(name: str, batch: int, ours: tuple[float, float, float], base: tuple[float, float, float]) -> Row:
    return Row(
        f"{name}, batch {batch}: requests/s (ratio to in-process Processor.process)",
        f"{ours[0]:,.0f} req/s, p50 {ours[1]:.2f} ms, p99 {ours[2]:.2f} ms",
        f"in-process {base[0]:,.0f} req/s, p50 {base[1]:.2f} ms, p99 {base[2]:.2f} ms",
        ours[0] / base[0],
    )


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-server-"))
    proc = None
    try:
        demo = write_demo(root / "demo")
        proc, http_port, grpc_port = _start_server(demo.config_path, root / "server.log")
        processor = Processor(json.loads(demo.config_path.read_text()))
        http, grpc_target = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
        rows = []
        with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
            for batch in BATCHES:
                inputs = demo.sample_inputs(batch, np.random.default_rng(batch))
                body = encode_request(inputs)
                kserve, header = _kserve_body(inputs)
                base = _in_process(lambda body=body: _check(processor.process(body)[0]))
                rows.append(_row("HTTP-protobuf (EAS route)", batch, _over_loopback(pool, "eas", http, body), base))
                rows.append(_row("KServe v2 binary (HTTP)", batch,
                                 _over_loopback(pool, "kserve", http, kserve, header), base))
                rows.append(_row("gRPC (tensorflow.eas Predict)", batch,
                                 _over_loopback(pool, "grpc", grpc_target, body), base))
        body = encode_request(demo.sample_inputs(1, np.random.default_rng(1)))
        with httpx.Client() as client:
            def eas() -> None:
                _check(client.post(f"{http}/api/predict/default", content=body).status_code)
            rows.append(_cpu_row("HTTP-protobuf (EAS route)", proc, eas, processor, body))
        with grpc.insecure_channel(grpc_target) as channel:
            stub = eas_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest.FromString(body)
            rows.append(_cpu_row("gRPC (tensorflow.eas Predict)", proc, lambda: stub.Predict(request), processor, body))
        processor.close()
        return rows
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        shutil.rmtree(root, ignore_errors=True)
