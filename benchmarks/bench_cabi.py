"""Requests/s through libserving_processor.so from C threads (tests/cabi/cabi_client.c, a
non-Python host) vs `Processor.process` from Python threads: same demo model, same
requests, same thread count, one run."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.report import Row
from recserve import Processor
from recserve.export.demo import write_demo
from recserve.processor.cabi import include_dir, library_path
from recserve.wire.codec import encode_request

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "tests" / "cabi" / "cabi_client.c"
THREADS = 4
ROUNDS = 1000  # per thread
REPEATS = 5
BATCH = 1  # one user, one item: the typical per-RPC request

NOTES = f"""\
{THREADS} threads x {ROUNDS} requests each (batch {BATCH}, 16 distinct requests), demo model,
session_num 1, the two measured alternately {REPEATS} times, best of each. C: `cabi_client serve` dlopens the library (RTLD_LOCAL) in a process without
Python; the embedded interpreter is entered per call. Python: threads call
`Processor.process` directly. Both exclude start-up.
"""


def _requests(demo_inputs, count: int) -> list[bytes]:
    rng = np.random.default_rng(11)
    return [encode_request(demo_inputs(BATCH, rng)) for _ in range(count)]


def _compile_client(work: Path) -> Path:
    binary = work / "cabi_client"
    cc = shutil.which("cc") or "cc"
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-O2",
            "-pthread",
            f"-I{include_dir()}",  # the header recserve ships
            str(CLIENT),
            "-o",
            str(binary),
            "-ldl",
        ],
        check=True,
    )
    return binary


def _c_requests_per_s(
    binary: Path, work: Path, config: Path, requests: list[bytes], replies: list[tuple[int, bytes]]
) -> float:
    (work / "req").write_bytes(b"".join(struct.pack("<I", len(r)) + r for r in requests))
    (work / "exp").write_bytes(b"".join(struct.pack("<iI", s, len(b)) + b for s, b in replies))
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    args = [library_path(), "serve", config, work / "req", work / "exp", THREADS, ROUNDS]
    out = subprocess.run(
        [str(binary), *map(str, args)], env=env, capture_output=True, text=True, check=True
    ).stdout
    match = re.match(r"sent (\d+) mismatched 0 seconds ([\d.]+)", out)
    if not match:
        raise RuntimeError(f"cabi_client failed: {out}")
    return int(match[1]) / float(match[2])


def _python_requests_per_s(processor: Processor, requests: list[bytes]) -> float:
    def worker(first: int) -> None:
        for i in range(ROUNDS):
            processor.process(requests[(first + i) % len(requests)])

    threads = [threading.Thread(target=worker, args=(t * 7,)) for t in range(THREADS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return THREADS * ROUNDS / (time.perf_counter() - started)


def run() -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        demo = write_demo(work / "demo")
        processor = Processor(demo.config_path.read_text())
        try:
            requests = _requests(demo.sample_inputs, 16)
            replies = [processor.process(r) for r in requests]
            for r in requests * 20:  # warm up the Python side as the C side warms its own
                processor.process(r)
            binary = _compile_client(work)
            c_rates, python_rates = [], []
            for _ in range(REPEATS):  # alternate, so load from elsewhere hits both alike
                c_rates.append(_c_requests_per_s(binary, work, demo.config_path, requests, replies))
                python_rates.append(_python_requests_per_s(processor, requests))
        finally:
            processor.close()
    c_rate, python_rate = max(c_rates), max(python_rates)
    ratio = c_rate / python_rate
    return [
        Row(
            name=f"C ABI process() from {THREADS} C threads, batch {BATCH} (best of {REPEATS})",
            value=f"{c_rate:,.0f} req/s",
            baseline=f"Processor.process from {THREADS} Python threads {python_rate:,.0f} req/s",
            ratio=ratio,
            goal=">= 0.9",
            met=ratio >= 0.9,
        )
    ]
